"""Actor classes for the hedging and holding tests: calls that count their runs, wait on the
first run only, or run slower on one rank."""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from workers import Worker

import actormesh as am


@ray.remote(num_cpus=0)
class Gate:
    """Numbers the calls that reach it: the first caller gets 0."""

    def __init__(self) -> None:
        self._next = 0

    def claim(self) -> int:
        claimed, self._next = self._next, self._next + 1
        return claimed


class Hedged(Worker):
    """A synchronous actor whose first run of `first_waits` (across the mesh) waits."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    @am.method
    def first_waits(self, gate: Any, sig: Any) -> int:
        """Waits for `sig` if it is the first run of a call across the mesh; returns the rank."""
        self.runs += 1
        if ray.get(gate.claim.remote()) == 0:
            ray.get(sig.wait.remote())
        return am.current_rank().rank

    @am.method
    def run_count(self) -> int:
        return self.runs


@ray.remote(num_cpus=0.1, max_concurrency=2)
class Threaded:
    """A Ray actor (for `from_actors`) that runs two calls at once: a third waits in it."""

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.runs = 0
        self._lock = threading.Lock()

    def first_waits(self, gate: Any, sig: Any) -> int:
        with self._lock:
            self.runs += 1
        if ray.get(gate.claim.remote()) == 0:
            ray.get(sig.wait.remote())
        return self.tag

    def hog(self, sig: Any) -> None:
        ray.get(sig.wait.remote())

    def run_count(self) -> int:
        return self.runs


class Paced(Worker):
    """`work` takes `seconds`, `slowdown` times longer on rank `slow_rank`."""

    def __init__(self, slow_rank: int, slowdown: float) -> None:
        super().__init__()
        self.factor = slowdown if am.current_rank().rank == slow_rank else 1.0

    @am.method
    def work(self, seconds: float) -> int:
        time.sleep(seconds * self.factor)
        return am.current_rank().rank


class SlowStart(Worker):
    """An actor whose `__init__` takes a second."""

    def __init__(self) -> None:
        time.sleep(1.0)
        super().__init__()
