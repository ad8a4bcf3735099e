"""The scenarios and the sizes each mode runs them at.

A scenario is a workload (service-time distribution, arrival pattern, slow or killed actors) plus
the metrics it is judged on (the first decides who won it; see `stats.METRICS`). `Config` holds
the sizes: `quick` fits in about seven minutes on two cores, `full` is for a bigger machine or an
existing cluster, `smoke` is for the test suite.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from .workloads import Service, burst_arrivals, poisson_arrivals


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str
    actors: int = 8  # per mesh; one mesh per policy
    actor_cpus: float = 0.1
    repeats: int = 3  # the bootstrap intervals resample these: more short runs beat fewer long
    warmup_s: float = 0.2  # calls planned before this are sent but not measured
    measure_s: float = 0.6
    mean_s: float = 0.010  # mean service time of the latency scenarios
    drain_s: float = 1.5  # wait after the last send before unfinished calls count as lost
    batch_drain_s: float = 20.0  # the same for batches and tiny calls, which must all finish
    batch_calls: int = 120
    batch_mean_s: float = 0.010
    tiny_calls: int = 800
    tiny_repeats: int = 7  # tiny_noop, the choose-against-raw headline; tiny_100us runs `repeats`
    fault_measure_s: float = 1.5  # with the drain, long enough for Ray to restart the actor
    sim_actors: int = 4096
    sim_calls: int = 100_000
    sim_ref_actors: int = 64
    sim_ref_calls: int = 20_000
    dc_sizes: tuple[int, ...] = (16, 256, 4096)
    dc_decisions: int = 100_000
    dc_budget_s: float = 0.1
    calibration_rounds: int = 2
    # Scenarios left out unless named by --only (quick: the time goes to repeats and the side
    # scenarios instead; uniform load at 50%, a second heavy tail and CPU-bound tiny calls say
    # least about the balancer).
    skip: tuple[str, ...] = ("uniform50", "pareto", "tiny_100us")
    # The simulation against queueing theory (benchmarks/theory.py): loads, and per policy the
    # simulated actors and the measured span in mean service times (after the warm-up).
    theory_loads: tuple[float, ...] = (0.7, 0.9, 0.95)
    theory_random: tuple[int, float] = (16, 6000.0)
    theory_pow2: tuple[int, float] = (512, 200.0)


QUICK = Config("quick")
FULL = Config(
    "full", actors=16, repeats=3, warmup_s=1.0, measure_s=8.0, drain_s=10.0, batch_drain_s=60.0,
    batch_calls=2000,
    tiny_calls=10_000, tiny_repeats=9, fault_measure_s=8.0, sim_calls=1_000_000,
    sim_ref_actors=256, sim_ref_calls=100_000, dc_sizes=(16, 64, 256, 1024, 4096),
    dc_decisions=1_000_000, dc_budget_s=1.0, theory_random=(64, 20000.0),
    theory_pow2=(4096, 400.0), skip=(),
)
SMOKE = Config(
    "smoke", actors=2, repeats=1, warmup_s=0.05, measure_s=0.25, drain_s=1.0, batch_drain_s=5.0,
    batch_calls=20,
    tiny_calls=50, tiny_repeats=1, fault_measure_s=1.0, sim_actors=32, sim_calls=2000,
    sim_ref_actors=8, sim_ref_calls=500, dc_sizes=(16, 64), dc_decisions=2000, dc_budget_s=0.02,
    calibration_rounds=1, theory_random=(8, 200.0), theory_pow2=(64, 20.0),
)
MODES = {c.mode: c for c in (QUICK, FULL, SMOKE)}


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
    metrics: tuple[str, ...] = ()  # judged on these, the first decides; default: by kind
    # Why actormesh `random` against `random.choice` is no A/A control here (empty: it is one);
    # without one, a ratio is a difference when its interval leaves out 1.
    control_note: str = ""

    def judged_on(self) -> tuple[str, ...]:
        return self.metrics or METRICS[self.kind]

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
    return [
        Scenario("uniform50", "Uniform load, 50%", "open", exp, load=0.5),
        Scenario("uniform70", "Uniform load, 70%", "open", exp, load=0.7),
        Scenario("uniform90", "Uniform load, 90%", "open", exp, load=0.9),
        Scenario("lognormal", "Heavy tail: lognormal σ=2", "open",
                 Service("lognormal", m, sigma=2.0), load=0.7),
        Scenario("pareto", "Heavy tail: Pareto α=1.5", "open",
                 Service("pareto", m, alpha=1.5), load=0.7),
        # Behind random choice the slow actor's queue grows as long as the run lasts, and with it
        # p99: the fraction of slow calls is the figure that does not depend on the run's length.
        Scenario("straggler", "One actor 20× slower", "open", exp, load=0.5,
                 slow_rank=n // 2, slowdown=20.0, metrics=("slow_frac", "p99_ms")),
        Scenario("burst", "Bursts", "open", exp, load=0.5, burst=6 * n),
        Scenario("batch", "Batch: many calls at once", "batch", Service("exp", cfg.batch_mean_s),
                 calls=cfg.batch_calls),
        Scenario("batch_straggler", "Batch with one actor 10× slower", "batch",
                 Service("exp", cfg.batch_mean_s), calls=cfg.batch_calls, slow_rank=n // 2,
                 slowdown=10.0),
        Scenario("tiny_noop", "Tiny calls: no-op", "throughput", Service("const", 0.0),
                 method="noop", calls=cfg.tiny_calls, repeats=cfg.tiny_repeats),
        Scenario("tiny_100us", "Tiny calls: 100 µs of CPU", "throughput",
                 Service("const", 100e-6), method="spin", calls=cfg.tiny_calls),
        Scenario("killed", "An actor killed mid-run", "fault", exp, load=0.5, kill_rank=1,
                 kill_at_s=cfg.warmup_s + 0.25 * cfg.fault_measure_s,
                 measure_s=cfg.fault_measure_s,
                 control_note="the pair retries differently (actormesh re-routes a retried call "
                              "to a live actor, Ray's max_task_retries waits for the restart)"),
    ]


METRICS = {  # what a scenario of each kind is judged on (keys of stats.METRICS); the first decides
    "open": ("p99_ms", "slow_frac"),
    "batch": ("makespan_s",),
    "throughput": ("throughput_per_s", "cpu_us_per_call"),
    "fault": ("lost_frac", "p99_ms"),
}
