"""Inside an actor: the process groups it belongs to now, by name, and `process_group(name)`.

The world's groups (its default group and one group per dim) and the links are replaced, never
mutated, when they re-form, so a caller always gets the current group.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._C._distributed_c10d import ProcessGroup, Store


@dataclasses.dataclass(frozen=True)
class TorchWorld:
    """This process's place in its torch world: the torchrun variables and the world's epoch.

    `epoch` counts the times the world formed again after a restart (0 at start-up).
    """

    epoch: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str


@dataclasses.dataclass(frozen=True)
class WorldGroups:
    """A formed world: its description, its per-dim groups, the store rank 0 hosts for it."""

    world_id: str
    info: TorchWorld
    dims: dict[str, ProcessGroup]
    store: Store


@dataclasses.dataclass(frozen=True)
class LinkGroup:
    """A formed link: its group and the store its rank 0 hosts."""

    group: ProcessGroup
    store: Store


lock = threading.RLock()
world: WorldGroups | None = None
links: dict[str, LinkGroup] = {}


def process_group(name: str) -> ProcessGroup:
    """The current process group called `name`, inside an actor of a `TorchMesh` or a link.

    A dim name gives the group of the actors that share every other coordinate with this one
    (`"dp"`: the data-parallel group); a link name the group `link(..., name=name)` formed.
    Re-formed groups replace old ones: call this again after a restart rather than keep a group.
    """
    with lock:
        if world is not None and name in world.dims:
            return world.dims[name]
        if name in links:
            return links[name].group
        dims = sorted(world.dims) if world is not None else []
        raise KeyError(
            f"no process group {name!r} in this actor: dims {dims}, links {sorted(links)}"
            + ("" if world is not None or links else " (not in a TorchMesh world or a link)")
        )


def current_world() -> TorchWorld:
    """This actor's place in its `TorchMesh` world (raises outside one)."""
    with lock:
        if world is None:
            raise RuntimeError("current_world() works only inside an actor of a TorchMesh")
        return world.info


def world_membership() -> tuple[str, int] | None:
    """(world id, rank) of this process's world, or None outside a TorchMesh world."""
    with lock:
        return None if world is None else (world.world_id, world.info.rank)
