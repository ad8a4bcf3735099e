"""The driver: sends a planned sequence of calls through one contender and records what happened.

A run is a plan (for each call: when to send it, relative to the start, and its service time)
played open-loop: a call is sent at its time whether or not earlier calls have finished, so a
slow contender cannot slow its own arrivals down. A batch is the same plan with every call at
time 0. Each call's latency is from just before the send to the moment its result reaches the
driver, measured with `time.perf_counter()`. The driver also records how late it sent each call
against the plan, so a report can say whether the driver itself kept up, and the CPU time the
driver process spent (every thread: actormesh's and Ray's) from the first send to the drain.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness.contenders import Contender


@dataclasses.dataclass
class Run:
    """Everything one contender did in one run, indexed by call token."""

    planned_s: np.ndarray  # planned send time, seconds from start
    duration_s: np.ndarray  # drawn service time (before the actor's slowdown)
    sent: np.ndarray  # perf_counter just before the send
    ended: np.ndarray  # perf_counter when the result arrived; NaN if it never did
    ok: np.ndarray  # bool: a result (not an error)
    rank: np.ndarray  # actor that ran it, -1 unknown
    took_s: np.ndarray  # service time measured inside the actor
    start: float  # perf_counter of planned time 0
    deadline: float  # perf_counter when the driver stopped waiting
    errors: list[str]  # a few error messages, for the report
    events: dict[str, float]  # name -> perf_counter (e.g. "kill")
    cpu_s: float = -1.0  # driver process CPU seconds from the first send to `deadline`

    @property
    def n(self) -> int:
        return len(self.planned_s)


def play(contender: Contender, method: str, planned_s: np.ndarray, duration_s: np.ndarray,
         *, drain_s: float, retries: int = 0, settle_s: float = 30.0,
         events: Sequence[tuple[float, str, Callable[[], Any]]] = ()) -> Run:
    """Send the planned calls through `contender`, then wait up to `drain_s` for the stragglers.

    Calls still out at the drain deadline count as unfinished; the actors skip them (each call
    carries the deadline), and the driver waits up to `settle_s` for them to clear before the
    next run.

    `events` are (time, name, action) run by the driver at their planned time (e.g. killing an
    actor mid-run); their actual times are recorded in `Run.events`.
    """
    n = len(planned_s)
    sent = np.full(n, np.nan)
    ended = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    rank = np.full(n, -1, dtype=np.int64)
    took = np.full(n, np.nan)
    errors: list[str] = []
    finished = itertools.count(1)  # next() is atomic under the GIL
    all_done = threading.Event()
    open_ = [True]

    def on_done(token: int, value: Any, error: BaseException | None) -> None:
        if not open_[0] or (error is None and value[2] < 0):  # closed, or skipped past deadline
            return
        ended[token] = time.perf_counter()
        if error is None:
            ok[token] = True
            rank[token] = value[1]
            took[token] = value[2]
        elif len(errors) < 5:
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
        if next(finished) == n:
            all_done.set()

    horizon = float(planned_s.max()) if n else 0.0
    # The actors' deadline (wall clock) falls just after the driver's (below) in the usual case.
    contender.begin(on_done, deadline=time.time() + 0.002 + horizon + drain_s + 0.1,
                    retries=retries)
    pending_events = sorted(events, key=lambda e: e[0])
    happened: dict[str, float] = {}
    plan = planned_s.tolist()
    durations = duration_s.tolist()
    submit = contender.submit
    clock = time.perf_counter
    cpu_start = time.process_time()
    start = clock() + 0.002
    i = 0
    while i < n or pending_events:
        now = clock() - start
        next_call = plan[i] if i < n else float("inf")
        next_event = pending_events[0][0] if pending_events else float("inf")
        if next_event <= now and next_event <= next_call:
            _, name, action = pending_events.pop(0)
            happened[name] = clock()
            action()
            continue
        if next_call <= now:
            while i < n and plan[i] <= now:  # catch up on every call that is due
                sent[i] = clock()
                submit(i, method, durations[i])
                i += 1
            continue
        contender.wait(min(next_call, next_event) - now)

    deadline = max(clock(), start + horizon) + drain_s
    if n:
        while not all_done.is_set():
            left = deadline - clock()
            if left <= 0:
                break
            if type(contender).wait is Contender.wait:
                all_done.wait(left)
            else:  # a contender that only makes progress while the driver polls it
                contender.wait(min(left, 0.05))
    stop = clock()
    cpu_s = time.process_time() - cpu_start
    open_[0] = False
    settled = contender.settle(timeout=settle_s)
    contender.end()
    if not settled:
        errors.append(f"calls still running {settle_s:g} s after the drain deadline")
    return Run(planned_s, duration_s, sent, ended, ok, rank, took, start, stop, errors, happened,
               cpu_s)
