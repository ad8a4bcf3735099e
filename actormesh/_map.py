"""`MeshMap`: what `mesh.methods.f.map(items)` returns, an iterator over its results."""

from __future__ import annotations

import asyncio
import queue
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

from typing_extensions import Self

from ._future import MeshFuture

R = TypeVar("R")


class MeshMap(Generic[R]):
    """The results of `mesh.methods.f.map(items)`, streamed: an iterator, as Python's `map`
    returns one (`next(it)`, `for`), or an async iterator (`async for`), used once either way.

    At most `window()` calls are outstanding (sent, waiting for a slot, or done but not yet
    yielded); the items are read as calls are made. Dropping the iterator before its end, or
    `close()`, cancels the calls not sent yet.
    """

    __slots__ = ("_call", "_items", "_ordered", "_window", "_results", "_async")

    def __init__(self, call: Callable[[Any], MeshFuture[R]], items: Iterator[Any],
                 ordered: bool, window: Callable[[], int]) -> None:
        self._call = call
        self._items = items
        self._ordered = ordered
        self._window = window
        self._results: Generator[R, None, None] | None = None
        self._async = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> R:
        if self._results is None:
            if self._async:
                raise RuntimeError("this map's results are being read with `async for`")
            self._results = self._stream()
        return next(self._results)

    def close(self) -> None:
        """Stop: the calls not sent yet are cancelled, the others run to their end."""
        if self._results is None:
            self._results = self._stream()
        self._results.close()

    def _fill(self, outstanding: int, on_sent: Callable[[MeshFuture[R]], None]) -> int:
        """Send calls for the next items until `window()` are outstanding; how many are."""
        window = self._window()
        while outstanding < window:
            try:
                item = next(self._items)
            except StopIteration:
                break
            on_sent(self._call(item))
            outstanding += 1
        return outstanding

    def _stream(self) -> Generator[R, None, None]:
        pending: deque[MeshFuture[R]] = deque()
        finished: queue.SimpleQueue[MeshFuture[R]] = queue.SimpleQueue()

        def sent(future: MeshFuture[R]) -> None:
            pending.append(future)
            if not self._ordered:
                future._future.add_done_callback(lambda _: finished.put(future))

        try:
            while self._fill(len(pending), sent):
                if self._ordered:
                    future = pending.popleft()
                else:
                    future = finished.get()
                    pending.remove(future)
                yield future.get()
        finally:  # left early (break, an error, close): what is not sent yet never will be
            for future in pending:
                future.cancel()

    def __aiter__(self) -> AsyncIterator[R]:
        if self._results is not None or self._async:
            raise RuntimeError("this map's results are being read already")
        self._async = True
        return self._stream_async()

    async def _stream_async(self) -> AsyncIterator[R]:
        loop = asyncio.get_running_loop()
        pending: deque[MeshFuture[R]] = deque()
        finished: asyncio.Queue[MeshFuture[R]] = asyncio.Queue()

        def sent(future: MeshFuture[R]) -> None:
            pending.append(future)
            if not self._ordered:
                future._future.add_done_callback(
                    lambda _: loop.call_soon_threadsafe(finished.put_nowait, future))

        try:
            while self._fill(len(pending), sent):
                if self._ordered:
                    future = pending.popleft()
                else:
                    future = await finished.get()
                    pending.remove(future)
                yield await future
        finally:
            for future in pending:
                future.cancel()
