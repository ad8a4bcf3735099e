"""Results of mesh calls: `MeshFuture` (one pending result) and `ValueMesh` (values on a shape).

A `MeshFuture` stands over the calls a verb made (`_calls.Call`, one per actor called). A call's
own future settles with its ObjectRef when it ends; its value is read on the thread that asks for
it (`get()`, `await`), so Ray's completion thread never deserialises a value. `all` and `shard`
combine their calls' values on the library's loop thread once the last call ends, or fail at the
first error. User callbacks (`add_done_callback`) run on the library's user thread, isolated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import ray
from ray.exceptions import RayError

from . import _calls, _loop, _ray
from ._calls import Call, Router, read, read_async
from ._result import Result
from ._shape import IndexKey, Point, Selectable, Selection, Shape

R = TypeVar("R")
V = TypeVar("V")

_UNREAD: Any = object()
_cache_lock = threading.Lock()  # held for a few bytecodes when a value is first read


class MeshFuture(Generic[R]):
    """A pending result of `all`, `choose` or `shard`: `.get()`, `await`, or per actor as each
    call completes."""

    __slots__ = ("_calls", "_future", "_label", "_router", "_one", "_cache",
                 "_return_exceptions")

    def __init__(self, calls: Sequence[Call], future: Result[Any], label: str,
                 router: Router, *, one: bool, return_exceptions: bool = False) -> None:
        self._calls = calls
        self._future = future  # one call's own future (its ObjectRef), or the combined value's
        self._label = label
        self._router = router
        self._one = one
        self._cache: Any = _UNREAD  # (value, error) once a single call's value has been read
        self._return_exceptions = return_exceptions

    @classmethod
    def of_call(cls, call: Call, label: str, *, return_exceptions: bool) -> MeshFuture[Any]:
        """The future of one call (`choose`): its value is read when first asked for."""
        return cls((call,), call.future, label, call.router, one=True,
                   return_exceptions=return_exceptions)

    @classmethod
    def of_calls(cls, calls: Sequence[Call], combine: Callable[[list[Any]], Any], label: str,
                 router: Router, *, return_exceptions: bool) -> MeshFuture[Any]:
        """The future of several calls whose values `combine` makes one (`all`, `shard`)."""
        return cls(calls, gather(calls, combine, return_exceptions), label, router, one=False)

    def get(self, timeout: float | None = None) -> R:
        """Wait for the result; raise the call's error, or `TimeoutError` after `timeout` s
        (the call goes on)."""
        left = timeout
        if self._one and self._cache is _UNREAD and not self._future.done():
            start = time.monotonic()
            value = _calls.read_sent(self._calls[0], timeout)  # settles the future if it reads
            if value is not _calls.NOT_READ:
                self._store(value, None)
            elif timeout is not None:
                left = max(timeout - (time.monotonic() - start), 0.0)
        if not self._future.wait(left):
            raise TimeoutError(f"{self._label} did not finish within {timeout} s")
        return self._outcome()

    def __await__(self) -> Generator[Any, None, R]:
        return self._wait().__await__()

    async def _wait(self) -> R:
        if not self._future.done():
            await _settled(self._future)
        if self._one and self._cache is _UNREAD and self._future.exception() is None:
            try:  # read the way Ray awaits a value: off this event loop's thread
                value, error = await read_async(self._calls[0]), None
            except Exception as err:  # noqa: BLE001 - the call's error, mapped by read_async
                value, error = None, err
            self._store(value, error)
        return self._outcome()

    def _outcome(self) -> R:
        """The settled result: the value, or the error raised (returned with
        `return_exceptions`)."""
        error = self._future.exception()
        if error is None and self._one:
            if self._cache is _UNREAD:
                try:
                    self._store(read(self._calls[0]), None)
                except Exception as err:  # noqa: BLE001 - the call's error, mapped by read
                    self._store(None, err)
            value, error = self._cache
        else:
            value = None if error is not None else self._future.result()
        if error is None:
            return value  # type: ignore[no-any-return]
        if self._return_exceptions and not isinstance(error, cf.CancelledError):
            return error  # type: ignore[return-value]
        raise error

    def _store(self, value: Any, error: BaseException | None) -> None:
        with _cache_lock:
            if self._cache is _UNREAD:  # the first reader's object is everybody's
                self._cache = (value, error)

    def done(self) -> bool:
        return self._future.done()

    def add_done_callback(self, callback: Callable[[MeshFuture[R]], object]) -> None:
        """Call `callback(self)` once the result is in (soon if it is), on the library's user
        thread, after the callbacks added before it. An exception it raises is logged."""
        what = f"a done-callback of {self._label}"
        self._future.add_done_callback(lambda _: _loop.run_user(what, callback, self))

    def cancel(self) -> None:
        """Fail the call with `CancelledError`: queued calls are dropped; calls already sent to
        an actor run to their end and their results are dropped."""
        self._router.cancel(self._calls, cf.CancelledError(f"{self._label} was cancelled"))

    @property
    def refs(self) -> list[ray.ObjectRef[Any]]:
        """The ObjectRefs of the Ray calls, one per actor called (a call still waiting for a
        slot is waited for). A call that rode a batch with others has no ObjectRef of its own:
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
        async def one(call: Call) -> tuple[Point, Any]:
            await _settled(call.future)
            return call.point, await read_async(call)

        for next_done in asyncio.as_completed([one(c) for c in self._calls]):
            yield await next_done

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"MeshFuture({self._label}, {state})"


