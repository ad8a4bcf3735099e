"""Inside an actor: joining the torch world of its `TorchMesh`, at start-up and after a restart.

`join` runs before the user's `__init__` (the mesh's actor class calls it first); `rejoin` runs
in a surviving actor when the `Rendezvous` invites it to a new epoch. Both go through `_form`:
leave the current world, (rank 0) bind a new `TCPStore` on port 0, arrive at the rendezvous with
its port, set the torchrun variables from the assignment, `init_process_group`, then create the
group of every dim, every rank in the same order. A formation cut by another restart moves on to
the newer epoch; everything else fails with the rank, the epoch and the store's address.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

import actormesh as am
from actormesh._actor import RUN

from . import _c10d, _groups
from ._rendezvous import Arrival, Assignment, Superseded

if TYPE_CHECKING:
    from torch._C._distributed_c10d import ProcessGroup, Store

log = logging.getLogger("actormesh.torch")

node_ip_address: Callable[[], str] = ray.util.get_node_ip_address


@dataclasses.dataclass(frozen=True)
class WorldSetup:
    """What an actor needs to join its world, passed ahead of the user's arguments."""

    world_id: str  # also the rendezvous actor's name, in `namespace`
    namespace: str
    backend: str
    timeout_s: float
    join_timeout_s: float
    restartable: bool  # whether a failed formation may wait for a newer epoch

    @property
    def rendezvous(self) -> Any:
        """The world's rendezvous actor, found by name: a handle among an actor's constructor
        arguments would be kept in the object store, and a restart fails if it is lost."""
        return ray.get_actor(self.world_id, namespace=self.namespace)


_setup: WorldSetup | None = None  # this process's world, kept for rejoining


def join(setup: WorldSetup) -> None:
    """Join the world as a new process (before `__init__`, at start-up or after a restart)."""
    global _setup
    _setup = setup
    _form(setup, None)


def rejoin(_instance: object, epoch: int) -> int | None:
    """Run in a surviving actor (through `invite`): leave the world and join epoch `epoch`'s.

    Returns the epoch joined, or None when this actor is already in that world or a newer one.
    """
    with _groups.lock:
        current = _groups.world
    if _setup is None or (current is not None and current.info.epoch >= epoch):
        return None
    return _form(_setup, epoch)


def invite(handle: Any, epoch: int) -> Any:
    """The call that makes the actor behind `handle` rejoin `epoch` (sent by the rendezvous)."""
    return getattr(handle, RUN).remote(rejoin, epoch)


def _form(setup: WorldSetup, epoch: int | None) -> int:
    """Leave the current world and join the one of `epoch` (None: the current one, as a new
    process), following newer epochs that cut it; returns the epoch joined."""
    rank = am.current_rank().rank
    rendezvous = setup.rendezvous
    deadline = time.monotonic() + setup.join_timeout_s
    context = ray.get_runtime_context()
    node_id, host = context.get_node_id(), node_ip_address()
    target = epoch
    while True:
        _leave()
        store = _c10d.master_store(host, setup.timeout_s) if rank == 0 else None
        arrival = Arrival(rank, target, node_id, host, None if store is None else store.port)
        answer = _arrive(setup, rendezvous, arrival, deadline)
        if isinstance(answer, Superseded):
            target = answer.epoch
            continue
        try:
            _enter(setup, answer, store)
        except Exception as err:
            newer = (_newer_epoch(rendezvous, answer.epoch, deadline) if setup.restartable
                     else None)
            if newer is None:
                raise RuntimeError(
                    f"torch world: rank {rank} could not join the world of epoch {answer.epoch} "
                    f"({setup.backend} at {answer.master_addr}:{answer.master_port}): {err}"
                ) from err
            log.info("torch world: rank %d: epoch %d was cut (%s); joining epoch %d",
                     rank, answer.epoch, err, newer)
            target = newer
            continue
        ray.get(rendezvous.formed.remote(rank, answer.epoch), timeout=_left(deadline))
        return answer.epoch


