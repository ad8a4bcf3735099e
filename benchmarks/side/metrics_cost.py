"""What a mesh's metrics cost on tiny calls, against the goal of 1% of their throughput.

The call path pays `MeshMetrics.task_ended` per Ray task, a few plain Python counters per call;
the export to Ray runs every 2 s on the library's loop thread. Measured, on real
actors: tiny no-op calls through `map` (they ride together, the fastest the library sends
calls), with the mesh's metrics on and off in turns within each repeat, on the same mesh.
"Off" is the router without its metrics (`router.metrics = None`: the call path then counts
nothing, though it still lists each call's outcome for them; the export timer still runs, with
nothing new to export), so the ratio leaves that list out of the cost. The metrics on twice, in
the same turns, is the A/A control. Beside it, without Ray: the hooks alone, ns of CPU per
call, and one export's cost.

`run(quick, out_dir)` is the side scenario `python -m benchmarks` calls
(benchmarks/side/__init__.py).

    python -m benchmarks.side.metrics_cost [--quick] [--repeats N] [--calls N] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

import actormesh as am
from actormesh._metrics import MeshMetrics
from benchmarks.harness import turns
from benchmarks.harness.workloads import Echo
from benchmarks.report import stats

ON, ON_AA, OFF = "metrics on", "metrics on (A/A)", "metrics off"
GOAL = 0.99  # throughput with the metrics on ÷ off, at least


@dataclasses.dataclass(frozen=True)
class Sizes:
    actors: int
    calls: int  # no-op calls per `map`, one turn
    repeats: int  # turns per contender


QUICK = Sizes(actors=4, calls=3000, repeats=40)
FULL = Sizes(actors=4, calls=6000, repeats=60)


def say(text: str) -> None:
    print(text, flush=True)


def hooks_ns(calls: int, per_task: int = 16) -> float:
    """ns of CPU per call of what the call path reports, in tasks of `per_task` calls, on a
    metrics object of its own (this thread's CPU time: a shared machine's other work does not
    count). The list of outcomes is made here as the call path makes it."""
    metrics = MeshMetrics("metrics-cost")
    try:
        start = time.thread_time_ns()
        for _ in range(calls // per_task):
            metrics.task_ended([("f", "ok") for _ in range(per_task)], 0.0002)
        return (time.thread_time_ns() - start) / (calls // per_task * per_task)
    finally:
        metrics.close()


def flush_ms(calls: int) -> float:
    """ms of one export to Ray after `calls` calls of one method."""
    metrics = MeshMetrics("metrics-cost-flush")
    try:
        for _ in range(calls):
            metrics.call_ended("f", "ok", 0.0002)
        start = time.perf_counter()
        metrics.flush()
        return (time.perf_counter() - start) * 1e3
    finally:
        metrics.close()


@contextlib.contextmanager
def metrics_off(mesh: am.ActorMesh[Any]) -> Iterator[None]:
    """The mesh's call path without its metrics while inside."""
    router = mesh._root.router
    if not hasattr(router, "metrics"):
        raise RuntimeError("Router has no `metrics` attribute any more: update metrics_off")
    kept = router.metrics
    router.metrics = None
    try:
        yield
    finally:
        router.metrics = kept


def mapped(mesh: am.ActorMesh[Echo], calls: int) -> tuple[float, float]:
    """calls/s and driver CPU µs per call of one `map` over `calls` no-op items."""
    items = range(calls)
    wall, cpu = time.perf_counter(), time.process_time()
    out = list(mesh.methods.f.map(items))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if out != list(items):
        raise AssertionError("map returned other values than its items")
    return calls / wall, cpu / calls * 1e6


def measure(mesh: am.ActorMesh[Echo], sizes: Sizes) -> tuple[dict[str, list[float]],
                                                              dict[str, list[float]]]:
    """Throughput and driver CPU per call of each contender, per repeat, in turns."""
    runs: dict[str, Callable[[], tuple[float, float]]] = {
        ON: lambda: mapped(mesh, sizes.calls),
        ON_AA: lambda: mapped(mesh, sizes.calls),
        OFF: lambda: _off(mesh, sizes.calls),
    }
    for run_one in runs.values():
        run_one()  # warm: actors measured, batches sized
    rates: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(sizes.repeats):
        for name in turns.order(list(runs), r, "metrics_cost"):
            rate, cpu = runs[name]()
            rates[name].append(rate)
            cpus[name].append(cpu)
        if (r + 1) % 5 == 0 or r + 1 == sizes.repeats:
            say(f"  repeat {r + 1}/{sizes.repeats}: " + " · ".join(
                f"{n} {statistics.median(v):,.0f} calls/s" for n, v in rates.items()))
    return rates, cpus


def _off(mesh: am.ActorMesh[Echo], calls: int) -> tuple[float, float]:
    with metrics_off(mesh):
        return mapped(mesh, calls)


