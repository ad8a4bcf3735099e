"""Inside the actor: how a Ray task of several calls runs them, each call keeping its own outcome.

The driver sends a task of N calls (`_calls.Task`) as one Ray call to a method the actor's class
gains (`BATCH`, or `STREAM` for a task expected to run long), or, for an actor made elsewhere,
through Ray's `__ray_call__` (`run_in_actor`). Each call's outcome is packed on its own, in the
actor, before anything leaves it:
- a value is pickled by itself: one that cannot be pickled fails its own call only
  (`Raised`), and one the driver cannot unpickle fails only there (`unpack`);
- an error is the `RayTaskError` Ray would have stored for the call alone, pickled by itself;
- a call the task cannot run as Ray would run it alone (its method belongs to a concurrency
  group of its own) is not started (`Skipped`): the driver sends it alone.
So the task itself never raises: one call's failure never touches the others', and the driver
counts failures per call from the envelope (`Listed`: the packed outcomes, and the seconds the
actor spent running them, on its own clock, which is what sizes the next batches: the driver's
view of a task of tiny calls is mostly its own delays).

A synchronous actor runs the calls in order, as Ray runs separate calls to it. An asyncio actor
runs them concurrently on its event loop, each holding a slot of the actor's own bound
(`max_concurrency`, shared by every task the mesh sends it), so the bound holds for calls that
ride together. A `STREAM` task reports each call as it ends (a Ray streaming generator): a call
that finished reaches the driver even if the actor dies later in the task.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import pickle
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

import ray
from ray.cloudpickle import cloudpickle as _cloudpickle
from ray.exceptions import RayTaskError

_cloudpickle_dumps: Callable[..., bytes] = _cloudpickle.dumps  # untyped in Ray

BATCH = "_actormesh_batch"
"""The method a mesh actor's class gains to run a task of several calls: `BATCH(items)`."""
STREAM = "_actormesh_stream"
"""Its streaming twin: yields `(index, packed)` as each call ends."""
ASYNCIO = "_actormesh_asyncio"
"""A method only an asyncio mesh actor's class gains: how a driver tells one from its handle."""

Item = tuple[str, tuple[Any, ...], dict[str, Any]]
"""One call of a task: method name, positional and keyword arguments."""


class Raised:
    """A call that raised (or whose value could not be pickled): its `RayTaskError`, pickled."""

    __slots__ = ("error",)

    def __init__(self, error: bytes) -> None:
        self.error = error

    def __reduce__(self) -> tuple[type[Raised], tuple[bytes]]:
        return Raised, (self.error,)


class Skipped:
    """A call the task did not start (`reason` says why): the driver sends it alone."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __reduce__(self) -> tuple[type[Skipped], tuple[str]]:
        return Skipped, (self.reason,)


class Deferred:
    """A call a task in order did not reach within `UNSTREAMED_S`: the driver routes it again."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type[Deferred], tuple[()]]:
        return Deferred, ()


UNSTREAMED_S = 0.05
"""A task expected to run longer than this is streamed (each call reported as it ends). One that
returns its calls together and runs in order is given a bound (`run_in_order`'s `bound_s`):
this, or twice its expected time if longer; past it, it starts no more calls, so that what an
actor dying in it takes with it stays about a lone call's, whatever the calls' expected time
said."""

Packed = bytes | Raised | Skipped | Deferred
Listed = tuple[float, list[Packed]]
"""A task's value: the seconds the actor spent running its calls, and each call's outcome."""


