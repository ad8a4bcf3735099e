"""One daemon thread that runs callbacks at deadlines (call timeouts, restart probes)."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

_lock = threading.Condition()
_heap: list[tuple[float, int, Callable[[], None]]] = []
_order = itertools.count()
_thread: threading.Thread | None = None


def call_later(delay_s: float, fn: Callable[[], None]) -> None:
    """Run `fn()` on the timer thread after `delay_s` seconds."""
    global _thread
    with _lock:
        heapq.heappush(_heap, (time.monotonic() + delay_s, next(_order), fn))
        if _thread is None:
            _thread = threading.Thread(target=_run, name="actormesh-timers", daemon=True)
            _thread.start()
        _lock.notify()


def _run() -> None:
    while True:
        with _lock:
            while not _heap or _heap[0][0] > time.monotonic():
                _lock.wait(None if not _heap else _heap[0][0] - time.monotonic())
            _, _, fn = heapq.heappop(_heap)
        try:
            fn()
        except Exception:  # a failing callback must not stop the other timers
            import traceback

            traceback.print_exc()
