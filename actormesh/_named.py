"""A mesh with a name, as other drivers find it: what its creator publishes, what `connect` reads.

The creator of `ActorMesh(Worker, shape, name="engines")` names its actors `engines.0`,
`engines.1`, ... in its Ray namespace and publishes a `Record` of the mesh in Ray's internal
key-value store (the GCS), under that namespace and name: the shape, the actors' ids, the
class's methods (each with its dispatch and whether its calls may ride a batch), and the mesh's
incarnation: an id of its own, which names the table in which its drivers share their load and
the load registry of drivers on other hosts (`_drivers`; the named actor
`engines.load.<incarnation>`), so that a driver of a mesh that was shut down never shares with
a newer mesh of the same name. A driver in the same namespace reads the record, looks the
actors up by name and checks that they are the ones the record lists. The creator's `shutdown()` marks the record closing before it kills the actors
and removes it after, so a driver that connects meanwhile gets a clear error rather than a mesh
of dying actors; a creator that exits without a shutdown removes it at exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import logging
import pickle
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.cloudpickle import cloudpickle

from . import _ray
from ._actor import method_def
from ._errors import MeshError
from ._shape import Shape
from .dispatch import Dispatch

log = logging.getLogger("actormesh")

# Pickles a class defined in a script by value, so that a driver without the script can read it.
_dumps: Callable[[Any], bytes] = cloudpickle.dumps  # untyped in Ray


@dataclasses.dataclass(frozen=True)
class Method:
    """A method of the mesh's class as another driver calls it."""

    dispatch: bytes | None  # its default am.Dispatch, pickled (it may be a class of the user's)
    alone: bool  # `@am.method(coalesce=False)`: its calls never ride a batch


@dataclasses.dataclass(frozen=True)
class Record:
    """What a driver needs to join a named mesh."""

    name: str
    namespace: str
    class_name: str
    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    actor_ids: tuple[bytes, ...]  # in rank order
    methods: Mapping[str, Method]
    concurrent: bool  # its actors run several calls at once (asyncio)
    incarnation: str  # fresh for every mesh made: names its load table and registry
    closing: bool = False

    @property
    def table(self) -> str:
        """The token of the mesh's load table (`_drivers.table_path`): its incarnation."""
        return self.incarnation

    @property
    def shape(self) -> Shape:
        return Shape(dict(zip(self.dims, self.sizes)))

    def method(self, name: str) -> tuple[Dispatch | None, bool]:
        """`name`'s default dispatch and whether its calls go alone; AttributeError (naming the
        class) for a method the class does not have."""
        found = self.methods.get(name)
        if found is None:
            raise AttributeError(f"{self.class_name} (mesh {self.name!r}) has no method {name!r}")
        if found.dispatch is None:
            return None, found.alone
        try:
            dispatch: Dispatch = pickle.loads(found.dispatch)
        except Exception as err:
            raise MeshError(
                f"mesh {self.name!r}: cannot load the dispatch of {self.class_name}.{name} in "
                f"this driver ({type(err).__name__}: {err}); the module that defines it must "
                "be importable here") from err
        return dispatch, found.alone


def actor_name(name: str, rank: int) -> str:
    """The Ray name of a named mesh's actor of rank `rank`."""
    return f"{name}.{rank}"


def registry_name(record: Record) -> str:
    """The Ray name of the load registry (`_drivers.LoadRegistry`) of the mesh of `record`."""
    return f"{record.name}.load.{record.incarnation}"


def _key(namespace: str, name: str) -> str:
    return f"mesh/{namespace}/{name}"


def methods_of(cls: type[Any]) -> dict[str, Method]:
    """Every method a mesh of `cls` can be called with, as `Method`s."""
    out: dict[str, Method] = {}
    for name in dir(cls):
        if name.startswith("__") or not callable(inspect.getattr_static(cls, name, None)):
            continue
        definition = method_def(cls, name)
        if definition is None:
            out[name] = Method(None, False)
        else:
            dispatch = None if definition.dispatch is None else _dumps(definition.dispatch)
            out[name] = Method(dispatch, not definition.coalesce)
    return out


