"""SIMULATED: the native balancer driving a discrete-event queue model, no Ray, any scale.

This machine cannot hold 4096 actors, but the scheduler does not care where its calls go: it
only sees submit and complete. Here a heap of simulated completion times stands in for the
actors. Each simulated actor serves one call at a time in FIFO order from its own queue (what a
synchronous Ray actor does with the calls pushed to it); calls arrive open-loop (Poisson) or all
at once (a batch). The native `Scheduler` makes every decision, fed simulated timestamps, so
latency-aware policies (`sed`) learn service times exactly as they would live. Network delays
and driver overheads are zero: this isolates the policies, it does not predict a cluster.

The same model driven by `benchmarks.reference` (the pure-Python twin of the native core) must
make identical decisions; the report says whether it did, and how much faster the native loop
ran at a size the Python scans can afford.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness.metrics import PERCENTILES, batch_lower_bound, cdf, pct_key
from benchmarks.harness.workloads import Service

SchedulerFactory = Callable[[int, str, int], Any]  # (num_actors, policy, seed) -> scheduler


@dataclasses.dataclass(frozen=True)
class SimScenario:
    name: str
    title: str
    service: Service
    load: float | None  # fraction of total capacity; None: a batch, every call at t = 0
    slow_fraction: float = 0.0  # this share of the actors is `slowdown` times slower
    slowdown: float = 1.0

    def slowdowns(self, n_actors: int) -> list[float]:
        slow = [1.0] * n_actors
        k = max(1, round(self.slow_fraction * n_actors)) if self.slow_fraction else 0
        # Spread the slow actors over the ranks so no tie-breaking order favours them.
        for j in range(k):
            slow[(j * n_actors) // k + (n_actors // (2 * k))] = self.slowdown
        return slow

    def describe(self) -> str:
        what = {"exp": "exponential service", "lognormal": f"lognormal σ={self.service.sigma:g} "
                "service", "pareto": f"Pareto α={self.service.alpha:g} service"}.get(
                    self.service.kind, self.service.kind)
        if self.load is None:
            what = f"all calls at once, {what}"
        else:
            what = f"Poisson arrivals at {self.load:.0%} load, {what}"
        if self.slow_fraction:
            what += f"; {self.slow_fraction:.0%} of actors {self.slowdown:g}× slower"
        return what


def native_factory(num_actors: int, policy: str, seed: int) -> Any:
    from actormesh import _native

    return _native.Scheduler(num_actors, policy, seed=seed)


def reference_factory(num_actors: int, policy: str, seed: int) -> Any:
    from benchmarks import reference

    return reference.Scheduler(num_actors, policy, seed=seed)


def plan(scenario: SimScenario, n_actors: int, calls: int,
         seed: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(arrival times, service times, per-actor slowdowns), all in simulated seconds."""
    rng = np.random.default_rng(seed)
    service = scenario.service.draw(rng, calls)
    slow = scenario.slowdowns(n_actors)
    if scenario.load is None:
        arrivals = np.zeros(calls)
    else:
        capacity = sum(1.0 / s for s in slow) / scenario.service.mean_s  # calls per second
        arrivals = np.cumsum(rng.exponential(1.0 / (scenario.load * capacity), calls))
    return arrivals, service, slow


def simulate(scheduler: Any, arrivals: np.ndarray, service: np.ndarray,
             slow: list[float]) -> np.ndarray:
    """Play the calls through `scheduler`; return each call's end time (simulated seconds)."""
    n_actors = len(slow)
    calls = len(arrivals)
    arr = arrivals.tolist()
    svc = service.tolist()
    end = [0.0] * calls
    sent = [0.0] * calls
    running = [-1] * n_actors
    queues: list[deque[int]] = [deque() for _ in range(n_actors)]
    heap: list[tuple[float, int]] = []
    pending: dict[int, int] = {}
    submit, complete = scheduler.submit, scheduler.complete
    push, pop = heapq.heappush, heapq.heappop

    def dispatch(call: int, actor: int, now: float) -> None:
        sent[call] = now
        if running[actor] < 0:
            running[actor] = call
            push(heap, (now + svc[call] * slow[actor], actor))
        else:
            queues[actor].append(call)

    i = 0
    while i < calls or heap:
        if i < calls and (not heap or arr[i] <= heap[0][0]):
            now = arr[i]
            decision = submit(0)
            if decision.actor >= 0:
                dispatch(i, decision.actor, now)
            else:
                pending[decision.ticket] = i
            i += 1
            continue
        now, actor = pop(heap)
        call = running[actor]
        end[call] = now
        queue = queues[actor]
        if queue:
            nxt = running[actor] = queue.popleft()
            push(heap, (now + svc[nxt] * slow[actor], actor))
        else:
            running[actor] = -1
        for decision in complete(actor, sent[call], now, 0):
            dispatch(pending.pop(decision.ticket), decision.actor, now)
    return np.asarray(end)


