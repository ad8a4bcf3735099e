"""Results of mesh calls: `MeshFuture` (one pending result) and `ValueMesh` (values on a shape).

A `MeshFuture` stands over the calls a verb made (`_calls.Call`, one per actor called). It
settles on Ray's completion thread, in O(1) per call: with a single call's own future (its
ObjectRef), or, for `all` and `shard`, once the last call has ended or one has failed. Nothing
is read there, nor on the library's loop thread: the first reader (`get()`, `await`, a
done-callback on the mesh's user lane) reads the values (`ray.get`) and combines them (a
dispatch's `collect`) on its own thread, once, and every other reader gets the same value or
error. So a slow `collect`, or one that calls the mesh and waits, delays only its readers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import ray
from ray.exceptions import RayError

from . import _calls, _loop, _ray
from ._calls import Call, Result, Router, read
from ._shape import IndexKey, Point, Selectable, Selection, Shape

R = TypeVar("R")
V = TypeVar("V")

_lock = threading.Lock()  # held for a few bytecodes: claiming a future's read, finding a lane
_lanes: weakref.WeakKeyDictionary[Router, _loop.Lane] = weakref.WeakKeyDictionary()


class MeshFuture(Generic[R]):
    """A pending result of `all`, `choose` or `shard`: `.get()`, `await`, or per actor as each
    call completes."""

    __slots__ = ("_calls", "_future", "_label", "_router", "_combine", "_read",
                 "_return_exceptions")

    def __init__(self, calls: Sequence[Call], future: Result[Any], label: str, router: Router,
                 *, combine: Callable[[list[Any]], Any] | None,
                 return_exceptions: bool = False) -> None:
        self._calls = calls
        # Settled once the result can be read: a call's own future (`combine` None), or the
        # one `_ended` makes over several calls (the call that failed first, or None).
        self._future = future
        self._label = label
        self._router = router
        self._combine = combine
        self._read: Result[Any] | None = None  # the result, once a reader has claimed it
        # Errors are values: a single call's error is returned; with several, each part's.
        self._return_exceptions = return_exceptions

    @classmethod
    def of_call(cls, call: Call, label: str, *, return_exceptions: bool) -> MeshFuture[Any]:
        """The future of one call (`choose`): its value is read when first asked for."""
        return cls((call,), call.future, label, call.router, combine=None,
                   return_exceptions=return_exceptions)

    @classmethod
    def of_calls(cls, calls: Sequence[Call], combine: Callable[[list[Any]], Any], label: str,
                 router: Router, *, return_exceptions: bool) -> MeshFuture[Any]:
        """The future of several calls whose values `combine` makes one (`all`, `shard`)."""
        return cls(calls, _ended(calls, stop_at_error=not return_exceptions), label, router,
                   combine=combine, return_exceptions=return_exceptions)

    def get(self, timeout: float | None = None) -> R:
        """Wait for the result; raise the call's error, or `TimeoutError` after `timeout` s
        (the call goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._combine is None and self._read is None:
            value: R = _calls.read_sent(self._calls[0], timeout)  # settles the future if read
            if value is not _calls.NOT_READ and self._provide(value):
                return value  # (the value every later reader gets)
        if not self._future.wait(_left(deadline)):
            raise TimeoutError(f"{self._label} did not finish within {timeout} s"
                               + self._router.why_waiting())
        result, mine = self._claim()
        if mine:
            self._fill(result)
        elif not result.wait(None if deadline is None else deadline - time.monotonic()):
            raise TimeoutError(f"{self._label} did not finish within {timeout} s"
                               + self._router.why_waiting())
        return self._outcome(result)

    def __await__(self) -> Generator[Any, None, R]:
        return self._wait().__await__()

    async def _wait(self) -> R:
        if not self._future.done():
            try:
                await _settled(self._future)
            except asyncio.CancelledError:
                # As for an asyncio future: cancelling the awaiting task (`asyncio.wait_for`
                # timing out, say) cancels the call. `asyncio.shield(future)` keeps it running.
                self.cancel()
                raise
        result, mine = self._claim()
        if mine and self._combine is None and self._future.exception() is None \
                and _arrived(self._future.result()[0]):
            self._fill(result)  # a small value this process holds: read at once
        elif mine:  # off this event loop's thread: a value may be large, a collect slow
            await asyncio.get_running_loop().run_in_executor(None, self._fill, result)
        elif not result.done():
            await _settled(result)
        return self._outcome(result)

    def _claim(self) -> tuple[Result[Any], bool]:
        """The result every reader shares, and whether this reader is the one to fill it."""
        with _lock:
            result = self._read
            if result is not None:
                return result, False
            result = self._read = Result()
            return result, True

    def _unread(self) -> bool:
        """No reader has claimed the result yet."""
        return self._read is None

    def _provide(self, value: Any) -> bool:
        """A value read for this single call elsewhere (`read_sent`, `am.get`): everybody's,
        unless a reader has claimed the result first (then False)."""
        with _lock:
            if self._read is not None:
                return False
            self._read = Result.of(value)
            return True

    def _fill(self, result: Result[Any]) -> None:
        """Read the values and combine them (once, for every reader)."""
        try:
            result.set_result(self._value())
        except BaseException as err:  # noqa: BLE001 - every reader gets it
            result.set_exception(err)

    def _value(self) -> Any:
        if self._combine is None:
            return read(self._calls[0])
        failed: Call | None = self._future.result()
        if failed is not None:
            read(failed)  # raises its error
            raise RuntimeError(f"{failed.method}: failed without an error")
        return self._combine(_values(self._calls, self._return_exceptions))

    def _outcome(self, result: Result[Any]) -> R:
        """The value, or the error raised (returned, for one call, with `return_exceptions`)."""
        try:
            value: R = result.result()
        except BaseException as error:
            if self._return_exceptions and self._combine is None \
                    and not isinstance(error, cf.CancelledError):
                return error  # type: ignore[return-value]
            raise
        return value

    def done(self) -> bool:
        return self._future.done()

    def add_done_callback(self, callback: Callable[[MeshFuture[R]], object]) -> None:
        """Call `callback(self)` once the result is in (soon if it is), on the mesh's user lane,
        after the callbacks added before it. An exception it raises is logged."""
        what = f"a done-callback of {self._label}"
        lane = _lane(self._router)
        self._future.add_done_callback(lambda _: lane.run(what, callback, self))

    def cancel(self) -> None:
        """Fail the call with `CancelledError`: a queued call is never sent; a call already sent
        is cancelled in its actor (an async actor stops it; a synchronous actor finishes a call
        it holds, and its result is dropped)."""
        self._router.cancel(self._calls, cf.CancelledError(f"{self._label} was cancelled"))

    @property
    def refs(self) -> list[ray.ObjectRef[Any]]:
        """The ObjectRefs of the Ray calls, one per actor called (a call still waiting for a
        slot is waited for). A call that rode a task with others has no ObjectRef of its own:
        for it, this waits until it has ended and puts its value (or error) in the object
        store, once."""
        return [ref for ref in map(_calls.own_ref, self._calls) if ref is not None]

    @property
    def ref(self) -> ray.ObjectRef[Any]:
        """The ObjectRef of a single-actor call (`choose`); see `refs` for a call that rode a
        batch."""
        refs = self.refs
        if len(refs) != 1:
            raise ValueError(f"{self._label} has {len(refs)} ObjectRefs; use .refs")
        return refs[0]

    def __reduce__(self) -> Any:
        raise TypeError(
            f"a MeshFuture ({self._label}) cannot be pickled (into a Ray task or actor): it "
            "lives in this driver's scheduler. Pass its ObjectRef instead (future.ref, or "
            "future.refs for a call of several actors), or its value (future.get())")

    @overload
    def as_completed(
        self: MeshFuture[ValueMesh[V]], timeout: float | None = None
    ) -> Iterator[tuple[Point, V]]: ...
    @overload
    def as_completed(self, timeout: float | None = None) -> Iterator[tuple[Point, Any]]: ...
    def as_completed(self, timeout: float | None = None) -> Iterator[tuple[Point, Any]]:
        """Yield `(point, value)` per actor as each finishes; a failed call raises its error."""
        finished: queue.SimpleQueue[Call] = queue.SimpleQueue()
        for call in self._calls:
            call.future.add_done_callback(_putting(finished, call))
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self._calls:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                call = finished.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(
                    f"{self._label}: not every actor answered within {timeout} s") from None
            value = read(call)  # raises a failed call's error first: it may have no point
            yield call.point, value

    @overload
    def __aiter__(self: MeshFuture[ValueMesh[V]]) -> AsyncIterator[tuple[Point, V]]: ...
    @overload
    def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]: ...
    async def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]:
        loop = asyncio.get_running_loop()

        async def one(call: Call) -> tuple[Point, Any]:
            await _settled(call.future)
            value = await loop.run_in_executor(None, read, call)  # off this loop's thread
            return call.point, value

        for next_done in asyncio.as_completed([one(c) for c in self._calls]):
            yield await next_done

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"MeshFuture({self._label}, {state})"


