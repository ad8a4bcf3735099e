"""Results of mesh calls: `MeshFuture` (one pending result) and `ValueMesh` (values on a shape).

A call is made of parts, one per actor called. Each part is a `concurrent.futures.Future` that the
completion callback of its Ray call resolves, so waiting, awaiting and consuming results as they
complete all go through the same objects, whichever thread Ray completes them on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import ray

from ._shape import IndexKey, Point, Shape

R = TypeVar("R")
V = TypeVar("V")


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
    """One actor's share of a call: its future, its point and, once sent, its ObjectRef."""

    __slots__ = ("future", "point", "ref")

    def __init__(self, point: Point | None) -> None:
        self.future: cf.Future[Any] = cf.Future()
        self.point = point
        self.ref: ray.ObjectRef[Any] | None = None


class MeshFuture(Generic[R]):
    """A pending result of `all`, `choose` or `shard`: `.get()`, `await`, or per-actor as completed."""

    __slots__ = ("_parts", "_result", "_label", "_cancel")

    def __init__(
        self,
        parts: Sequence[Part],
        combine: Callable[[list[Any]], R] | None,
        label: str,
        cancel: Callable[[], None] | None = None,
    ) -> None:
        self._parts = parts
        self._label = label
        self._cancel = cancel
        if combine is None:  # a single part whose value is the result (choose)
            self._result: cf.Future[R] = parts[0].future
        else:
            self._result = cf.Future()
            _when_all(parts, combine, self._result)

    def get(self, timeout: float | None = None) -> R:
        """Wait for the result; raise the call's error, or `TimeoutError` after `timeout` s."""
        try:
            return self._result.result(timeout)
        except cf.TimeoutError:
            if self._result.done():
                raise
            raise TimeoutError(f"{self._label} did not finish within {timeout} s") from None

    def __await__(self) -> Generator[Any, None, R]:
        return asyncio.wrap_future(self._result).__await__()

    def done(self) -> bool:
        return self._result.done()

    def cancel(self) -> None:
        """Cancel what has not run: queued calls are dropped, sent ones cancelled in Ray."""
        if self._cancel is not None:
            self._cancel()

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
        by_future = {id(p.future): p for p in self._parts}
        for future in cf.as_completed([p.future for p in self._parts], timeout):
            part = by_future[id(future)]
            value = future.result()
            assert part.point is not None
            yield part.point, value

    @overload
    def __aiter__(self: MeshFuture[ValueMesh[V]]) -> AsyncIterator[tuple[Point, V]]: ...
    @overload
    def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]: ...
    async def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]:
        async def one(part: Part) -> tuple[Point, Any]:
            value = await asyncio.wrap_future(part.future)
            assert part.point is not None
            return part.point, value

        for next_done in asyncio.as_completed([one(p) for p in self._parts]):
            yield await next_done

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"MeshFuture({self._label}, {state})"


def _when_all(parts: Sequence[Part], combine: Callable[[list[Any]], R], out: cf.Future[R]) -> None:
    """Resolve `out` with `combine(values)` once every part is done, or with the first error."""
    finished = itertools.count(1)  # next() is atomic under the GIL: no lock on completion threads
    total = len(parts)
    if total == 0:
        out.set_result(combine([]))
        return

    def on_part_done(future: cf.Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            if not out.done():
                try:
                    out.set_exception(error)
                except cf.InvalidStateError:  # another part failed first
                    pass
        if next(finished) == total and not out.done():
            try:
                out.set_result(combine([p.future.result() for p in parts]))
            except cf.InvalidStateError:
                pass
            except Exception as err:  # the dispatch's collect failed
                out.set_exception(err)

    for part in parts:
        part.future.add_done_callback(on_part_done)
