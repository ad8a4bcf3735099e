"""`link(*meshes, name)`: one process group over the actors of several meshes or views.

The driver forms a link in two rounds of `run_in_actors`, so any mesh actor can join, in a torch
world or not: `open_link` in every member reports its world (for torch's rank translation) and,
in link rank 0, binds a `TCPStore` on port 0; then `join_link` in every member, all at once,
creates the group on that store. Each formation has a version of its own (a new store, a new
group name), and a member drops the group of an older formation as it joins a new one.

The driver remembers which links each actor belongs to, so a `TorchMesh` re-forms the links of
an actor that restarted; for an actor of a plain `ActorMesh`, call `Link.reform()` from that
mesh's `on_restart`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray

import actormesh as am

from . import _c10d, _checks, _groups
from ._world import node_ip_address

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

log = logging.getLogger("actormesh.torch")

_SETTLE_S = 60.0
"""How long the driver waits for an actor's answer beyond the link's own timeout."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """What a member tells the driver in the first round: its world, and (rank 0) the store."""

    world: tuple[str, int] | None
    host: str | None
    port: int | None


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One formation of a link, sent to every member in the second round."""

    name: str
    version: str
    members: tuple[str, ...]  # Ray actor ids, in link rank order
    worlds: tuple[tuple[str, int] | None, ...]  # each member's (world id, world rank)
    host: str
    port: int
    backend: str
    timeout_s: float


# -- inside the actors ----------------------------------------------------------------------------
_opened: dict[str, tuple[str, Store]] = {}  # link name -> (version, store) bound by link rank 0


def open_link(_instance: object, name: str, version: str, members: Sequence[str],
              timeout_s: float) -> Peer:
    """First round, in every member: report this process's world; link rank 0 binds the store."""
    if ray.get_runtime_context().get_actor_id() != members[0]:
        return Peer(_groups.world_membership(), None, None)
    host = node_ip_address()
    store = _c10d.master_store(host, timeout_s)
    with _groups.lock:
        _opened[name] = (version, store)
    return Peer(_groups.world_membership(), host, store.port)


def join_link(_instance: object, spec: LinkSpec) -> int:
    """Second round, in every member: drop the link's old group and join this formation's."""
    import torch

    rank = spec.members.index(ray.get_runtime_context().get_actor_id())
    close_link(_instance, spec.name)
    if spec.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError(f"link {spec.name!r}: backend 'nccl' needs a GPU, and link rank "
                           f"{rank} sees none")
    with _groups.lock:
        opened = _opened.pop(spec.name, None)
    if rank == 0:
        if opened is None or opened[0] != spec.version:
            raise RuntimeError(f"link {spec.name!r}: the store of formation {spec.version} is "
                               "gone from link rank 0 (formed again meanwhile?)")
        store = opened[1]
    else:
        store = _c10d.client_store(spec.host, spec.port, spec.timeout_s)
    mine = _groups.world_membership()
    if mine is None:
        rank_map = {r: r for r in range(len(spec.members))}
    else:  # torch translates through the ranks of this process's own world
        rank_map = {world[1]: r for r, world in enumerate(spec.worlds)
                    if world is not None and world[0] == mine[0]}
    group = _c10d.link_group(f"actormesh.link.{spec.name}.{spec.version}", rank,
                             len(spec.members), spec.backend, store, spec.timeout_s, rank_map)
    with _groups.lock:
        _groups.links[spec.name] = _groups.LinkGroup(group, store)
    return rank


def close_link(_instance: object, name: str) -> None:
    """Destroy this member's group of link `name`, if it has one."""
    import torch.distributed as dist

    with _groups.lock:
        old = _groups.links.pop(name, None)
    if old is not None:
        dist.destroy_process_group(old.group)


# -- on the driver --------------------------------------------------------------------------------
_registry_lock = threading.Lock()
_by_actor: dict[str, list[Link]] = {}


def links_of(actor_id: str) -> list[Link]:
    """The open links that include the actor `actor_id`."""
    with _registry_lock:
        return list(_by_actor.get(actor_id, ()))


def forget_actors(actor_ids: Sequence[str]) -> None:
    """The actors are gone for good (their mesh shut down): their links cannot form again."""
    with _registry_lock:
        dropped = dict.fromkeys(lk for actor_id in actor_ids for lk in _by_actor.pop(actor_id, []))
    for lk in dropped:  # forget_link takes the lock itself (it is not re-entrant)
        forget_link(lk)


def actor_id(handle: Any) -> str:
    """The Ray actor id of a handle, as `get_runtime_context().get_actor_id()` gives it inside."""
    return str(handle._actor_id.hex())


