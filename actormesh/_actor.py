"""Inside a mesh actor: the rank identity, its environment, and the class Ray hosts.

Ray sees a subclass of the user's class in which every `@am.method` is a plain function again and
whose `__init__` takes the actor's identity first: it sets the environment and `current_rank()`
before the user's `__init__` runs. Ray re-runs `__init__` with the same arguments on a restart, so
a restarted actor comes back with the same rank, coordinates and environment.

The subclass adds `RUN` (`mesh.run_in_actors`) and the runner of tasks of several calls
(`_runner.BATCH`, `_runner.STREAM`; `_runner.ASYNCIO` marks an asyncio class), and nothing else
that changes how Ray hosts the actor: no concurrency group
(deaths are learnt from Ray's GCS, see `_failures`), so a synchronous actor runs its methods on
the thread that ran its `__init__`, as plain Ray actors do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import os
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from typing import Any, TypeVar, cast

import ray
from ray._private.async_compat import has_async_methods

from ._method import MethodDef, definition_of
from ._runner import (
    ASYNCIO,
    BATCH,
    STREAM,
    Item,
    Listed,
    Packed,
    run_concurrently,
    run_in_order,
    stream_concurrently,
    stream_in_order,
)
from ._shape import Point, Shape, format_coords, parse_coords

_current: Point | None = None

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Identity:
    """What an actor is told about itself: rank and the mesh shape (dims and sizes)."""

    rank: int
    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    max_concurrency: int | None = None  # an asyncio actor's bound, when not Ray's default

    @property
    def point(self) -> Point:
        return Point(self.rank, Shape(dict(zip(self.dims, self.sizes))))

    def env(self) -> dict[str, str]:
        point = self.point
        return {
            "ACTORMESH_RANK": str(self.rank),
            "ACTORMESH_WORLD_SIZE": str(point.world_size),
            "ACTORMESH_COORDS": format_coords(point.coords),
            "ACTORMESH_SHAPE": point.shape.env(),
            "RAY_ACTOR_MESH_RANK": str(self.rank),
        }


def current_rank() -> Point:
    """The calling actor's point in its mesh: `.rank`, `.coords`, `.shape`, `.world_size`."""
    if _current is not None:
        return _current
    rank, shape = os.environ.get("ACTORMESH_RANK"), os.environ.get("ACTORMESH_SHAPE")
    if rank is None or shape is None:
        raise RuntimeError(
            "am.current_rank() is only available inside an actor of an ActorMesh "
            "(ACTORMESH_RANK is not set in this process)"
        )
    return Point(int(rank), Shape(parse_coords(shape)))


_ASYNC_DEFAULT = 1000  # Ray's max_concurrency of an asyncio actor
_bound = _ASYNC_DEFAULT


def concurrency_bound() -> int:
    """This asyncio actor's bound on calls at once. A function of this module, so that the
    class Ray hosts (pickled by value, its globals with it) reads the actor's own value."""
    return _bound


def _enter_mesh(identity: Identity) -> None:
    global _current, _bound
    os.environ.update(identity.env())
    _current = identity.point
    _bound = identity.max_concurrency or _ASYNC_DEFAULT


RUN = "_actormesh_run"
"""Runs `fn(instance, *args, **kwargs)` inside the actor (awaited if it returns an awaitable)."""


async def _awaited(result: Any) -> Any:
    return await result



def is_asyncio(cls: type[Any]) -> bool:
    """Whether Ray runs an actor of `cls` in a mesh on an event loop, several calls at once: it
    does when any method is a coroutine function (`@am.method` leaves the function itself)."""
    return bool(has_async_methods(cast(Hashable, cls)))


