"""Results of mesh calls: `MeshFuture` (one pending result) and `ValueMesh` (values on a shape).

A call is made of parts, one per actor called. Each part holds a `Result` that the completion
callback of its Ray call settles, so waiting, awaiting and consuming results as they complete all
go through the same objects, whichever thread Ray completes them on. `Result` is deliberately
small (a few slots; an event only once somebody blocks): a `choose` makes one per call, and every
tracked object a call allocates is work for the garbage collector while thousands are in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload

import ray

from ._shape import IndexKey, Point, Shape

R = TypeVar("R")
V = TypeVar("V")

_PENDING, _VALUE, _ERROR = 0, 1, 2
_settling = threading.Lock()  # one for all results: held for a few bytecodes, never while waiting


class Result:
    """A value or an error that arrives once, from any thread."""

    __slots__ = ("_state", "_value", "_callbacks", "_event")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[Result], object]] | None = None
        self._event: threading.Event | None = None

    def settle(self, value: Any, error: BaseException | None) -> bool:
        """Set the outcome; False (and nothing changes) if it was already set."""
        with _settling:
            if self._state != _PENDING:
                return False
            self._state, self._value = (_VALUE, value) if error is None else (_ERROR, error)
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        for callback in callbacks or ():
            callback(self)
        return True

    def done(self) -> bool:
        return self._state != _PENDING

    def add_done_callback(self, callback: Callable[[Result], object]) -> None:
        """Call `callback(self)` once settled (at once if it already is)."""
        with _settling:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback(self)

    def wait(self, timeout: float | None = None) -> bool:
        if self._state != _PENDING:
            return True
        with _settling:
            if self._state != _PENDING:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def error(self) -> BaseException | None:
        return self._value if self._state == _ERROR else None

    def value(self) -> Any:
        """The value, or raise the error (the result must be settled)."""
        if self._state == _ERROR:
            raise self._value
        return self._value

    async def wait_async(self) -> Any:
        """Await the value from an event loop (settled on another thread or this one)."""
        if self._state == _PENDING:
            loop = asyncio.get_running_loop()
            woken: asyncio.Future[None] = loop.create_future()

            def resume() -> None:
                if not woken.done():
                    woken.set_result(None)

            def wake(_: Result) -> None:
                loop.call_soon_threadsafe(resume)

            self.add_done_callback(wake)
            await woken
        return self.value()


class ValueMesh(Generic[R]):
    """Values laid out on a mesh shape, one per point, in rank order."""

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
        selection = self._shape.select(key)
        items = key if isinstance(key, tuple) else (key,)
        if all(isinstance(k, int) for k in items) and len(items) < len(self._shape):
            raise IndexError(
                f"index {key!r} names {len(items)} of the {len(self._shape)} dims of {self._shape}; "
                "give every dim, or slices for the ones to keep"
            )
        if not selection.shape:
            return self._values[selection.positions[0]]
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


class Part:
    """One actor's share of a call: its result, its point and, once sent, its ObjectRef.

    For `choose` the point is known only once the scheduler has picked the actor: `locate`
    records the actor, and the point is built from it only if somebody asks.
    """

    __slots__ = ("result", "ref", "_point", "_actor", "_view")

    def __init__(self, point: Point | None, view: Callable[[int], Point] | None = None) -> None:
        self.result = Result()
        self.ref: ray.ObjectRef[Any] | None = None
        self._point = point
        self._view = view
        self._actor = -1

    def locate(self, actor: int) -> None:
        self._actor = actor

    @property
    def point(self) -> Point:
        if self._point is None:
            assert self._view is not None and self._actor >= 0, "the call was never sent"
            self._point = self._view(self._actor)
        return self._point


class Canceller(Protocol):
    """What can cancel the calls behind a future (the router)."""

    def cancel(self, calls: Sequence[Any], error: BaseException) -> None: ...


class MeshFuture(Generic[R]):
    """A pending result of `all`, `choose` or `shard`: `.get()`, `await`, or per-actor as completed."""

    __slots__ = ("_parts", "_result", "_label", "_owner", "_calls")

    def __init__(
        self,
        parts: Sequence[Part],
        combine: Callable[[list[Any]], R] | None,
        label: str,
        owner: Canceller | None = None,
        calls: Sequence[Any] = (),
    ) -> None:
        self._parts = parts
        self._label = label
        self._owner = owner
        self._calls = calls
        if combine is None:  # a single part whose value is the result (choose)
            self._result = parts[0].result
        else:
            self._result = Result()
            _when_all(parts, combine, self._result)

    def get(self, timeout: float | None = None) -> R:
        """Wait for the result; raise the call's error, or `TimeoutError` after `timeout` s."""
        if not self._result.wait(timeout):
            raise TimeoutError(f"{self._label} did not finish within {timeout} s")
        value: R = self._result.value()
        return value

    def __await__(self) -> Generator[Any, None, R]:
        return self._result.wait_async().__await__()

    def done(self) -> bool:
        return self._result.done()

    def add_done_callback(self, callback: Callable[[MeshFuture[R]], object]) -> None:
        """Call `callback(self)` once the result is in (at once if it is), on the thread that
        settles it: keep it short."""
        self._result.add_done_callback(lambda _: callback(self))

    def cancel(self) -> None:
        """Fail the call with `CancelledError`: queued calls are dropped; calls already sent to
        an actor run to their end and their results are dropped."""
        if self._owner is not None:
            import concurrent.futures as cf

            self._owner.cancel(self._calls, cf.CancelledError(f"{self._label} was cancelled"))

    @property
    def refs(self) -> list[ray.ObjectRef[Any]]:
        """The ObjectRefs of the Ray calls sent so far, one per actor called."""
        return [p.ref for p in self._parts if p.ref is not None]

    @property
    def ref(self) -> ray.ObjectRef[Any]:
        """The ObjectRef of a single-actor call (`choose`)."""
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
        """Yield `(point, value)` per actor as each finishes; a failed part raises its error."""
        finished: queue.SimpleQueue[Part] = queue.SimpleQueue()
        for part in self._parts:
            part.result.add_done_callback(_put_when_done(finished, part))
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                part = finished.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"{self._label}: not every actor answered within {timeout} s") from None
            yield part.point, part.result.value()

    @overload
    def __aiter__(self: MeshFuture[ValueMesh[V]]) -> AsyncIterator[tuple[Point, V]]: ...
    @overload
    def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]: ...
    async def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]:
        async def one(part: Part) -> tuple[Point, Any]:
            value = await part.result.wait_async()
            return part.point, value

        for next_done in asyncio.as_completed([one(p) for p in self._parts]):
            yield await next_done

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"MeshFuture({self._label}, {state})"


def _put_when_done(finished: queue.SimpleQueue[Part], part: Part) -> Callable[[Result], None]:
    return lambda _: finished.put(part)


def _when_all(parts: Sequence[Part], combine: Callable[[list[Any]], R], out: Result) -> None:
    """Settle `out` with `combine(values)` once every part is done, or with the first error."""
    finished = itertools.count(1)  # next() is atomic under the GIL: no lock on completion threads
    total = len(parts)
    if total == 0:
        out.settle(combine([]), None)
        return

    def on_part_done(result: Result) -> None:
        error = result.error()
        if error is not None:
            out.settle(None, error)
        if next(finished) == total and not out.done():
            try:
                values = [p.result.value() for p in parts]
            except BaseException as err:  # noqa: BLE001 - a part's error, already settled above
                out.settle(None, err)
                return
            try:
                out.settle(combine(values), None)
            except Exception as err:  # the dispatch's collect failed
                out.settle(None, err)

    for part in parts:
        part.result.add_done_callback(on_part_done)
