"""The balancing scenarios: one mesh of actors, and who gets each call.

A scenario is a workload (service-time distribution, arrival pattern, slow or killed actors) plus
the metrics it is judged on (the first decides who won it; see `report.stats.METRICS`). Every
policy of the library plays it through its own mesh, beside the baselines (random choice, raw
round robin, `ray.util.ActorPool`) and the default's A/A twin, on the fleet's shared actors
(`benchmarks.harness.cluster`); `benchmarks.harness.runner` plays the repeats.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from benchmarks.config import Config
from benchmarks.harness.contenders import FreshMesh
from benchmarks.harness.context import Context
from benchmarks.harness.section import Row
from benchmarks.harness.workloads import Service, burst_arrivals, poisson_arrivals


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str  # "open" (latency), "batch" (makespan), "throughput" (calls/s), "fault"
    service: Service
    method: str = "work"  # the actor method: work (sleep), spin (CPU), noop
    load: float = 0.0  # open-loop: fraction of the mesh's capacity
    burst: int = 0  # open-loop in bursts of this many calls
    calls: int = 0  # batch and throughput: how many calls at once
    slow_rank: int = -1
    slowdown: float = 1.0
    kill_rank: int = -1
    kill_at_s: float = 0.0
    measure_s: float = 0.0
    repeats: int = 0
    # The contenders other than the default and its twin play every n-th repeat only (the
    # library's other policies `Config.others_every` times less often again): where their turns
    # are slow and their ratios far from 1, the A/A control gets the repeats (runner.py).
    baselines_every: int = 1
    metrics: tuple[str, ...] = ()  # judged on these, the first decides; default: by kind
    headline: tuple[Row, ...] = ()  # the rows it gives the headline
    # Why actormesh `random` against `random.choice` does not measure the library's overhead
    # here (empty: it does).
    overhead_note: str = ""
    # Also played by the default through a mesh made anew before each turn (`FreshMesh`).
    fresh: bool = False
    needs_fleet = True  # played on the fleet's shared actors
    pending = ""  # runs in every mode

    def judged_on(self) -> tuple[str, ...]:
        return self.metrics or METRICS[self.kind]

    def columns(self) -> list[tuple[str, str]]:
        """(header, metric key) per column of its table in report.md; `~key`: the range."""
        return COLUMNS[self.kind]

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "service"} | {
            "service": dataclasses.asdict(self.service)}

    def run(self, ctx: Context) -> dict[str, Any]:
        from benchmarks.harness.runner import run_scenario

        assert ctx.fleet is not None, "a balancing scenario is played on the fleet"
        return run_scenario(ctx.fleet, ctx.cfg, self, ctx.progress)

    def slow_ms(self) -> float:
        """A call slower than this is slow: 10× the mean service time (open-loop scenarios)."""
        if self.kind in ("open", "fault") and self.service.mean_s > 0:
            return 10 * self.service.mean_s * 1e3
        return float("nan")

    def slowdowns(self, actors: int) -> list[float]:
        slow = [1.0] * actors
        if 0 <= self.slow_rank < actors:
            slow[self.slow_rank] = self.slowdown
        return slow

    def describe(self, actors: int) -> str:
        """One line: the workload, as report.md and the terminal say it."""
        parts = ["no-op calls" if self.method == "noop" else self.service.describe()]
        if self.kind in ("open", "fault"):
            if self.burst:
                parts.append(f"bursts of {self.burst} calls, {self.load:.0%} load on average")
            else:
                parts.append(f"Poisson arrivals at {self.load:.0%} load")
        else:
            parts.append(f"{self.calls} calls sent at once")
        if self.slow_rank >= 0:
            parts.append(f"rank {self.slow_rank} of {actors} is {self.slowdown:g}× slower")
        if self.kill_rank >= 0:
            parts.append(f"rank {self.kill_rank} killed {self.kill_at_s:g} s into the run "
                         "(Ray restarts it); every contender retries a call whose actor died "
                         "once (actormesh `retries=1`, the baselines Ray's `max_task_retries=1`)")
        return "; ".join(parts)

    def plan(self, cfg: Config, repeat: int,
             overhead_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(send times, service times) for one repeat: the same for every contender.

        Load is relative to the capacity of the actors as measured: each call costs its
        (slowed-down) service time plus `overhead_s`, the per-call cost of a Ray actor call
        measured at start (see `runner.calibrate`).
        """
        digest = hashlib.sha256(f"{self.name}/{repeat}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        if self.kind in ("batch", "throughput"):
            return np.zeros(self.calls), self.service.draw(rng, self.calls)
        capacity = sum(1.0 / (s * self.service.mean_s + overhead_s)
                       for s in self.slowdowns(cfg.actors))
        rate = self.load * capacity
        duration = cfg.warmup_s + (self.measure_s or cfg.measure_s)
        if self.burst:
            times = burst_arrivals(rng, self.burst, self.burst / rate, duration)
        else:
            times = poisson_arrivals(rng, rate, duration)
        return times, self.service.draw(rng, len(times))


def build(cfg: Config) -> list[Scenario]:
    n, m = cfg.actors, cfg.mean_s
    exp = Service("exp", m)
    p99 = (Row("p99_ms"),)
    return [
        Scenario("uniform50", "Uniform load, 50%", "open", exp, load=0.5),
        Scenario("uniform70", "Uniform load, 70%", "open", exp, load=0.7, headline=p99),
        Scenario("uniform90", "Uniform load, 90%", "open", exp, load=0.9, headline=p99),
        Scenario("lognormal", "Heavy tail: lognormal σ=2", "open",
                 Service("lognormal", m, sigma=2.0), load=0.7, headline=p99),
        Scenario("pareto", "Heavy tail: Pareto α=1.5", "open",
                 Service("pareto", m, alpha=1.5), load=0.7),
        # Behind random choice the slow actor's queue grows as long as the run lasts, and with it
        # p99: the fraction of slow calls is the figure that does not depend on the run's length.
        Scenario("straggler", "One actor 20× slower", "open", exp, load=0.5,
                 slow_rank=n // 2, slowdown=20.0, metrics=("slow_frac", "p99_ms"),
                 headline=(Row("slow_frac", also=("p99_ms",)),)),
        Scenario("burst", "Bursts", "open", exp, load=0.5, burst=6 * n, headline=p99),
        Scenario("batch", "Batch: many calls at once", "batch", Service("exp", cfg.batch_mean_s),
                 calls=cfg.batch_calls, repeats=cfg.batch_repeats),
        Scenario("batch_straggler", "Batch with one actor 10× slower", "batch",
                 Service("exp", cfg.batch_mean_s), calls=cfg.batch_calls, slow_rank=n // 2,
                 slowdown=10.0, repeats=cfg.batch_repeats, headline=(Row("makespan_s"),)),
        # Right after the batch with a slow actor: the default's mesh carries what it learnt
        # there, and a mesh made anew before each turn shows what it would do without.
        Scenario("tiny_noop", "Tiny calls: no-op", "throughput", Service("const", 0.0),
                 method="noop", calls=cfg.tiny_calls, repeats=cfg.tiny_repeats,
                 baselines_every=2,
                 headline=(Row("throughput_per_s"), Row("cpu_us_per_call"),
                           Row("throughput_per_s", baseline=FreshMesh.FRESH)),
                 fresh=True),
        Scenario("tiny_100us", "Tiny calls: 100 µs of CPU", "throughput",
                 Service("const", 100e-6), method="spin", calls=cfg.tiny_calls),
        Scenario("killed", "An actor killed mid-run", "fault", exp, load=0.5, kill_rank=1,
                 kill_at_s=cfg.warmup_s + 0.25 * cfg.fault_measure_s,
                 measure_s=cfg.fault_measure_s, repeats=cfg.fault_repeats,
                 headline=(Row("lost_frac"),),
                 overhead_note="the pair retries differently (actormesh re-routes a retried call "
                               "to a live actor, Ray's max_task_retries waits for the restart)"),
    ]


METRICS = {  # what a scenario of each kind is judged on (keys of stats.METRICS); the first decides
    "open": ("p99_ms", "slow_frac"),
    "batch": ("makespan_s",),
    "throughput": ("throughput_per_s", "cpu_us_per_call"),
    "fault": ("lost_frac", "p99_ms"),
}

COLUMNS = {  # (header, metric key) per column of a scenario table; `~key`: the range over repeats
    "open": [("p50 ms", "p50_ms"), ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"),
             ("p99.9 ms", "p99_9_ms"), ("p99 range", "~p99_ms"), ("slow", "slow_frac"),
             ("calls/s", "throughput_per_s"), ("util", "utilisation"),
             ("imbalance", "imbalance"), ("lost", "lost")],
    "batch": [("makespan s", "makespan_s"), ("range", "~makespan_s"),
              ("× bound", "makespan_over_bound"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
              ("util", "utilisation"), ("imbalance", "imbalance"), ("lost", "lost")],
    "throughput": [("calls/s", "throughput_per_s"), ("range", "~throughput_per_s"),
                   ("CPU µs/call", "cpu_us_per_call"), ("p50 ms", "p50_ms"),
                   ("p99 ms", "p99_ms"), ("lost", "lost")],
    "fault": [("failed", "failed"), ("unfinished", "unfinished"), ("lost", "lost_frac"),
              ("recovery s", "recovery_s"), ("rejoin s", "rejoin_s"), ("p50 ms", "p50_ms"),
              ("p99 ms", "p99_ms"), ("slow", "slow_frac"), ("calls/s", "throughput_per_s")],
}
