"""Where the processes of one torch world meet, epoch after epoch.

A world is formed in epochs. Every process arrives at the `Rendezvous` (an async Ray actor the
driver owns) with its node and, for rank 0, the port of the `TCPStore` it has already bound; once
all have arrived, each gets its `Assignment` (the torchrun variables) and joins the world of that
epoch.

A process that arrives when it is already counted in the current epoch is a new incarnation (its
actor restarted, or its join failed): a new epoch begins. Processes still waiting in the old
gathering are answered `Superseded` and arrive again; every other process is invited to rejoin,
through its actor handle (`rejoin(epoch)` runs in the actor, after whatever call it is in: a
collective that the death cut fails within the world's timeout first). An arrival for an epoch
older than the current one is answered `Superseded` too, so a stale invitation never joins an
old world, and an invitation for an epoch the process already joined is ignored in the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("actormesh.torch")


@dataclasses.dataclass(frozen=True)
class Arrival:
    """A process reporting for a world: `epoch` is None for a new process (a fresh actor)."""

    rank: int
    epoch: int | None
    node_id: str
    host: str
    port: int | None  # rank 0's TCPStore port, bound before it is sent here


@dataclasses.dataclass(frozen=True)
class Superseded:
    """The epoch arrived for is over: arrive again for `epoch`."""

    epoch: int


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One process's place in the world of `epoch`, as torchrun would describe it."""

    epoch: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int  # the node's index, nodes ordered by their lowest rank
    group_world_size: int
    master_addr: str
    master_port: int


def assign(epoch: int, arrivals: Sequence[Arrival]) -> list[Assignment]:
    """Every rank's assignment, given one arrival per rank (in rank order); rank 0 hosts the store.

    Local ranks count the processes of one node in rank order, as torchrun's do on a node.
    """
    master = arrivals[0]
    if master.port is None:
        raise ValueError("rank 0 arrived without its store port")
    nodes: dict[str, list[int]] = {}
    for arrival in arrivals:
        nodes.setdefault(arrival.node_id, []).append(arrival.rank)
    node_index = {node: i for i, node in enumerate(nodes)}  # insertion order: by lowest rank
    return [
        Assignment(epoch, a.rank, len(arrivals), nodes[a.node_id].index(a.rank),
                   len(nodes[a.node_id]), node_index[a.node_id], len(nodes), master.host,
                   master.port)
        for a in arrivals
    ]


class Rendezvous:
    """The meeting point of one world's processes, and the keeper of its epochs."""

    def __init__(self, size: int, wait_s: float) -> None:
        self._size = size
        self._wait_s = wait_s
        self._epoch = 0
        self._arrived: dict[int, Arrival] = {}
        self._gathering: asyncio.Future[list[Assignment] | Superseded] | None = None
        self._formed: set[int] = set()
        self._settled = asyncio.Event()
        self._new_epoch = asyncio.Event()
        self._actors: list[Any] = []
        self._invite: Callable[[Any, int], Any] | None = None
        self._invitations: set[asyncio.Task[None]] = set()

    async def attach(self, actors: Sequence[Any], invite: Callable[[Any, int], Any]) -> None:
        """Give the world's actor handles (rank order) and how to invite one: `invite(handle,
        epoch)` returns the ObjectRef of a call that runs `rejoin(epoch)` in the actor."""
        self._actors = list(actors)
        self._invite = invite

    async def arrive(self, arrival: Arrival) -> Assignment | Superseded:
        """Wait until every rank has arrived for the current epoch; then this rank's place."""
        if arrival.epoch is not None and arrival.epoch < self._epoch:
            return Superseded(self._epoch)
        if arrival.rank in self._arrived:
            self._begin_epoch(arrival.rank)
        if self._gathering is None:
            self._gathering = asyncio.get_running_loop().create_future()
        gathering = self._gathering
        self._arrived[arrival.rank] = arrival
        if len(self._arrived) == self._size:
            in_order = [self._arrived[r] for r in range(self._size)]
            gathering.set_result(assign(self._epoch, in_order))
        # The caller gives up after the same time; a gathering that never completes must not
        # keep this coroutine forever.
        result = await asyncio.wait_for(asyncio.shield(gathering), self._wait_s)
        return result if isinstance(result, Superseded) else result[arrival.rank]

    def _begin_epoch(self, rank: int) -> None:
        """`rank` came back: start the next epoch and ask everyone not waiting here to rejoin."""
        old = self._gathering
        waiting = set(self._arrived) if old is not None and not old.done() else set()
        self._epoch += 1
        log.info("torch world: rank %d joins again; forming epoch %d", rank, self._epoch)
        if old is not None and not old.done():
            old.set_result(Superseded(self._epoch))
        self._gathering = None
        self._arrived = {}
        self._formed = set()
        self._settled.clear()
        self._new_epoch.set()
        self._new_epoch = asyncio.Event()
        for other, handle in enumerate(self._actors):
            if other != rank and other not in waiting:
                task = asyncio.ensure_future(self._send_invitation(other, handle, self._epoch))
                self._invitations.add(task)
                task.add_done_callback(self._invitations.discard)

    async def _send_invitation(self, rank: int, handle: Any, epoch: int) -> None:
        assert self._invite is not None
        try:
            await self._invite(handle, epoch)
        except Exception as err:  # dead or restarting: it arrives by itself when back
            log.info("torch world: rank %d could not rejoin epoch %d: %s", rank, epoch,
                     str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)

    async def formed(self, rank: int, epoch: int) -> None:
        """`rank` has joined the world of `epoch` and made its groups."""
        if epoch == self._epoch:
            self._formed.add(rank)
            if len(self._formed) == self._size:
                self._settled.set()

    async def settled(self) -> int:
        """Wait until every rank has joined the current epoch's world; return that epoch."""
        await asyncio.wait_for(self._settled.wait(), self._wait_s)
        return self._epoch

    async def newer_than(self, epoch: int, wait_s: float) -> int | None:
        """The current epoch once it is past `epoch` (waiting up to `wait_s`), else None."""
        if self._epoch <= epoch:
            try:
                await asyncio.wait_for(self._new_epoch.wait(), wait_s)
            except asyncio.TimeoutError:
                return None
        return self._epoch

    async def missing(self) -> list[int]:
        """The ranks that have not arrived for the current epoch."""
        return [r for r in range(self._size) if r not in self._arrived]

    async def epoch(self) -> int:
        return self._epoch