def _putting(finished: queue.SimpleQueue[Call], call: Call) -> Callable[[Result[Any]], None]:
    return lambda _: finished.put(call)


async def _settled(future: Result[Any]) -> None:
    """Wait, in the running event loop, until `future` is settled. Cancelling the waiting task
    leaves `future` alone: other waiters may share it."""
    if future.done():
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    future.add_done_callback(lambda _: loop.call_soon_threadsafe(wake))
    await woken


def gather(calls: Sequence[Call], combine: Callable[[list[Any]], Any],
           return_exceptions: bool) -> Result[Any]:
    """A future of `combine(values)` over the calls' values in order, made on the loop thread
    once the last call has ended; or of the first error (with `return_exceptions`, errors are
    values). Counting happens on Ray's completion thread, in O(1) per call."""
    out: Result[Any] = Result()
    if not calls:
        _loop.post(_combine, calls, combine, return_exceptions, out)
        return out
    left = [len(calls)]
    lock = threading.Lock()

    def one_done(future: Result[Any], call: Call) -> None:
        if not return_exceptions and (future.exception() is not None
                                      or call.outcome != _ray.OK):
            _loop.post(_fail_with, call, out)
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            _loop.post(_combine, calls, combine, return_exceptions, out)

    for call in calls:
        call.future.add_done_callback(_calling(one_done, call))
    return out


def _calling(
    fn: Callable[[Result[Any], Call], None], call: Call
) -> Callable[[Result[Any]], None]:
    return lambda future: fn(future, call)


def _fail_with(call: Call, out: Result[Any]) -> None:
    if out.done():
        return
    try:
        read(call)
    except Exception as err:  # noqa: BLE001 - the call's error is the result's
        out.set_exception(err)
        return
    out.set_exception(RuntimeError(f"{call.method}: failed without an error"))


def _combine(calls: Sequence[Call], combine: Callable[[list[Any]], Any],
             return_exceptions: bool, out: Result[Any]) -> None:
    if out.done():
        return
    values: list[Any] = []
    try:
        for value in _read_all(calls):
            if isinstance(value, _Raised):
                if not return_exceptions:
                    out.set_exception(value.error)
                    return
                value = value.error
            values.append(value)
        result = combine(values)
    except Exception as err:  # noqa: BLE001 - e.g. a dispatch's collect failed: the result's
        out.set_exception(err)
        return
    out.set_result(result)


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _read_all(calls: Sequence[Call]) -> list[Any]:
    """Every call's value in order (an error as `_Raised`), the successful ones in one read."""
    good = [c for c in calls if c.future.exception() is None and c.outcome == _ray.OK]
    values: dict[int, Any] = {}
    if good:
        try:
            for call, value in zip(good, ray.get([c.future.result() for c in good])):
                values[id(call)] = value
        except RayError:
            good = []  # one of them failed after all: read them one by one below
    out: list[Any] = []
    for call in calls:
        if id(call) in values:
            out.append(values[id(call)])
            continue
        try:
            out.append(read(call))
        except Exception as err:  # noqa: BLE001 - that call's error
            out.append(_Raised(err))
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