def summary(scenario: SimScenario, arrivals: np.ndarray, end: np.ndarray,
            slow: list[float], service: np.ndarray, warmup: float) -> dict[str, Any]:
    """Latency percentiles in units of the mean service time, makespan against its bound."""
    mean = scenario.service.mean_s
    out: dict[str, Any] = {}
    if scenario.load is None:
        makespan = float(end.max())
        bound = batch_lower_bound(service, slow)
        out["makespan_over_bound"] = makespan / bound
        out["makespan_units"] = makespan / mean
        lat = (end - arrivals) / mean
    else:
        skip = int(len(arrivals) * warmup)
        lat = (end[skip:] - arrivals[skip:]) / mean
    for p, v in zip(PERCENTILES, np.percentile(lat, PERCENTILES)):
        out[pct_key(p)] = float(v)
    out["mean"] = float(lat.mean())
    out["cdf"] = cdf(lat)
    return out


def run_policy(factory: SchedulerFactory, policy: str, scenario: SimScenario, n_actors: int,
               calls: int, seed: int, warmup: float = 0.1) -> tuple[dict[str, Any], np.ndarray]:
    arrivals, service, slow = plan(scenario, n_actors, calls, seed)
    scheduler = factory(n_actors, policy, seed)
    t = time.perf_counter()
    end = simulate(scheduler, arrivals, service, slow)
    wall = time.perf_counter() - t
    out = summary(scenario, arrivals, end, slow, service, warmup)
    out["wall_s"] = wall
    out["us_per_call"] = wall / calls * 1e6
    return out, end


def scenarios() -> list[SimScenario]:
    return [
        SimScenario("uniform90", "Exponential, 90% load", Service("exp", 1.0), 0.9),
        SimScenario("lognormal80", "Lognormal σ=2, 80% load", Service("lognormal", 1.0), 0.8),
        SimScenario("stragglers", "1% of actors 10× slower, 70% load", Service("exp", 1.0), 0.7,
                    slow_fraction=0.01, slowdown=10.0),
        SimScenario("batch", "A batch at once, 1% of actors 10× slower", Service("exp", 1.0),
                    None, slow_fraction=0.01, slowdown=10.0),
    ]


NOTE = (
    "**Simulated, not measured on Ray.** A discrete-event queue model (Python heapq) in which "
    "the native `actormesh._native.Scheduler` makes every decision, fed simulated timestamps; "
    "actors serve one call at a time, FIFO, with no network delay or driver overhead. Open-loop "
    "Poisson arrivals, the first 10% of calls discarded as warm-up. It shows how the policies "
    "behave at a scale this machine cannot hold, not what a cluster would measure."
)


def paragraph(scenario: dict[str, Any]) -> str:
    """Who did best in one simulated scenario, and how far random and the default were."""
    key = "p99" if scenario["load"] is not None else "makespan_over_bound"
    words = "p99" if key == "p99" else "makespan ÷ lower bound"
    rows = {r["policy"]: r for r in scenario["policies"]}
    best = min(scenario["policies"], key=lambda r: r[key])
    text = [f"Best: {best['policy']} ({words} {best[key]:.3g})."]
    for name in ("random", "pow2", "sed"):
        if name in rows and name != best["policy"]:
            text.append(f"{name}: {rows[name][key]:.3g} ({rows[name][key] / best[key]:.3g}× the best).")
    return " ".join(text)


def run_all(policies: tuple[str, ...], actors: int, calls: int, ref_actors: int, ref_calls: int,
            progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every policy on every simulated scenario, then native against the Python reference."""
    out: dict[str, Any] = {"note": NOTE, "actors": actors, "calls": calls, "scenarios": []}
    for sc in scenarios():
        rows = []
        for policy in policies:
            progress(f"simulation · {sc.name} · {policy}")
            summary_, _ = run_policy(native_factory, policy, sc, actors, calls, seed=7)
            rows.append({"policy": policy, **summary_})
        out["scenarios"].append({"name": sc.name, "title": sc.title, "load": sc.load,
                                 "description": sc.describe(), "policies": rows})
    ref_rows = []
    sc = scenarios()[0]
    for policy in policies:
        progress(f"simulation · native vs reference · {policy}")
        native, end_native = run_policy(native_factory, policy, sc, ref_actors, ref_calls, seed=7)
        ref, end_ref = run_policy(reference_factory, policy, sc, ref_actors, ref_calls, seed=7)
        ref_rows.append({"policy": policy, "native_us": native["us_per_call"],
                         "reference_us": ref["us_per_call"],
                         "identical": bool(np.array_equal(end_native, end_ref))})
    out["reference"] = {
        "actors": ref_actors, "calls": ref_calls, "rows": ref_rows,
        "note": (f"The same model ({sc.title.lower()}, {ref_actors} actors, {ref_calls:,} calls) "
                 "driven by the pure-Python reference policies of `benchmarks/reference.py`: "
                 "whether every call ended at the same simulated time as with the native core "
                 "(same decisions), and the simulation's wall time per call with each (this "
                 "includes the event loop, so it understates the gap; see Decision cost)."),
    }
    return out
