"""`least_loaded`, `pull` and `sed` in pure Python with the native core's own algorithm.

`benchmarks.reference` is the readable twin of the native scheduler: it finds the least loaded
actor by scanning. The native core keeps an indexed heap of the eligible actors instead
(csrc/indexed_heap.hpp, csrc/policy_least_loaded.hpp, csrc/policy_sed.hpp): O(log N) per load
change, O(1) per pick. Comparing a C++ heap with a Python scan would credit the language with
what the algorithm does, so the decision-cost benchmark compares heap with heap, using this
module, and keeps the scan only as an extra line.

It covers what that benchmark drives: one group (all actors), `submit` and `complete`, a FIFO
queue when every actor is full, the same EWMA and prior as the native core, and the same ties
(fewest in flight, then lowest rank; for sed the least expected delay, then fewer in flight,
then lowest rank), and the same staleness (an actor not sent a task while the mesh was sent
STALE_TASKS_PER_ACTOR per actor has its estimate replaced by its next sample). For those it
makes the native core's decisions, call for call.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Generic, TypeVar

from .reference import STALE_TASKS_PER_ACTOR, Decision

K = TypeVar("K")
POLICIES = ("least_loaded", "pull", "sed")


class IndexedHeap(Generic[K]):
    """A binary min-heap over actor positions ordered by (key, position), keys changed in place."""

    def __init__(self, size: int) -> None:
        self._heap: list[tuple[K, int]] = []
        self._where = [-1] * size  # position -> slot in the heap, -1 when absent

    def __bool__(self) -> bool:
        return bool(self._heap)

    def top(self) -> tuple[K, int]:
        return self._heap[0]

    def set(self, pos: int, key: K) -> None:
        """Inserts `pos` with `key`, or changes its key."""
        slot = self._where[pos]
        entry = (key, pos)
        if slot < 0:
            self._heap.append(entry)
            self._sift_up(len(self._heap) - 1, entry)
        elif entry < self._heap[slot]:
            self._sift_up(slot, entry)
        else:
            self._sift_down(slot, entry)

    def erase(self, pos: int) -> None:
        slot = self._where[pos]
        if slot < 0:
            return
        self._where[pos] = -1
        last = self._heap.pop()
        if slot == len(self._heap):
            return
        if slot > 0 and last < self._heap[(slot - 1) // 2]:
            self._sift_up(slot, last)
        else:
            self._sift_down(slot, last)

    def _sift_up(self, slot: int, entry: tuple[K, int]) -> None:
        heap, where = self._heap, self._where
        while slot > 0:
            parent = (slot - 1) // 2
            if not entry < heap[parent]:
                break
            heap[slot] = heap[parent]
            where[heap[slot][1]] = slot
            slot = parent
        heap[slot] = entry
        where[entry[1]] = slot

    def _sift_down(self, slot: int, entry: tuple[K, int]) -> None:
        heap, where = self._heap, self._where
        n = len(heap)
        while True:
            child = 2 * slot + 1
            if child >= n:
                break
            if child + 1 < n and heap[child + 1] < heap[child]:
                child += 1
            if not heap[child] < entry:
                break
            heap[slot] = heap[child]
            where[heap[slot][1]] = slot
            slot = child
        heap[slot] = entry
        where[entry[1]] = slot


class Scheduler:
    """The subset of `actormesh._native.Scheduler` that the decision-cost loop uses."""

    def __init__(self, num_actors: int, policy: str = "least_loaded", *, max_in_flight: int = 0,
                 seed: int = 0, ewma_alpha: float = 0.2, prior_s: float = 0.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: the heap twin has {', '.join(POLICIES)}")
        self.num_actors = num_actors
        self.policy = policy
        self.max_in_flight = 1 if policy == "pull" and max_in_flight == 0 else max_in_flight
        self._alpha = ewma_alpha
        self._prior_s = prior_s
        self._in_flight = [0] * num_actors
        self._ewma: list[float | None] = [None] * num_actors
        self._last_end = [-math.inf] * num_actors
        self._fresh = [True] * num_actors  # the next sample may include start-up
        self._stale = [False] * num_actors  # the next sample replaces the estimate
        self._last_task = [0] * num_actors  # when each was last sent a task, in tasks sent
        self._tasks_sent = 0
        self._ewma_sum = 0.0
        self._measured = 0
        self._queue: deque[int] = deque()
        self._next_ticket = 1
        # sed keeps measured and unmeasured actors apart: all unmeasured ones share the prior,
        # so their order is their in_flight order whatever the prior is.
        self._heap: IndexedHeap[tuple[float, int]] = IndexedHeap(num_actors)
        self._unmeasured: IndexedHeap[int] = IndexedHeap(num_actors)
        self._loads: IndexedHeap[int] = IndexedHeap(num_actors)
        for actor in range(num_actors):
            self._update(actor)

    def submit(self, group: int, affinity: int | None = None) -> Decision:
        if group != 0 or affinity is not None:
            raise ValueError("the heap twin has one group (0) and no affinity")
        ticket = self._next_ticket
        self._next_ticket += 1
        actor = self._pick()
        if actor < 0:
            self._queue.append(ticket)
            return Decision(ticket, -1)
        self._add(actor, +1)
        return Decision(ticket, actor)

    def complete(self, actor: int, started_s: float, ended_s: float,
                 failed: int) -> list[Decision]:
        """Ends a call that succeeded (`failed` 0): the penalty of a failed call is the readable
        twin's (`benchmarks.reference`), not covered here."""
        if failed != 0:
            raise ValueError(f"failed={failed!r}: the heap twin covers calls that succeeded")
        if self._in_flight[actor] == 0:
            raise RuntimeError(f"complete(actor={actor}): no call in flight on actor {actor}")
        self._record(actor, started_s, ended_s)
        self._add(actor, -1)
        dispatched = []
        while self._queue:
            chosen = self._pick()
            if chosen < 0:
                break
            self._add(chosen, +1)
            dispatched.append(Decision(self._queue.popleft(), chosen))
        return dispatched

    def in_flight(self) -> list[int]:
        return list(self._in_flight)

    def _pick(self) -> int:
        if self.policy != "sed":
            return self._loads.top()[1] if self._loads else -1
        if not self._unmeasured:
            return self._heap.top()[1] if self._heap else -1
        if not self._heap:
            return self._unmeasured.top()[1]
        prior = self._prior_s if self._prior_s > 0 else self._mean_ewma_or(1.0)
        (m_key, m_pos), (u_in_flight, u_pos) = self._heap.top(), self._unmeasured.top()
        return m_pos if (m_key, m_pos) < (((u_in_flight + 1) * prior, u_in_flight), u_pos) else u_pos

    def _add(self, actor: int, delta: int) -> None:
        self._in_flight[actor] += delta
        if delta > 0:  # a task sent (this twin sends one call per task)
            passed_over = self._tasks_sent - self._last_task[actor]
            if passed_over >= STALE_TASKS_PER_ACTOR * self.num_actors:
                self._stale[actor] = True
            self._tasks_sent += 1
            self._last_task[actor] = self._tasks_sent
        self._update(actor)

    def _update(self, actor: int) -> None:
        """Re-key `actor` in the heaps, or take it out while it has no free slot."""
        n = self._in_flight[actor]
        if self.max_in_flight and n >= self.max_in_flight:
            self._loads.erase(actor)
            self._heap.erase(actor)
            self._unmeasured.erase(actor)
        elif self.policy != "sed":
            self._loads.set(actor, n)
        elif (ewma := self._ewma[actor]) is None:
            self._unmeasured.set(actor, n)
        else:
            self._unmeasured.erase(actor)
            self._heap.set(actor, ((n + 1) * ewma, n))

    def _record(self, actor: int, started_s: float, ended_s: float) -> None:
        """The native core's EWMA: the first sample moves the prior like any later one; the
        first sample of an incarnation (start-up) may lower an estimate, never raise or make
        one."""
        sample = ended_s - max(started_s, self._last_end[actor])
        self._last_end[actor] = max(self._last_end[actor], ended_s)
        if sample < 0:
            return
        startup, self._fresh[actor] = self._fresh[actor], False
        stale = self._stale[actor] and not startup
        if not startup:
            self._stale[actor] = False
        old = self._ewma[actor]
        if old is None:
            if startup:
                return
            prior = self._prior_s if self._prior_s > 0 else self._mean_ewma_or(sample)
            self._ewma[actor] = prior + self._alpha * (sample - prior)
            self._ewma_sum += self._ewma[actor] or 0.0
            self._measured += 1
        elif stale:
            self._ewma[actor] = sample
            self._ewma_sum += sample - old
        elif not startup or sample < old:
            new = old + self._alpha * (sample - old)
            self._ewma[actor] = new
            self._ewma_sum += new - old

    def _mean_ewma_or(self, fallback: float) -> float:
        return self._ewma_sum / self._measured if self._measured else fallback