def _arrived(task: _calls.Task) -> bool:
    """Whether a call's value can be read at once: one carried in its task's reply (a task of
    several calls), or a lone call's value this process holds."""
    return task.wire != _calls.LONE or _ray.arrived(task.out)


def _putting(finished: queue.SimpleQueue[Call], call: Call) -> Callable[[Result[Any]], None]:
    return lambda _: finished.put(call)


def _lane(router: Router) -> _loop.Lane:
    """The lane of one mesh's done-callbacks (a slow callback holds up no other mesh's)."""
    with _lock:
        lane = _lanes.get(router)
        if lane is None:
            lane = _lanes[router] = _loop.Lane()
        return lane


async def _settled(future: Result[Any]) -> None:
    """Wait, in the running event loop, until `future` is settled. Cancelling the waiting task
    takes the waiter's callback back: nothing of it stays behind."""
    if future.done():
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    def callback(_: Result[Any]) -> None:
        loop.call_soon_threadsafe(wake)

    future.add_done_callback(callback)
    try:
        await woken
    finally:  # after a cancel (`woken` is cancelled with the task) the callback goes too
        future.remove_done_callback(callback)


def _ended(calls: Sequence[Call], *, stop_at_error: bool) -> Result[Call | None]:
    """A future settled (on Ray's completion thread, O(1) per call) once every call has ended,
    with None; or, with `stop_at_error`, as soon as one fails, with that call."""
    out: Result[Call | None] = Result()
    if not calls:
        out.set_result(None)
        return out
    left = [len(calls)]
    lock = threading.Lock()

    def one_done(future: Result[Any], call: Call) -> None:
        if stop_at_error and (future.exception() is not None or call.outcome != _ray.OK):
            out.set_result(call)  # the first to fail; a later outcome is dropped
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(None)

    for call in calls:
        call.future.add_done_callback(_calling(one_done, call))
    return out


