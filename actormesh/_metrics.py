"""A mesh's metrics: counted in plain Python on the call path, exported through Ray's metrics.

Ray's `ray.util.metrics` cost ~8 µs per record on 2 cores (measured here), more than a tiny
call's whole share of the driver's CPU. So the call path only bumps counters of its own (a dict
item, a bucket of a histogram) and `MeshMetrics` hands the totals to Ray every `FLUSH_S` from the
library's loop thread, where it also reads the gauges from the native scheduler. Ejections
happen in the scheduler, which counts them per actor and calls back after the submit or
complete that ejected or readmitted one; the count and the log line follow on the loop thread:

    actormesh_calls{mesh, method, outcome}   counter: ok, error, cancelled, timeout, lost
    actormesh_call_seconds{mesh, method}     histogram of call durations
    actormesh_batch_calls{mesh, method}      histogram: calls per Ray task
    actormesh_in_flight{mesh}, actormesh_queued{mesh}   gauges
    actormesh_actor_events{mesh, event}      counter: died, restarted, ejected, readmitted

Tags stay few (mesh name, method, outcome or event; never a call). Ray's agent exports them to
Prometheus (`ray_actormesh_calls_total`, ...) and the dashboard when Ray's `default` extra is
installed (`pip install actormesh[metrics]`). A histogram gets every call of a flush interval
up to `SAMPLE` calls per method; beyond that a sample in the same proportions per bucket (the
counter keeps the exact count). `stats()` returns the same figures as a snapshot.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from . import _loop, _native, _ray

log = logging.getLogger("actormesh")

FLUSH_S = 2.0  # how often the counts go to Ray (which exports every few seconds itself)
SAMPLE = 256  # observations per method and flush, at most, given to a Ray histogram

OUTCOMES = ("ok", "error", "cancelled", "timeout", "lost")
EVENTS = ("died", "restarted", "ejected", "readmitted")
SECONDS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
BATCH_CALLS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Buckets:
    """A histogram kept in plain Python: counts per bucket of `bounds` (the last one past the
    top bound) and their sum, cumulative; `exported` what Ray has been given."""

    __slots__ = ("bounds", "counts", "total", "exported")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.exported = [0] * (len(bounds) + 1)

    def add(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times

    def unexported(self) -> list[tuple[float, int]]:
        """(a value inside the bucket, how many observations to give Ray) for each bucket that
        grew since the last export, scaled down to `SAMPLE` in all; marks them exported."""
        grown = [(i, c - e) for i, (c, e) in enumerate(zip(self.counts, self.exported)) if c > e]
        self.exported = list(self.counts)
        new = sum(n for _, n in grown)
        scale = min(1.0, SAMPLE / new) if new else 1.0
        return [(self._inside(i), max(1, round(n * scale))) for i, n in grown]

    def _inside(self, i: int) -> float:
        bounds = self.bounds
        if i == 0:
            return bounds[0] / 2
        if i == len(bounds):
            return bounds[-1] * 2
        return math.sqrt(bounds[i - 1] * bounds[i])

    def snapshot(self) -> dict[str, Any]:
        count = sum(self.counts)
        return {"count": count, "sum": self.total,
                "buckets": dict(zip([*map(str, self.bounds), "+Inf"], self.counts))}


class MeshMetrics:
    """The metrics of one mesh (one router): the call path reports each task's end (its calls'
    outcomes); the failures' room each actor event; a timer on the loop thread exports them."""

    def __init__(self, mesh_name: str, scheduler: _native.Scheduler | None = None) -> None:
        self.mesh_name = mesh_name
        self._scheduler = scheduler
        self._calls: dict[tuple[str, str], int] = {}
        self._seconds: dict[str, _Buckets] = {}
        self._batches: dict[str, _Buckets] = {}
        self._events = dict.fromkeys(EVENTS, 0)
        self._exported: dict[tuple[str, str], int] = {}
        self._exported_events = dict.fromkeys(EVENTS, 0)
        self._ejections: list[tuple[int, int]] = []  # the scheduler's counts, as last noted
        # flush against flush (the timer, close) and the notes of ejections; never the call path
        self._lock = threading.Lock()
        self._closed = False
        self._timer = _loop.call_later(FLUSH_S, _flush_weakly, weakref.ref(self))
        if scheduler is not None:
            scheduler.on_ejections(functools.partial(_ejections_told, weakref.ref(self)))

    # -- the call path: a few dict operations, no lock, no call into Ray ----------------------
    def call_ended(self, method: str, outcome: str, seconds: float, times: int = 1) -> None:
        """`times` calls of `method` ended with `outcome` (one of OUTCOMES) after `seconds`."""
        calls = self._calls
        key = (method, outcome)
        calls[key] = calls.get(key, 0) + times
        buckets = self._seconds.get(method)
        if buckets is None:
            buckets = self._seconds.setdefault(method, _Buckets(SECONDS))
        buckets.add(seconds, times)

    def task_ended(self, calls: Sequence[tuple[str, str]], seconds: float) -> None:
        """A Ray task ended after `seconds` (from its send): each of its calls' method and
        outcome (one of OUTCOMES); the task counts as one of its first method's."""
        if not calls:
            return
        first, count = calls[0], len(calls)
        if calls.count(first) == count:  # the usual task: counted once, not call by call
            self.call_ended(*first, seconds, count)
        else:
            for method, outcome in calls:
                self.call_ended(method, outcome, seconds)
        buckets = self._batches.get(first[0])
        if buckets is None:
            buckets = self._batches.setdefault(first[0], _Buckets(BATCH_CALLS))
        buckets.add(count)

    def actor_event(self, event: str) -> None:
        """An actor of the mesh died, restarted, was ejected or readmitted."""
        if event not in self._events:
            raise ValueError(f"actor event {event!r}: one of {', '.join(EVENTS)}")
        self._events[event] += 1

    # -- reading ------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The mesh's figures now: calls per method and outcome, call durations and calls per
        task per method (count, sum, buckets), calls in flight and queued, actor events."""
        self.note_ejections()
        calls: dict[str, dict[str, int]] = {}
        for (method, outcome), count in list(self._calls.items()):
            calls.setdefault(method, dict.fromkeys(OUTCOMES, 0))[outcome] = count
        in_flight, queued = self._gauges()
        return {
            "mesh": self.mesh_name,
            "calls": calls,
            "call_seconds": {m: b.snapshot() for m, b in list(self._seconds.items())},
            "batch_calls": {m: b.snapshot() for m, b in list(self._batches.items())},
            "in_flight": in_flight,
            "queued": queued,
            "actor_events": dict(self._events),
        }

    def _gauges(self) -> tuple[int, int]:
        scheduler = self._scheduler
        if scheduler is None:
            return 0, 0
        return sum(scheduler.in_flight()), scheduler.queued()

    def note_ejections(self) -> None:
        """Count and log the ejections and readmissions the scheduler made since the last note."""
        with self._lock:
            self._note_ejections()

    def _note_ejections(self) -> None:
        """The scheduler counts each actor's ejections and readmissions, and its counts only
        grow: none is missed, however soon an actor comes back."""
        if self._scheduler is None:
            return
        now = self._scheduler.ejections()
        before = self._ejections or [(0, 0)] * len(now)
        for rank, (was, is_) in enumerate(zip(before, now)):
            # An actor's events alternate, an ejection first: its n-th is an ejection if n is odd.
            for n in range(sum(was) + 1, sum(is_) + 1):
                if n % 2:
                    self._events["ejected"] += 1
                    log.warning("actormesh: %s: rank %d was ejected: %d or more of its calls "
                                "failed in a row, so it is passed over while another actor can "
                                "take them", self.mesh_name, rank, self._scheduler.eject_after)
                else:
                    self._events["readmitted"] += 1
                    log.info("actormesh: %s: rank %d is routed to again after an ejection",
                             self.mesh_name, rank)
        self._ejections = now

    # -- export -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Give Ray what was counted since the last flush (on the loop thread)."""
        with self._lock:
            if self._closed or not _ray.connected():  # after ray.shutdown(): nowhere to go
                return
            self._export()

    def _export(self) -> None:
        metrics = _exporters()
        mesh = self.mesh_name
        self._note_ejections()
        for key, count in list(self._calls.items()):
            grown = count - self._exported.get(key, 0)
            if grown:
                self._exported[key] = count
                metrics.calls.inc(grown, {"mesh": mesh, "method": key[0], "outcome": key[1]})
        for histogram, table in ((metrics.call_seconds, self._seconds),
                                 (metrics.batch_calls, self._batches)):
            for method, buckets in list(table.items()):
                tags = {"mesh": mesh, "method": method}
                for value, times in buckets.unexported():
                    for _ in range(times):
                        histogram.observe(value, tags)
        for event, count in self._events.items():
            grown = count - self._exported_events[event]
            if grown:
                self._exported_events[event] = count
                metrics.actor_events.inc(grown, {"mesh": mesh, "event": event})
        in_flight, queued = self._gauges()
        metrics.in_flight.set(in_flight, {"mesh": mesh})
        metrics.queued.set(queued, {"mesh": mesh})

    def close(self) -> None:
        """Export what is left, zero the gauges, and stop the timer."""
        with self._lock:
            if self._closed:
                return
            self._timer.cancel()
            self._closed = True
            if not _ray.connected():
                return
            try:
                self._export()
                metrics = _exporters()
                metrics.in_flight.set(0, {"mesh": self.mesh_name})
                metrics.queued.set(0, {"mesh": self.mesh_name})
            except Exception as err:  # noqa: BLE001 - Ray is gone already (interpreter exit)
                log.debug("actormesh: the last metrics of %s were not exported: %s",
                          self.mesh_name, err)