# -- packing, in the actor ------------------------------------------------------------------------
def _dumps(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - a lambda, a local class: what Ray's cloudpickle takes
        pickled: bytes = _cloudpickle_dumps(value, protocol=5)
        return pickled


def _packed_value(instance: Any, name: str, value: Any) -> Packed:
    try:
        return _dumps(value)
    except Exception as err:  # noqa: BLE001 - this call's value only
        failure = TypeError(f"{type(instance).__name__}.{name} returned a value that cannot be "
                            f"serialized ({type(value).__name__}): {err}")
        return _packed_error(instance, name, failure)


def _packed_error(instance: Any, name: str, error: BaseException) -> Raised:
    task_error = _task_error(instance, name, error)
    try:
        return Raised(_dumps(task_error))
    except Exception:  # noqa: BLE001 - an exception that cannot be pickled: keep its text
        plain = RuntimeError(f"{type(error).__name__}: {error}")
        return Raised(_dumps(_task_error(instance, name, plain, text=task_error.traceback_str)))


def _task_error(instance: Any, name: str, error: BaseException,
                text: str | None = None) -> RayTaskError:
    """The error Ray stores for a call of `name` that raised `error`."""
    cause = error.cause if isinstance(error, RayTaskError) else error  # Ray never nests them
    if text is None:
        text = "".join(traceback.format_exception(type(error), error, _calls_own(error)))
    function = f"{type(instance).__name__}.{name}"
    try:
        actor_repr = repr(instance)
    except Exception:  # noqa: BLE001 - a __repr__ that fails must not lose the call's error
        actor_repr = None
    make: Callable[..., RayTaskError] = RayTaskError  # untyped in Ray
    return make(function, text, cause, proctitle=f"ray::{function}", actor_repr=actor_repr,
                actor_id=ray.get_runtime_context().get_actor_id())


def _calls_own(error: BaseException) -> TracebackType | None:
    """`error`'s traceback from the call's method on: the runner's frame that made the call is
    no part of it (Ray's traceback of a call alone shows none of Ray's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == __name__:
        tb = tb.tb_next
    return tb


def _skip(instance: Any, name: str) -> Skipped | None:
    """Why a call of `name` cannot run inside this task, if it cannot: a method Ray runs in a
    concurrency group of its own must run there."""
    group = getattr(getattr(type(instance), name, None), "__ray_concurrency_group__", None)
    if group is not None:
        return Skipped(f"{type(instance).__name__}.{name} runs in concurrency group {group!r}")
    return None


# What a call may raise that is not its own error: Ray's cancel of a synchronous task
# (KeyboardInterrupt in its thread) and an exit of the actor (`sys.exit`, `ray.actor.exit_actor`)
# stop the task as they would stop the call alone. Anything else a call raises, a
# `BaseException` of the user's own included, is that call's error only.
_STOPS_THE_TASK = (KeyboardInterrupt, SystemExit)


def _run_one(instance: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Packed:
    skipped = _skip(instance, name)
    if skipped is not None:
        return skipped
    try:
        value = getattr(instance, name)(*args, **kwargs)
    except _STOPS_THE_TASK:
        raise
    except BaseException as err:  # noqa: BLE001 - the call's own error, kept for its caller
        return _packed_error(instance, name, err)
    return _packed_value(instance, name, value)


def _cancelled_from_outside() -> bool:
    """Whether the running asyncio task is being cancelled (the task's cancel reaching its
    calls), rather than a call raising `CancelledError` of its own."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    return task is None or cancelling is None or cancelling() > 0


async def _await_one(instance: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                     limit: asyncio.Semaphore) -> Packed:
    skipped = _skip(instance, name)
    if skipped is not None:
        return skipped
    async with limit:
        try:
            value = getattr(instance, name)(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except asyncio.CancelledError as err:
            if _cancelled_from_outside():
                raise
            return _packed_error(instance, name, err)
        except _STOPS_THE_TASK:
            raise
        except BaseException as err:  # noqa: BLE001 - the call's own error, kept for its caller
            return _packed_error(instance, name, err)
    return _packed_value(instance, name, value)


# -- the task, in the actor -----------------------------------------------------------------------
def run_in_order(instance: Any, items: Sequence[Item], bound_s: float = math.inf) -> Listed:
    """A synchronous actor: each call in turn, as Ray would run them; the calls not started
    once the task has run `bound_s` are `Deferred`."""
    start = time.perf_counter()
    packed: list[Packed] = []
    for item in items:
        if packed and time.perf_counter() - start > bound_s:
            packed.extend(Deferred() for _ in range(len(items) - len(packed)))
            break
        packed.append(_run_one(instance, *item))
    return time.perf_counter() - start, packed


def stream_in_order(instance: Any, items: Sequence[Item]) -> Iterator[tuple[int, Packed]]:
    for index, item in enumerate(items):
        yield index, _run_one(instance, *item)


_limits: dict[int, asyncio.Semaphore] = {}


def _limit(max_concurrency: int) -> asyncio.Semaphore:
    """The actor's bound on calls running at once, shared by every task (one event loop)."""
    limit = _limits.get(max_concurrency)
    if limit is None:
        limit = _limits[max_concurrency] = asyncio.Semaphore(max_concurrency)
    return limit


async def run_concurrently(instance: Any, items: Sequence[Item],
                           max_concurrency: int) -> Listed:
    """An asyncio actor: every call on its event loop, at most `max_concurrency` at once
    (cancelling the task cancels every call still running)."""
    limit = _limit(max_concurrency)
    start = time.perf_counter()
    packed = list(await asyncio.gather(*(_await_one(instance, *item, limit) for item in items)))
    return time.perf_counter() - start, packed


async def stream_concurrently(instance: Any, items: Sequence[Item],
                              max_concurrency: int) -> AsyncIterator[tuple[int, Packed]]:
    limit = _limit(max_concurrency)

    async def one(index: int, item: Item) -> tuple[int, Packed]:
        return index, await _await_one(instance, *item, limit)

    pending = [asyncio.ensure_future(one(i, item)) for i, item in enumerate(items)]
    try:
        for finished in asyncio.as_completed(pending):
            yield await finished
    finally:
        for task in pending:
            task.cancel()


def run_in_actor(instance: Any, items: Sequence[Item], bound_s: float = math.inf) -> Listed:
    """A task for an actor made elsewhere, through `handle.__ray_call__` (only actors that run
    calls in order take tasks of several calls: `_calls.Router`)."""
    return run_in_order(instance, items, bound_s)


# -- on the driver --------------------------------------------------------------------------------
def unpack(packed: Packed) -> tuple[Any, BaseException | None]:
    """A call's value, or the error it ended with (a `RayTaskError`, as Ray gives it)."""
    if isinstance(packed, Raised):
        try:
            error: BaseException = pickle.loads(packed.error)
        except Exception as err:  # noqa: BLE001 - an exception class this process lacks
            error = RuntimeError(f"the call raised an exception this process cannot "
                                 f"deserialize: {err}")
        return None, error
    try:
        return pickle.loads(packed), None  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - a value class this process lacks
        return None, RuntimeError(f"the call's value cannot be deserialized in this process: "
                                  f"{type(err).__name__}: {err}")