class Link:
    """A process group over the actors of several meshes or views (see `link`)."""

    def __init__(self, meshes: Sequence[am.ActorMesh[Any]], name: str, backend: str,
                 timeout_s: float) -> None:
        self._meshes = list(meshes)
        self._name = name
        self._backend = backend
        self._timeout_s = timeout_s
        self._members = tuple(actor_id(h) for mesh in meshes for h in mesh.actors)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return len(self._members)

    @property
    def backend(self) -> str:
        return self._backend

    def reform(self) -> None:
        """Form the group again in every member (after one restarted); old groups are dropped.

        Members busy with a call join after it; a collective on the old group fails within
        the link's timeout first.
        """
        with self._lock:
            if self._closed:
                raise am.MeshError(f"link {self._name!r} is closed")
            version = uuid.uuid4().hex[:12]
            wait_s = self._timeout_s + _SETTLE_S
            opened = [m.run_in_actors(open_link, self._name, version, self._members,
                                      self._timeout_s) for m in self._meshes]
            peers = [peer for future in opened for peer in _get(future, wait_s, self._name)]
            host, port = peers[0].host, peers[0].port
            assert host is not None and port is not None
            spec = LinkSpec(self._name, version, self._members, tuple(p.world for p in peers),
                            host, port, self._backend, self._timeout_s)
            joined = [m.run_in_actors(join_link, spec) for m in self._meshes]
            errors: list[BaseException] = []
            for future in joined:  # wait for every member, so none is left mid-formation
                try:
                    _get(future, wait_s, self._name)
                except Exception as err:
                    errors.append(err)
            if errors:
                raise errors[0]
        log.info("link %r formed over %d actors (%s)", self._name, self.size, version)

    def close(self) -> None:
        """Destroy the group in every live member and forget the link."""
        with self._lock:
            forget_link(self)
            for mesh in self._meshes:
                try:
                    mesh.run_in_actors(close_link, self._name).get(
                        timeout=self._timeout_s + _SETTLE_S)
                except Exception as err:  # a dead member, a shut mesh: no group left there
                    log.info("link %r: closing in %r failed: %s", self._name, mesh, err)

    def __repr__(self) -> str:
        return f"Link({self._name!r}, size={self.size}, backend={self._backend!r})"


def _get(future: am.MeshFuture[am.ValueMesh[Any]], wait_s: float, name: str) -> list[Any]:
    try:
        return list(future.get(timeout=wait_s))
    except (am.MeshError, TimeoutError) as err:  # names the member that failed
        raise RuntimeError(f"link {name!r} could not form: {err}") from err


def link(*meshes: am.ActorMesh[Any], name: str, backend: str = "gloo",
         timeout_s: float = 60) -> Link:
    """Form one process group over the actors of `meshes` (meshes or views), ranked in the order
    given; inside them `process_group(name)` returns it.

    `link(trainer[0], engines, name="weights")` makes the trainer's rank 0 rank 0 of the group
    and the engines ranks 1.., the weight-sync topology of RL frameworks. The actors may be of
    any mesh, in a torch world or not. Collectives on the group time out after `timeout_s`.
    Returns once every member has joined.

    When an actor of a `TorchMesh` restarts, the links that include it form again before the
    mesh's `on_restart` runs; for an actor of a plain `ActorMesh`, call `reform()` from that
    mesh's `on_restart`. The link holds its meshes until `close()` (or until a `TorchMesh` among
    them shuts down).
    """
    if not meshes:
        raise ValueError(f"link {name!r}: give at least one mesh or view")
    for mesh in meshes:
        if not isinstance(mesh, am.ActorMesh):
            raise TypeError(f"link {name!r}: {mesh!r} is not an ActorMesh or a view of one")
    if not isinstance(name, str) or not name:
        raise ValueError(f"link name {name!r}: must be a non-empty string")
    timeout_s = _checks.seconds("timeout_s", timeout_s)
    _check_members(meshes, name)
    chosen = _checks.link_backend(backend)
    lk = Link(meshes, name, chosen, timeout_s)
    with _registry_lock:
        for member in lk._members:
            clash = [other for other in _by_actor.get(member, []) if other.name == name]
            if clash:
                raise ValueError(f"link {name!r} already exists over some of these actors: "
                                 "close() it first, or pick another name")
        for member in lk._members:
            _by_actor.setdefault(member, []).append(lk)
    try:
        lk.reform()
    except BaseException:
        forget_link(lk)
        raise
    return lk


def forget_link(lk: Link) -> None:
    """`lk` is closed: it forms no more, and its name is free again on its actors."""
    with _registry_lock:
        lk._closed = True
        for member in lk._members:
            if lk in _by_actor.get(member, []):
                _by_actor[member].remove(lk)


def _check_members(meshes: Sequence[am.ActorMesh[Any]], name: str) -> None:
    """No actor twice, and no dim of the meshes' worlds named like the link."""
    seen: dict[str, str] = {}
    for index, mesh in enumerate(meshes):
        for point, handle in zip(mesh.points, mesh.actors):
            where = f"rank {point.rank} ({point.coords}) of {mesh!r} (argument {index + 1})"
            dims = point.shape.dims
            if name in dims:
                raise ValueError(f"link name {name!r} is a dim of {mesh!r}, whose actors call "
                                 f"process_group({name!r}) for that dim; pick another name")
            key = actor_id(handle)
            if key in seen:
                raise ValueError(f"link {name!r}: the meshes overlap: {where} is also "
                                 f"{seen[key]}; each actor can hold one link rank")
            seen[key] = where
