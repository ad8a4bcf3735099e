"""Results of mesh calls: `MeshFuture` (one pending result) and `ValueMesh` (values on a shape).

A call is made of parts, one per actor called. Each part is a `Result` that the completion
callback of its Ray call settles, so waiting, awaiting and consuming results as they complete all
go through the same objects, whichever thread Ray completes them on. They are deliberately small
(a few slots; a lock only once somebody blocks) and few: a `choose` is one object (the router's
`Call`, a `Part`, a `Result`) and its future, because every object a call leaves alive is work
for the garbage collector while thousands of calls are in flight.

A `Result` may also be settled *ready*: the call has finished and its value sits in an ObjectRef
that is read (deserialised, a Ray error mapped to ours) only when somebody first asks for it, on
that caller's thread. `choose` settles this way, so the completion callback Ray runs per call
stays a few microseconds of Python and the value is deserialised once, where it is used.
"""

from __future__ import annotations

import _thread
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

_PENDING, _VALUE, _ERROR, _READY = 0, 1, 2, 3
_settling = threading.Lock()  # one for all results: held for a few bytecodes, never while waiting

Outcome = tuple[Any, "BaseException | None"]
"""`(value, None)` or `(None, error)`: what a call ended with."""


class Result:
    """A value or an error that arrives once, from any thread.

    Readers check `_state` without the lock, so a writer stores `_value` before `_state`.
    """

    __slots__ = ("_state", "_value", "_callbacks", "_gate")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None  # the value, the error, or (ready) the ObjectRef holding the value
        self._callbacks: list[Callable[[Result], object]] | None = None
        # Taken (locked) while somebody blocks in `wait`; released once settled. Each waiter
        # passes it on, so every waiter wakes. A bare lock: `threading.Event` costs a Condition.
        self._gate: _thread.LockType | None = None

    def settle(self, value: Any, error: BaseException | None) -> bool:
        """Set the outcome; False (and nothing changes) if it was already set."""
        return self._settle(_VALUE, value) if error is None else self._settle(_ERROR, error)

    def settle_ready(self, ref: ray.ObjectRef[Any]) -> bool:
        """Settle with the value `ref` holds, read when first asked for (a Ray error raised then
        gives the outcome `self._raised(error)`). False if the result was already set."""
        return self._settle(_READY, ref)

    def _raised(self, error: Exception) -> Outcome:
        """The outcome when reading a ready value raises `error`."""
        return None, error

    def _settle(self, state: int, value: Any) -> bool:
        with _settling:
            if self._state != _PENDING:
                return False
            self._value = value
            self._state = state
            callbacks, self._callbacks = self._callbacks, None
            gate = self._gate
        if gate is not None:
            gate.release()
        for callback in callbacks or ():
            callback(self)
        return True

    def _ready(self) -> ray.ObjectRef[Any] | None:
        with _settling:
            return self._value if self._state == _READY else None

    def _read(self) -> None:
        """Read a ready value (no-op otherwise). Two threads may read at once; the first wins."""
        ref = self._ready()
        if ref is not None:
            try:
                outcome: Outcome = (ray.get(ref), None)
            except Exception as err:  # noqa: BLE001 - every Ray error the call can end with
                outcome = self._raised(err)
            self._resolve(outcome)

    def _resolve(self, outcome: Outcome) -> None:
        value, error = outcome
        with _settling:
            if self._state == _READY:
                self._value = value if error is None else error
                self._state = _VALUE if error is None else _ERROR

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
            if self._gate is None:
                self._gate = _thread.allocate_lock()
                self._gate.acquire()
            gate = self._gate
        if not gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        gate.release()  # for the next waiter
        return True

    def error(self) -> BaseException | None:
        if self._state == _READY:
            self._read()
        return self._value if self._state == _ERROR else None

    def value(self) -> Any:
        """The value, or raise the error (the result must be settled)."""
        if self._state == _READY:
            self._read()
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
        ref = self._ready()
        if ref is not None:  # read it the way Ray awaits a value, off this loop's thread
            try:
                outcome: Outcome = (await ref, None)
            except Exception as err:  # noqa: BLE001 - every Ray error the call can end with
                outcome = self._raised(err)
            self._resolve(outcome)
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


class Part(Result):
    """One actor's share of a call: its result, its point and, once sent, its actor and ObjectRef.

    For `choose` the point is known only once the scheduler has picked the actor: `actor` is set
    then, and the point is built from it (by `view`) only if somebody asks.
    """

    __slots__ = ("ref", "actor", "_point", "_view")

    def __init__(self, point: Point | None, view: Callable[[int], Point] | None = None) -> None:
        super().__init__()
        self.ref: ray.ObjectRef[Any] | None = None
        self.actor = -1
        self._point = point
        self._view = view

    @property
    def point(self) -> Point:
        if self._point is None:
            assert self._view is not None and self.actor >= 0, "the call was never sent"
            self._point = self._view(self.actor)
        return self._point


class Canceller(Protocol):
    """What can cancel the calls behind a future (the router, whose calls are the parts)."""

    def cancel(self, calls: Sequence[Any], error: BaseException) -> None: ...


class MeshFuture(Generic[R]):
    """A pending result of `all`, `choose` or `shard`: `.get()`, `await`, or per-actor as completed."""

    __slots__ = ("_parts", "_result", "_label", "_owner")

    def __init__(
        self,
        parts: Sequence[Part],
        combine: Callable[[list[Any]], R] | None,
        label: str,
        owner: Canceller | None = None,
    ) -> None:
        self._parts = parts
        self._label = label
        self._owner = owner
        self._result: Result
        if combine is None:  # a single part whose value is the result (choose)
            self._result = parts[0]
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

            self._owner.cancel(self._parts, cf.CancelledError(f"{self._label} was cancelled"))

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
            part.add_done_callback(_put_when_done(finished, part))
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                part = finished.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"{self._label}: not every actor answered within {timeout} s") from None
            yield part.point, part.value()

    @overload
    def __aiter__(self: MeshFuture[ValueMesh[V]]) -> AsyncIterator[tuple[Point, V]]: ...
    @overload
    def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]: ...
    async def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]:
        async def one(part: Part) -> tuple[Point, Any]:
            value = await part.wait_async()
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
                values = [p.value() for p in parts]
            except BaseException as err:  # noqa: BLE001 - a part's error, already settled above
                out.settle(None, err)
                return
            try:
                out.settle(combine(values), None)
            except Exception as err:  # the dispatch's collect failed
                out.settle(None, err)

    for part in parts:
        part.add_done_callback(on_part_done)
