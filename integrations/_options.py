"""The `ActorMesh` options the integrations pass through to the mesh they start, typed once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import actormesh as am
from actormesh._actor import check_init_args
from actormesh._balancer import BalancerSpec


class ActorOptions(TypedDict, total=False):
    """Where and how the actors run: the `ActorMesh` options every integration passes through."""

    num_cpus: float | None
    num_gpus: float | None
    resources: Mapping[str, float] | None
    memory: int | None
    runtime_env: Mapping[str, Any] | None
    placement: am.Placement | None
    max_in_flight: int | None
    coalesce: int
    name: str | None
    restart_timeout_s: float
    on_restart_timeout_s: float


class MeshOptions(ActorOptions, total=False):
    """`ActorOptions` and the constructor's arguments and the balancer, as `ActorMesh` takes them."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    balancer: BalancerSpec


def user_args(actor_cls: type, mesh_options: MeshOptions) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The user's constructor arguments (checked against `actor_cls`, before anything starts) and
    the other options: a mesh that puts its own arguments ahead of the user's passes these on."""
    options: dict[str, Any] = dict(mesh_options)
    args = tuple(options.pop("args", ()))
    check_init_args(actor_cls, args, dict(options.get("kwargs") or {}))
    return args, options