def _calling(
    fn: Callable[[Result[Any], Call], None], call: Call
) -> Callable[[Result[Any]], None]:
    return lambda future: fn(future, call)


def _values(calls: Sequence[Call], errors_as_values: bool) -> list[Any]:
    """Every call's value in order, the successful ones in one read; a failed call's error
    raises, or (`errors_as_values`) stands in its place."""
    good = [c for c in calls if c.future.exception() is None and c.outcome == _ray.OK
            and c.future.result()[0].value_in_ref() and c.fn is None]
    values: dict[int, Any] = {}
    if good:
        try:
            for call, value in zip(good, _ray.get([c.future.result()[0].ref for c in good])):
                values[id(call)] = value
        except RayError:
            values = {}  # one of them failed after all: read them one by one below
    out: list[Any] = []
    for call in calls:
        if id(call) in values:
            out.append(values[id(call)])
            continue
        try:
            out.append(read(call))
        except Exception as err:
            if not errors_as_values:
                raise
            out.append(err)
    return out


class ValueMesh(Selectable, Generic[R]):
    """Values laid out on a mesh shape, one per point, in rank order. Selected like the mesh:
    `vm[1, 0]` (every dim named) is one value; `vm[:, 0]`, `vm.slice(dp=1)` and, on a mesh of
    several dims, `vm[1]` are value meshes over the chosen points (the type checker reads an
    index of ints as one value: write `vm[1, :]` or `vm.slice(...)` for a sub-mesh)."""

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if len(values) != shape.size:
            raise ValueError(f"{len(values)} values for shape {shape} of size {shape.size}")
        self._shape = shape
        self._values = list(values)

    @property
    def shape(self) -> Shape:
        return self._shape

    @overload
    def __getitem__(self, key: int | tuple[int, ...]) -> R: ...  # type: ignore[overload-overlap]
    @overload
    def __getitem__(self, key: slice | tuple[int | slice, ...]) -> ValueMesh[R]: ...
    def __getitem__(self, key: IndexKey) -> R | ValueMesh[R]:
        selected = self._select(key)
        return selected._values[0] if not selected._shape else selected

    def _selected(self, selection: Selection) -> ValueMesh[R]:
        return ValueMesh(selection.shape, [self._values[p] for p in selection.positions])

    def item(self, **coords: int) -> R:
        """The value at full coordinates: `vm.item(dp=1, tp=0)`."""
        for dim in coords:
            if dim not in self._shape:
                raise KeyError(f"unknown dim {dim!r} for shape {self._shape}")
        return self._values[self._shape.rank(coords)]

    def items(self) -> Iterator[tuple[Point, R]]:
        """`(point, value)` pairs in rank order."""
        for rank, value in enumerate(self._values):
            yield Point(rank, self._shape), value

    def __iter__(self) -> Iterator[R]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ValueMesh)
            and self._shape == other._shape
            and self._values == other._values
        )

    def __repr__(self) -> str:
        return f"ValueMesh({self._shape}, {self._values!r})"


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)
