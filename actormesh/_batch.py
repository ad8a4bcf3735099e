"""Batches: calls that ride one Ray task to one actor, each keeping its own value or error.

In the actor, a batch runs its calls in order on a synchronous actor, and concurrently on an
asyncio actor (as that many separate calls would run), each call's value or error kept apart.
If any call raised, the batch raises `BatchRaised`, carrying every call's result: the task then
reads RAISED in its object's metadata, which the driver checks on Ray's completion thread without
deserialising anything (a call that raised counts as a failure for the balancer, not as a fast
success). A call's error is the `RayTaskError` Ray would have made of it alone, so the caller sees
the same error either way.

On the driver, a `Batch` stands for the task: it is ended by one completion callback, and its
value is deserialised once, by the first caller that reads one of its calls, on that caller's
thread; every call then reads its own element.

A mesh's own actors run batches in a method their class gains (`BATCH`); actors made elsewhere
(`from_actors`) run them through Ray's `__ray_call__`, which can host any function in any actor.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError, RayTaskError

from . import _ray

if TYPE_CHECKING:
    from ._calls import Call, Router

BATCH = "_actormesh_batch"
"""The method a mesh actor's class gains to run a batch: `BATCH(items)`."""

Item = tuple[str, tuple[Any, ...], dict[str, Any]]
"""One call of a batch: method name, positional and keyword arguments."""


class Failed:
    """A call of a batch that raised: the `RayTaskError` Ray would have stored for it alone."""

    __slots__ = ("error",)

    def __init__(self, error: RayTaskError) -> None:
        self.error = error

    def __reduce__(self) -> tuple[type[Failed], tuple[RayTaskError]]:
        return Failed, (self.error,)


class BatchRaised(Exception):
    """Raised by a batch in which some call raised; `results` holds every call's result."""

    def __init__(self, results: list[Any]) -> None:
        failed = sum(isinstance(r, Failed) for r in results)
        super().__init__(f"{failed} of the {len(results)} calls of a batch raised")
        self.results = results

    def __reduce__(self) -> tuple[type[BatchRaised], tuple[list[Any]]]:
        return BatchRaised, (self.results,)


# -- in the actor ---------------------------------------------------------------------------------
def run_in_order(instance: Any, items: Sequence[Item]) -> list[Any]:
    """Run a batch on a synchronous actor: each call in turn, as Ray would run them."""
    results: list[Any] = []
    for name, args, kwargs in items:
        try:
            results.append(getattr(instance, name)(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - the call's own error, kept for its caller
            results.append(Failed(_task_error(instance, name, err)))
    return _returned(results)


async def run_concurrently(instance: Any, items: Sequence[Item]) -> list[Any]:
    """Run a batch on an asyncio actor: every call at once on its event loop, as Ray runs
    separate calls to such an actor."""

    async def one(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            result = getattr(instance, name)(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        except Exception as err:  # noqa: BLE001 - the call's own error, kept for its caller
            return Failed(_task_error(instance, name, err))

    return _returned(list(await asyncio.gather(*(one(*item) for item in items))))


def run_in_actor(instance: Any, items: Sequence[Item]) -> list[Any]:
    """Run a batch in an actor of any class, through `handle.__ray_call__`. Ray runs that on
    the task's own thread even in an asyncio actor; there, the calls go to the actor's event
    loop the way Ray sends its own coroutines."""
    if not _ray.in_asyncio_actor():
        return run_in_order(instance, items)
    return _ray.run_on_event_loop(run_concurrently(instance, items), type(instance))


def _returned(results: list[Any]) -> list[Any]:
    if any(isinstance(r, Failed) for r in results):
        raise BatchRaised(results)
    return results


def _task_error(instance: Any, name: str, error: Exception) -> RayTaskError:
    """The error Ray stores for a call of `name` that raised `error`."""
    cause = error.cause if isinstance(error, RayTaskError) else error  # Ray never nests them
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    function = f"{type(instance).__name__}.{name}"
    try:
        actor_repr = repr(instance)
    except Exception:  # noqa: BLE001 - a __repr__ that fails must not lose the call's error
        actor_repr = None
    make: Callable[..., RayTaskError] = RayTaskError  # untyped in Ray
    return make(function, text, cause, proctitle=f"ray::{function}", actor_repr=actor_repr,
                actor_id=ray.get_runtime_context().get_actor_id())


# -- on the driver --------------------------------------------------------------------------------
def send_to_mesh_actor(handle: Any, items: list[Item]) -> Any:
    """Send a batch to an actor of a mesh's own class, which has the batch method."""
    return getattr(handle, BATCH).remote(items)


def send_to_any_actor(handle: Any, items: list[Item]) -> Any:
    """Send a batch to an actor made elsewhere."""
    return handle.__ray_call__.remote(run_in_actor, items)


SendBatch = Callable[[Any, list[Item]], Any]


_UNREAD: Any = object()


class Batch:
    """The driver's side of one batch: its calls, where it went, and its value once read."""

    __slots__ = ("router", "calls", "actor", "epoch", "started", "method", "ref", "_values",
                 "_lock")

    def __init__(self, router: Router, calls: list[Call], actor: int, epoch: int,
                 started: float, method: int) -> None:
        self.router = router
        self.calls = calls  # until it has ended
        self.actor = actor
        self.epoch = epoch
        self.started = started
        self.method = method  # the calls' method id when they share one, else 0 (any call)
        self.ref: Any = None  # the ObjectRef of the task, once sent
        self._values: Any = _UNREAD  # every call's result, or the RayError the task ended with
        self._lock = threading.Lock()

    def ended(self, error: BaseException | None) -> None:
        """Ray's `_on_ready` callback: the task has ended (`error`: its value will never exist)."""
        self.router._ended_batch(self, error)

    def unread(self) -> bool:
        return self._values is _UNREAD

    def store(self, values: list[Any]) -> None:
        """The task's value, read by somebody else (`am.get` reads many tasks at once)."""
        with self._lock:
            if self._values is _UNREAD:
                self._values = values

    def element(self, index: int) -> tuple[Any, RayError | None]:
        """Call `index`'s value, or the error it ended with; the first reader reads the task."""
        values = self._values
        if values is _UNREAD:
            with self._lock:
                if self._values is _UNREAD:
                    self._values = _results(lambda: _ray.get(self.ref))
                values = self._values
        return _element(values, index)


def _results(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except RayError as err:
        return _results_of_error(err)


def _results_of_error(error: RayError) -> Any:
    """What a batch that ended with `error` holds: every result when some call raised, else
    the error, which then is every call's."""
    if isinstance(error, RayTaskError) and isinstance(error.cause, BatchRaised):
        return error.cause.results
    return error


def _element(values: Any, index: int) -> tuple[Any, RayError | None]:
    if isinstance(values, RayError):
        return None, values
    value = values[index]
    if isinstance(value, Failed):
        return None, value.error
    return value, None