def ratio_rows(values: dict[str, list[float]], block: dict[str, Any],
               unit: str) -> list[list[str]]:
    """Per contender: its median and range, and for the metrics on their ratio to off, with
    its interval and verdict against the A/A control."""
    control = stats.control_of(block)
    r = stats.find(block, ON, OFF)
    rows = []
    for name, runs in values.items():
        s = stats.spread(runs)
        cell = "baseline" if name == OFF else (
            f"A/A control, {ON} ÷ this: {stats.interval_text(control)}" if name == ON_AA
            else f"{stats.interval_text(r)}; {stats.verdict(r, control) if r else '–'}")
        rows.append([name, f"{s['median']:,.1f} {unit} ({s['min']:,.1f}–{s['max']:,.1f})",
                     cell])
    return rows


def run(quick: bool, out_dir: str | Path, repeats: int | None = None,
        calls: int | None = None) -> dict[str, Any]:
    """Measure (sizes `QUICK` or `FULL`) and return the figures as a side scenario of
    `python -m benchmarks` does (`summary`, `tables`, `headline`; see
    benchmarks/side/__init__.py), with the raw numbers beside."""
    sizes = QUICK if quick else FULL
    if repeats:
        sizes = dataclasses.replace(sizes, repeats=repeats)
    if calls:
        sizes = dataclasses.replace(sizes, calls=calls)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    say(f"metrics cost: map over {sizes.calls:,} no-op calls on {sizes.actors} actors, "
        f"metrics on / off / on again in turns, × {sizes.repeats}")
    hook = statistics.median(hooks_ns(50_000) for _ in range(5))
    flush = flush_ms(50_000)
    with am.ActorMesh(Echo, shape=sizes.actors, num_cpus=0.1) as mesh:
        mesh.wait_ready(timeout=120)
        rates, cpus = measure(mesh, sizes)
    rate_block = stats.compare_scalars(rates, "throughput_per_s", contenders=[ON],
                                       baselines=[OFF], control=(ON, ON_AA))
    cpu_block = stats.compare_scalars(cpus, "cpu_us_per_call", contenders=[ON],
                                      baselines=[OFF], control=(ON, ON_AA))
    r = stats.find(rate_block, ON, OFF)
    control = stats.control_of(rate_block)
    cpu_off = statistics.median(cpus[OFF])
    share = hook / 1e3 / cpu_off
    header = ["contender", "median (range) over repeats", f"{ON} ÷ {OFF}, interval, verdict"]
    tables = [
        {"title": f"Throughput of a map over {sizes.calls:,} no-op calls, {sizes.actors} actors "
                  "(> 1: the metrics cost nothing measurable)",
         "header": header, "rows": ratio_rows(rates, rate_block, "calls/s")},
        {"title": "Driver CPU per call (every thread of the driver process; > 1: less with "
                  "the metrics on)",
         "header": header, "rows": ratio_rows(cpus, cpu_block, "µs")},
        {"title": "The metrics' own cost, without Ray",
         "header": ["what", "figure"],
         "rows": [["the call path's hook (task_ended, in tasks of 16 calls)",
                   f"{hook:.0f} ns of CPU per call"],
                  [f"their share of a call's driver CPU ({cpu_off:.1f} µs, metrics off)",
                   f"{share:.2%}"],
                  ["one export to Ray (every 2 s) after 50,000 calls of one method",
                   f"{flush:.2f} ms"]]},
    ]
    for table in tables:
        say(f"{table['title']}:")
        for cells in table["rows"]:
            say("  " + " · ".join(cells))
    cost = f"{1 - r.value:+.1%}" if r else "–"
    headline = ({"what": f"map over no-op calls: throughput, {ON} ÷ {OFF} (goal ≥ {GOAL})",
                 "metric": "throughput_per_s", "value": r.value, "lo": r.lo, "hi": r.hi,
                 "control": control.as_dict() if control else None,
                 "text": f"hooks {hook:.0f} ns/call, {share:.2%} of a call's driver CPU"}
                if r else None)
    return {
        "summary": (
            f"Tiny no-op calls through `map` on {sizes.actors} actors, the mesh's metrics on "
            f"and off in turns ({sizes.repeats} repeats): throughput with them on is "
            f"{stats.interval_text(r)} of that without (a cost of {cost}; the A/A control, "
            f"on ÷ on: {stats.interval_text(control)}; goal: ≥ {GOAL}). The hooks on the call "
            f"path cost {hook:.0f} ns of CPU per call, {share:.2%} of a call's driver CPU."),
        "tables": tables,
        "headline": [headline] if headline else [],
        "sizes": dataclasses.asdict(sizes),
        "throughput_per_s": rates,
        "cpu_us_per_call": cpus,
        "hooks_ns_per_call": hook,
        "flush_ms_50k_calls": flush,
        "comparison": {"throughput_per_s": rate_block, "cpu_us_per_call": cpu_block},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the sizes make bench runs")
    parser.add_argument("--repeats", type=int, help="turns per contender")
    parser.add_argument("--calls", type=int, help="no-op calls per map")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="output directory (bench-results)")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        result = run(args.quick, args.out, args.repeats, args.calls)
    finally:
        ray.shutdown()
    say(result["summary"])
    path = Path(args.out) / "metrics_cost.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    say(f"written: {path}")


if __name__ == "__main__":
    main()