def _arrive(setup: WorldSetup, rendezvous: Any, arrival: Arrival,
            deadline: float) -> Assignment | Superseded:
    try:
        answer: Assignment | Superseded = ray.get(rendezvous.arrive.remote(arrival),
                                                  timeout=_left(deadline))
        return answer
    except (GetTimeoutError, RayTaskError) as err:
        if not isinstance(err, GetTimeoutError) and not isinstance(err.cause, TimeoutError):
            raise  # not the wait running out: the rendezvous failed
        try:
            missing = ray.get(rendezvous.missing.remote(), timeout=30)
            what = f"rank(s) {missing}"
        except Exception:  # the rendezvous itself is gone
            what = "the other ranks"
        raise RuntimeError(
            f"torch world: rank {arrival.rank} waited join_timeout_s={setup.join_timeout_s} s "
            f"for {what} to arrive (did their actors fail to start?)"
        ) from None


def _newer_epoch(rendezvous: Any, epoch: int, deadline: float) -> int | None:
    """The epoch that replaced `epoch`, waiting for it until the deadline; None if none came."""
    wait_s = _left(deadline)
    newer: int | None = ray.get(rendezvous.newer_than.remote(epoch, wait_s),
                                timeout=wait_s + 30)
    return newer


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


def _enter(setup: WorldSetup, assignment: Assignment, store: Store | None) -> None:
    """Set the torchrun variables, join the default group and make the group of every dim."""
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=setup.timeout_s)
    os.environ.update({
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(assignment.master_port),
        "RANK": str(assignment.rank),
        "WORLD_SIZE": str(assignment.world_size),
        "LOCAL_RANK": str(assignment.local_rank),
        "LOCAL_WORLD_SIZE": str(assignment.local_world_size),
        "GROUP_RANK": str(assignment.group_rank),
        "GROUP_WORLD_SIZE": str(assignment.group_world_size),
    })
    if setup.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError(
            "backend 'nccl' needs a GPU, and this actor sees none "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    if store is None:
        store = _c10d.client_store(assignment.master_addr, assignment.master_port,
                                   setup.timeout_s)
    backends = _c10d.device_backends(setup.backend)  # an nccl world takes CPU tensors too
    dist.init_process_group(backends, store=store, rank=assignment.rank,
                            world_size=assignment.world_size, timeout=timeout)
    shape = am.current_rank().shape
    dims: dict[str, ProcessGroup] = {}
    for dim in shape.dims:
        for ranks in dim_groups(shape, dim):
            group = dist.new_group(ranks, timeout=timeout, backend=backends)
            if assignment.rank in ranks:
                dims[dim] = cast("ProcessGroup", group)
    info = _groups.TorchWorld(assignment.epoch, assignment.rank, assignment.world_size,
                              assignment.local_rank, assignment.local_world_size,
                              assignment.master_addr, assignment.master_port, setup.backend)
    with _groups.lock:
        _groups.world = _groups.WorldGroups(setup.world_id, info, dims, store)
    log.info("torch world: rank %d joined epoch %d at %s:%d", assignment.rank,
             assignment.epoch, assignment.master_addr, assignment.master_port)


def _leave() -> None:
    """Destroy this process's world (its default and dim groups, and those of a formation that
    failed half-way); its links stay."""
    with _groups.lock:
        _groups.world = None
        keep = [link.group for link in _groups.links.values()]
    _c10d.leave_world(keep)


def dim_groups(shape: am.Shape, dim: str) -> list[list[int]]:
    """The ranks of each group along `dim` (actors that share every other coordinate), the
    groups ordered by the rank of their first member: the order every rank creates them in."""
    groups: list[list[int]] = []
    for rank in range(shape.size):
        coords = shape.coords(rank)
        if coords[dim] == 0:
            groups.append([shape.rank({**coords, dim: i}) for i in range(shape[dim])])
    return groups