def _ejections_told(ref: weakref.ref[MeshMetrics]) -> None:
    """The scheduler's callback after a call that ejected or readmitted an actor, on that call's
    thread (Ray's completion thread, for a call's end): it only hands the note to the loop."""
    _loop.post(_note_weakly, ref)


def _note_weakly(ref: weakref.ref[MeshMetrics]) -> None:
    metrics = ref()
    if metrics is not None:
        metrics.note_ejections()


def _flush_weakly(ref: weakref.ref[MeshMetrics]) -> None:
    """The flush timer: holds the metrics weakly, so a dropped mesh's metrics go with it."""
    metrics = ref()
    if metrics is None or metrics._closed:
        return
    try:
        metrics.flush()
    except Exception:  # noqa: BLE001 - Ray shut down: try again later, never raise here
        log.debug("actormesh: exporting the metrics of %s failed", metrics.mesh_name,
                  exc_info=True)
    metrics._timer = _loop.call_later(FLUSH_S, _flush_weakly, ref)


class _RayMetrics:
    """The process's Ray metrics objects, made once (Ray registers each name once)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        self.calls = Counter("actormesh_calls", "Calls through actormesh meshes, by outcome",
                             tag_keys=("mesh", "method", "outcome"))
        self.call_seconds = Histogram("actormesh_call_seconds",
                                      "Duration of a mesh call, from its submission to its end",
                                      boundaries=list(SECONDS), tag_keys=("mesh", "method"))
        self.batch_calls = Histogram("actormesh_batch_calls", "Calls carried by one Ray task",
                                     boundaries=list(BATCH_CALLS), tag_keys=("mesh", "method"))
        self.in_flight = Gauge("actormesh_in_flight", "Calls in flight on the mesh's actors",
                               tag_keys=("mesh",))
        self.queued = Gauge("actormesh_queued", "Calls waiting in the mesh's queue for a slot",
                            tag_keys=("mesh",))
        self.actor_events = Counter("actormesh_actor_events",
                                    "Actor deaths, restarts, ejections and readmissions",
                                    tag_keys=("mesh", "event"))


_made: list[_RayMetrics] = []
_made_lock = threading.Lock()


def _exporters() -> _RayMetrics:
    if not _made:
        with _made_lock:
            if not _made:
                _made.append(_RayMetrics())
    return _made[0]

