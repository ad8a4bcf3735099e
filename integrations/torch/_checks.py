"""Checks of the driver's arguments, made before any actor starts or is called."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import ray

import actormesh as am

from .._checks import seconds as seconds  # the mesh and link check their timeouts here

BACKENDS = ("gloo", "nccl")

_cluster_resources: Callable[[], Mapping[str, float]] = ray.cluster_resources


def backend(value: str | None, actors_have_gpus: bool) -> str:
    """A world's backend: `value`, or nccl/gloo by `actors_have_gpus` when None. nccl is refused
    unless the actors ask for GPUs and the cluster has some."""
    if value is None:
        value = "nccl" if actors_have_gpus else "gloo"
    if value == "nccl" and not actors_have_gpus:
        raise ValueError("backend='nccl' needs GPUs, and the actors ask for none (num_gpus=)")
    return link_backend(value)


def link_backend(value: str) -> str:
    """A link's backend: a known one, and nccl only on a cluster with GPUs."""
    if value not in BACKENDS:
        raise ValueError(f"backend={value!r}: unknown; use one of {list(BACKENDS)}")
    if value == "nccl":
        if not ray.is_initialized():
            ray.init()  # as ActorMesh would, to see the cluster
        if not _cluster_resources().get("GPU", 0):
            raise ValueError("backend='nccl' needs GPUs, and this Ray cluster has none")
    return value


def placement_has_gpus(placement: am.Placement | None) -> bool:
    """Whether every bundle of `placement` holds a GPU (so every actor placed in it gets one)."""
    if placement is None:
        return False
    bundles = placement.bundle_specs
    return bool(bundles) and all(b.get("GPU", 0) > 0 for b in bundles)
