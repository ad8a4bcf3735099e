"""`TorchMesh[T]`: an `ActorMesh[T]` whose actors form one `torch.distributed` world.

The driver checks the arguments, starts the world's `Rendezvous` (0 CPUs, on the driver's node)
and the actors, whose class is a subclass of the user's: its `__init__` joins the world (see
`_world`) before the user's `__init__` runs. When an actor restarts, its own join starts the next
epoch of the world and the survivors are invited to it; once the core reports the actor back,
the mesh waits for the world to settle, re-forms the links that include the actor, and calls the
user's `on_restart`.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from typing_extensions import Unpack

import actormesh as am
from actormesh._actor import with_setup
from actormesh._shape import ShapeLike

from .._options import MeshOptions, user_args
from . import _checks, _link
from ._rendezvous import Rendezvous
from ._world import WorldSetup, invite, join

T = TypeVar("T")

log = logging.getLogger("actormesh.torch")


class TorchMesh(am.ActorMesh[T]):
    """A mesh whose actors form one `torch.distributed` world before their `__init__` runs.

    In every actor, `MASTER_ADDR` (rank 0's node), `MASTER_PORT` (rank 0's `TCPStore`, bound on a
    port the kernel picked before anyone learnt it), `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and
    `LOCAL_WORLD_SIZE` (by node), `GROUP_RANK` and `GROUP_WORLD_SIZE` (the node) are set as
    torchrun sets them, `init_process_group` has returned, and `process_group(dim)` gives the
    group of each dim.

    - `backend`: `"gloo"` or `"nccl"`; None picks nccl when the actors ask for GPUs
      (`num_gpus`, or GPU bundles in `placement`), else gloo. An nccl world, its dim groups and
      its links take CPU tensors too, through gloo (`"cpu:gloo,cuda:nccl"`).
    - `timeout_s`: collectives (and forming the groups) fail after this long; gloo's own default
      is 30 minutes.
    - `join_timeout_s`: how long an actor waits for the others to arrive (start-up, restarts).
    - `max_restarts`, `on_restart`: a restarted actor rejoins; the world forms again (a new
      epoch: new port, torchrun variables set again, every group of the world made anew, the
      links that include the actor too), then `on_restart(view)` runs on the driver.
    """

    def __init__(
        self,
        actor_cls: type[T],
        shape: ShapeLike = 1,
        *,
        backend: str | None = None,
        timeout_s: float = 60,
        join_timeout_s: float = 300,
        max_restarts: int = 0,
        on_restart: Callable[[am.ActorMesh[T]], object] | None = None,
        **mesh_options: Unpack[MeshOptions],
    ) -> None:
        if not isinstance(actor_cls, type):
            raise TypeError(f"TorchMesh needs a class, got {actor_cls!r}")
        full = am.Shape.of(shape)
        timeout_s = _checks.seconds("timeout_s", timeout_s)
        join_timeout_s = _checks.seconds("join_timeout_s", join_timeout_s)
        gpus = bool(mesh_options.get("num_gpus")) or _checks.placement_has_gpus(
            mesh_options.get("placement"))
        chosen = _checks.backend(backend, gpus)
        args, options = user_args(actor_cls, mesh_options)
        if not ray.is_initialized():
            ray.init()  # as ActorMesh does on a first call, honouring RAY_ADDRESS
        context = ray.get_runtime_context()
        setup = WorldSetup(f"actormesh.torch.{uuid.uuid4().hex}", context.namespace, chosen,
                           timeout_s, join_timeout_s, restartable=max_restarts != 0)
        rendezvous: Any = ray.remote(Rendezvous).options(
            name=setup.world_id, num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(context.get_node_id(), soft=True),
        ).remote(full.size, join_timeout_s)
        hook = _restart_hook(setup, rendezvous, on_restart) if max_restarts != 0 else on_restart
        try:
            super().__init__(with_setup(actor_cls, join), full, args=(setup, *args),
                             max_restarts=max_restarts, on_restart=hook, **options)
        except BaseException:
            _kill(rendezvous)
            raise
        self._torch_setup = setup
        self._torch_rendezvous = rendezvous
        # The rendezvous lives as long as the actors do: views keep them after this object.
        self._torch_release = weakref.finalize(self._root, _kill, rendezvous)
        rendezvous.attach.remote(self.actors, invite)

    @property
    def backend(self) -> str:
        return self._torch_setup.backend

    @property
    def epoch(self) -> int:
        """The world's current epoch: 0 at start-up, one more each time it formed again."""
        epoch: int = ray.get(self._torch_rendezvous.epoch.remote(), timeout=60)
        return epoch

    def shutdown(self) -> None:
        """Kill the actors and the world's rendezvous; links over these actors are forgotten."""
        if self._torch_release.alive:
            _link.forget_actors([_link.actor_id(h) for h in self.actors])
        super().shutdown()
        self._torch_release()

    def __repr__(self) -> str:
        return f"TorchMesh({self._root.label}, {self.shape}, backend={self.backend!r})"


def _restart_hook(setup: WorldSetup, rendezvous: Any,
                  on_restart: Callable[[am.ActorMesh[T]], object] | None
                  ) -> Callable[[am.ActorMesh[T]], None]:
    """The core's restart hook: wait for the world to form again, re-form the links that
    include the actor, then run the user's `on_restart`. The core runs it on a thread of its
    own, where it may wait. It holds no mesh, so a dropped mesh is still collected."""

    def hook(view: am.ActorMesh[T]) -> None:
        epoch = ray.get(rendezvous.settled.remote(), timeout=setup.join_timeout_s + 30)
        log.info("torch world: rank %d is back; the world formed again (epoch %d)",
                 view.points[0].rank, epoch)
        for lk in _link.links_of(_link.actor_id(view.actors[0])):
            lk.reform()
        if on_restart is not None:
            on_restart(view)

    return hook


def _kill(rendezvous: Any) -> None:
    if not ray.is_initialized():  # it went with the cluster; ray.kill would start a new one
        return
    try:
        ray.kill(rendezvous, no_restart=True)
    except Exception as err:  # already gone, or Ray is shutting down
        log.debug("torch world: killing the rendezvous failed: %s", err)
