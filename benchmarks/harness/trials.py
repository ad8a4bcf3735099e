"""Plays a closed-loop scenario: each contender a function, timed turn by turn.

The call-path scenarios (and the prepared hedged and several-driver ones) measure what a
driver gets from a fixed piece of work: map N items, send a burst and read it, make K calls one
at a time, finish a batch. A contender is a `Trial`: a function that does one turn and returns
what it measured (`Turn`). One untimed turn of each warms up first (actors, caches, what a
latency-aware policy learns); then every repeat gives each contender one turn, in an order
shuffled per repeat (`turns.order`). Per-call latencies are kept in call order, so the
bootstrap pairs contenders call by call, as for the balancing scenarios.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import metrics, section, turns
from benchmarks.report import stats


@dataclasses.dataclass
class Turn:
    """What one turn of one contender measured."""

    calls: int
    seconds: float  # wall time of the turn
    cpu_s: float  # CPU time of the driver process over the turn (every thread)
    latencies_ms: np.ndarray | None = None  # per call, in call order, when calls were timed
    values: dict[str, float] = dataclasses.field(default_factory=dict)  # further scalars

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "calls": self.calls,
            "seconds": self.seconds,
            "throughput_per_s": self.calls / self.seconds if self.seconds > 0 else math.nan,
            "cpu_us_per_call": self.cpu_s / self.calls * 1e6 if self.calls else math.nan,
            **self.values,
        }
        if self.latencies_ms is not None and len(self.latencies_ms):
            for p, v in zip(metrics.PERCENTILES, np.percentile(self.latencies_ms,
                                                               metrics.PERCENTILES)):
                out[metrics.pct_key(p) + "_ms"] = float(v)
            out["mean_ms"] = float(self.latencies_ms.mean())
        return out

    def sample(self, m: dict[str, Any]) -> stats.RunSample:
        lat = self.latencies_ms if self.latencies_ms is not None else np.empty(0)
        values = {k: float(m[k]) for k, metric in stats.METRICS.items()
                  if metric.kind == "scalar" and isinstance(m.get(k), (int, float))}
        return stats.RunSample(lat, np.zeros(len(lat), dtype=bool), {}, values)


def timed(calls: int, work: Callable[[], object]) -> Turn:
    """Run `work` (which makes `calls` calls and reads every result) as one timed turn."""
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return Turn(calls, time.perf_counter() - wall, time.process_time() - cpu)


@dataclasses.dataclass(frozen=True)
class Trial:
    """A contender: who it is, and one turn of it (given the repeat, -1 for the warm-up, so
    that a scenario can give every contender of a repeat the same plan)."""

    entrant: section.Entrant
    turn: Callable[[int], Turn]


def play(trials: Sequence[Trial], repeats: int, name: str, progress: Callable[[str], None],
         ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[stats.RunSample]]]:
    """A warm-up turn each, then `repeats` turns each, taking turns; per contender the metrics
    of each turn and what the bootstrap keeps of it."""
    runs: dict[str, list[dict[str, Any]]] = {t.entrant.name: [] for t in trials}
    samples: dict[str, list[stats.RunSample]] = {t.entrant.name: [] for t in trials}
    for trial in trials:
        progress(f"{name} · warm-up · {trial.entrant.name}")
        trial.turn(-1)
    for r in range(repeats):
        for trial in turns.order(trials, r, name):
            progress(f"{name} · repeat {r + 1}/{repeats} · {trial.entrant.name}")
            turn = trial.turn(r)
            m = turn.metrics()
            runs[trial.entrant.name].append(m)
            samples[trial.entrant.name].append(turn.sample(m))
    return runs, samples
