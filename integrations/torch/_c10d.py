"""Where this integration touches `torch.distributed` below its documented API, in one place.

1. A process group that is not a subgroup of the default world: a link spans actors of several
   worlds, or of none, so `dist.new_group` (which takes ranks of the caller's world) cannot make
   it. `link_group` builds it as `init_process_group` builds a default group (vLLM and OpenRLHF
   do the same for their weight-sync groups) and registers it with torch, so `dist.broadcast(...,
   group=g, group_src=0)`, object collectives and `dist.get_rank(g)` work on it.
2. Tearing down one world while its links live on: `dist.destroy_process_group()` destroys every
   group of the process, links included. `leave_world` destroys the world's groups one by one and
   resets the group counter as torch's own teardown does, so the groups of the next world get the
   names that a freshly restarted process gives them.

3. The stores: `TCPStore` and `ProcessGroup` live in `torch._C._distributed_c10d`, which torch
   re-exports without declaring it; rank 0's store binds port 0, so the kernel picks a port no
   socket uses, and is published only once bound.

4. Device backends: a group made with `"nccl"` alone refuses CPU tensors ("No backend type
   associated with device type cpu"); `device_backends` gives nccl worlds, dim groups and links
   gloo for their CPU tensors, as `init_process_group("cpu:gloo,cuda:nccl")` does.

Everything here runs inside an actor, and is checked against the pinned torch by the tests.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from torch._C._distributed_c10d import ProcessGroup, Store, TCPStore


def device_backends(backend: str) -> str:
    """The backend string a group is made with: nccl for CUDA tensors and gloo for CPU tensors
    when `backend` is nccl, else `backend`."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def master_store(host: str, timeout_s: float) -> TCPStore:
    """A store served by this process on a port the kernel picks (`.port`), bound on return."""
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(host, 0, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def client_store(host: str, port: int, timeout_s: float) -> TCPStore:
    """A connection to the store at `host:port` (waits up to `timeout_s` for it)."""
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def link_group(name: str, rank: int, size: int, backend: str, store: Store,
               timeout_s: float, rank_map: Mapping[int, int]) -> ProcessGroup:
    """A registered group of `size` processes outside the default world; blocks until all joined.

    `rank_map` maps the world ranks of the members that share this process's world to their
    ranks in the group (torch's `get_rank(group)` translates through it); for a process in no
    world, give the identity.
    """
    from torch.distributed import distributed_c10d as c10d

    made, _ = c10d._new_process_group_helper(
        size, rank, [], device_backends(backend), store, group_name=cast("c10d.GroupName", name),
        timeout=datetime.timedelta(seconds=timeout_s), group_desc=f"actormesh link {name}",
    )
    group = cast("ProcessGroup", made)  # not NON_GROUP_MEMBER: every caller is a member
    c10d._world.pg_group_ranks[group] = dict(rank_map)
    return group


def leave_world(keep: Collection[ProcessGroup]) -> None:
    """Destroy the default group and every other group of this process but those in `keep`."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    default = c10d.GroupMember.WORLD
    if default is None:
        return
    kept = {id(group) for group in keep}
    for group in list(c10d._world.pg_names):
        if group is not default and id(group) not in kept:
            dist.destroy_process_group(group)
    # With no default group set, torch destroys the old one as a plain group: the others stay.
    c10d._update_default_pg(None)
    dist.destroy_process_group(default)
    c10d._world.group_count = 0