def remote_class(cls: type[Any], concurrency_groups: Mapping[str, int] | None = None) -> Any:
    """The Ray actor class hosting `cls` in a mesh (see the module docstring), with Ray's
    `concurrency_groups` if given (Ray takes them only when the class is made)."""
    namespace: dict[str, Any] = {}

    def __init__(self: Any, identity: Identity, *args: Any, **kwargs: Any) -> None:
        _enter_mesh(identity)
        cls.__init__(self, *args, **kwargs)

    namespace["__init__"] = __init__
    namespace["__doc__"] = cls.__doc__
    if is_asyncio(cls):
        async def run_async(self: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            result = fn(self, *args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        async def batch_async(self: Any, items: list[Item], bound_s: float = math.inf) -> Listed:
            return await run_concurrently(self, items, concurrency_bound())  # calls at once

        async def stream_async(self: Any, items: list[Item]) -> AsyncIterator[tuple[int, Packed]]:
            async for reported in stream_concurrently(self, items, concurrency_bound()):
                yield reported

        def asyncio_marker(self: Any) -> bool:
            return True

        namespace[RUN] = run_async
        namespace[BATCH] = batch_async
        namespace[STREAM] = stream_async
        namespace[ASYNCIO] = asyncio_marker
    else:
        def run(self: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            result = fn(self, *args, **kwargs)
            return asyncio.run(_awaited(result)) if inspect.isawaitable(result) else result

        def batch(self: Any, items: list[Item], bound_s: float = math.inf) -> Listed:
            return run_in_order(self, items, bound_s)

        def stream(self: Any, items: list[Item]) -> Iterator[tuple[int, Packed]]:
            yield from stream_in_order(self, items)

        namespace[RUN] = run
        namespace[BATCH] = batch
        namespace[STREAM] = stream
    hosted = type(cls.__name__, (cls,), namespace)
    if concurrency_groups:
        with_options: Callable[..., Any] = ray.remote  # its typed overloads omit this option
        return with_options(concurrency_groups=dict(concurrency_groups))(hosted)
    return ray.remote(hosted)


def with_setup(cls: type[T], setup: Callable[[Any], None]) -> type[T]:
    """The subclass of `cls` whose `__init__(arg, *args, **kwargs)` runs `setup(arg)`, then
    `cls.__init__(*args, **kwargs)`: how an integration prepares an actor before the user's code
    runs (joins a JAX program, a torch world). Its arguments are checked against `cls`'s."""

    def __init__(self: Any, arg: Any, *args: Any, **kwargs: Any) -> None:
        setup(arg)
        cls.__init__(self, *args, **kwargs)

    namespace = {"__init__": __init__, "__doc__": cls.__doc__, _WRAPS: cls}
    return cast("type[T]", type(cls.__name__, (cls,), namespace))


_WRAPS = "_actormesh_wraps"


def check_init_args(cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse constructor arguments that do not fit `cls.__init__`, before any actor starts. For
    a class made by `with_setup`, the user's class is checked with the arguments after the
    setup's."""
    wrapped = cls.__dict__.get(_WRAPS)
    if wrapped is not None:
        check_init_args(wrapped, args[1:], kwargs)
        return
    init = cls.__init__
    if init is object.__init__:
        if args or kwargs:
            raise TypeError(f"{cls.__name__} takes no constructor arguments, got "
                            f"args={args!r}, kwargs={kwargs!r}")
        return
    try:
        signature = inspect.signature(init)
    except (TypeError, ValueError):  # a builtin or C init: nothing to check here
        return
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{cls.__name__}.__init__{signature} does not take args={args!r}, "
                        f"kwargs={kwargs!r}: {err}") from None


def method_def(cls: type[Any], name: str) -> MethodDef[Any, Any] | None:
    """The `@am.method` definition of `name` on `cls`, or None for an undecorated method.

    Raises AttributeError (naming the class) when `cls` has no callable `name`.
    """
    attr = inspect.getattr_static(cls, name, None)
    found = definition_of(attr)
    if found is not None:
        return found
    if name.startswith("__") or attr is None or not callable(getattr(cls, name, None)):
        raise AttributeError(f"{cls.__name__} has no method {name!r}")
    return None