class Publication:
    """A mesh this driver created with a name, published until its shutdown."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self._key = _key(record.namespace, record.name)
        self._lock = threading.Lock()
        self._withdrawn = False
        _ray.kv_put(self._key, pickle.dumps(record))
        with _published_lock:
            _published.add(self)
            global _exit_registered
            if not _exit_registered:
                # Now, after ray.init: exit handlers run last first, so this runs before Ray's
                # own shutdown, while the key-value store can still be reached.
                atexit.register(_withdraw_all)
                _exit_registered = True

    def closing(self) -> None:
        """The mesh is being shut down: drivers that look for it from now on are refused."""
        with self._lock:
            if not self._withdrawn:
                _ray.kv_put(self._key, pickle.dumps(dataclasses.replace(self.record,
                                                                        closing=True)))

    def withdraw(self) -> None:
        """The mesh is gone: remove its record (once)."""
        with self._lock:
            if self._withdrawn:
                return
            self._withdrawn = True
        with _published_lock:
            _published.discard(self)
        if _ray.connected():  # else the record went with the cluster
            _ray.kv_del(self._key)


def publish(name: str, cls: type[Any], shape: Shape, handles: Sequence[Any],
            concurrent: bool) -> Publication:
    """Publish the mesh `name` this driver has just created over `handles` (rank order)."""
    record = Record(name, _ray.namespace(), cls.__qualname__, shape.dims, shape.sizes,
                    tuple(_ray.actor_id(h) for h in handles), methods_of(cls), concurrent,
                    uuid.uuid4().hex)
    return Publication(record)


def find(name: str) -> tuple[Record, list[Any]]:
    """The record of the mesh `name` in this driver's namespace and its actors' handles (rank
    order). MeshError naming the mesh when there is none, it is being shut down, or an actor is
    missing or is not the one its creator started."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"connect needs the name of a mesh (a non-empty str), got {name!r}")
    namespace = _ray.namespace()
    raw = _ray.kv_get(_key(namespace, name))
    if raw is None:
        raise MeshError(f"no mesh named {name!r} in Ray namespace {namespace!r}: create it with "
                        f"am.ActorMesh(..., name={name!r}) in a driver of this namespace "
                        "(ray.init(namespace=...)) first")
    record: Record = pickle.loads(raw)
    if record.closing:
        raise MeshError(f"mesh {name!r} is being shut down by its creator")
    handles: list[Any] = []
    missing: list[str] = []
    for rank, expected in enumerate(record.actor_ids):
        try:
            handle = ray.get_actor(actor_name(name, rank), namespace=namespace)
        except ValueError:
            missing.append(f"rank {rank} ({actor_name(name, rank)!r}: not found)")
            continue
        if _ray.actor_id(handle) != expected:
            missing.append(f"rank {rank} ({actor_name(name, rank)!r} is another actor than the "
                           "one its creator started)")
            continue
        handles.append(handle)
    if missing:
        raise MeshError(f"mesh {name!r} is incomplete: {len(missing)} of its "
                        f"{len(record.actor_ids)} actors are missing: {', '.join(missing[:4])}"
                        f"{', ...' if len(missing) > 4 else ''} (an actor died for good, or "
                        "the mesh's creator exited)")
    return record, handles


def is_current(record: Record) -> bool:
    """Whether the mesh of `record` is still published and not being shut down (no newer mesh
    has taken its name)."""
    raw = _ray.kv_get(_key(record.namespace, record.name))
    if raw is None:
        return False
    now: Record = pickle.loads(raw)
    return now.incarnation == record.incarnation and not now.closing


def check_class(record: Record, cls: type[Any]) -> None:
    """TypeError unless `cls` is the class the mesh of `record` was made of (by its name and
    its methods)."""
    if cls.__qualname__ != record.class_name:
        raise TypeError(f"connect({record.name!r}, {cls.__qualname__}): mesh {record.name!r} "
                        f"is a mesh of {record.class_name}")
    methods = methods_of(cls)
    differ = sorted(set(methods) ^ set(record.methods))
    if differ:
        raise TypeError(f"connect({record.name!r}, {cls.__qualname__}): the class differs from "
                        f"the one the mesh was made of in its methods {differ}")


# Meshes this process published and has not withdrawn: withdrawn at exit, when Ray kills their
# actors, so that no driver finds a record of actors that are gone.
_published: set[Publication] = set()
_published_lock = threading.Lock()
_exit_registered = False


def _withdraw_all() -> None:
    with _published_lock:
        left = list(_published)
    for publication in left:
        try:
            publication.withdraw()
        except Exception as err:  # noqa: BLE001 - Ray is gone already
            log.debug("actormesh: removing the record of mesh %r at exit failed: %s",
                      publication.record.name, err)
