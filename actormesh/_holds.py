"""Holds: calls the scheduler keeps back from a straggler, and the loop-thread timer that ends
them (the `adaptive` policy holds a call rather than send it to an actor measured far slower
than the others, for as long as that actor would take to serve it).

The router asks `watch()` after anything that may begin a hold (a submit that queued, a freed
slot, a drain); the timer fires on the loop thread at the scheduler's earliest hold deadline and
hands the calls whose hold is over to the router's `send_drained`, which arms it again for the
holds left.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from . import _loop, _native

SendDrained = Callable[[Callable[[int], list[_native.Decision]], int], None]


class Holds:
    """The hold timer of one mesh's scheduler (armed from any thread, fired on the loop)."""

    def __init__(self, scheduler: _native.Scheduler, send_drained: SendDrained) -> None:
        self._scheduler = scheduler
        self._send_drained = send_drained
        self.active = scheduler.may_hold  # a policy that never holds needs no timer
        self.timer_at = math.inf  # when the armed timer fires (read without the lock: a hint)
        self._lock = threading.Lock()
        self.closed = False

    def watch(self) -> None:
        """Arm the timer for the scheduler's earliest hold, unless one that fires no later is
        armed already."""
        deadline = self._scheduler.hold_deadline_s()
        if deadline >= self.timer_at:
            return
        with self._lock:
            if deadline >= self.timer_at:
                return
            self.timer_at = deadline
        _loop.call_later(max(deadline - time.perf_counter(), 0.0), self._expire)

    def _expire(self) -> None:
        """The calls held back for as long as it takes to serve one go to their actor."""
        with self._lock:
            self.timer_at = math.inf
        if self.closed:
            return
        scheduler = self._scheduler
        self._send_drained(lambda _: scheduler.expire_holds(time.perf_counter()), -1)
