"""`am.ActorPool` against `ray.util.ActorPool` on the same actors: a straggler, and a kill.

Two parts, on 8 actors (the fault part makes fresh ones per run, since it kills one); `map`
over tiny calls, which was part of this script, is the `map` scenario of `python -m benchmarks`
now (benchmarks/scenarios/call_path.py).

1. A straggler: each call sleeps 5 ms, on one actor 10× longer; the makespan of a `map` over
   a batch, against the lower bound (the batch over the actors' summed rates). Ray's pool frees
   an actor only when its result is read, so an ordered `map` stalls behind the straggler;
   its `map_unordered` is shown too, as its strongest form. `am.ActorPool.map` runs twice,
   on two pools over the same actors: the A/A control.
2. A killed actor: a batch of 10 ms calls, one actor killed once a quarter of the results are
   read; each result is read with `get_next(timeout)`, so a hang shows as calls unfinished and
   the benchmark itself never hangs. The same driver loop runs Ray's pool and ours (the same
   interface); counted: calls failed, unfinished, and the makespan.

Contenders take turns, in an order shuffled every repeat; ratios are paired within a repeat and
given with a bootstrap interval (`benchmarks.report.stats`) judged against the A/A control's.
`run(quick, out_dir)` is the side scenario `python -m benchmarks` calls
(benchmarks/side/__init__.py).

    python -m benchmarks.side.pool_map [--quick] [--repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.util import ActorPool as RayPool

import actormesh as am
from benchmarks.harness import turns
from benchmarks.harness.metrics import batch_lower_bound
from benchmarks.report import stats

ACTORS = 8
STRAGGLER = 0  # the actor 10× slower in part 2
KILLED = 3  # the actor killed in part 3


@ray.remote(num_cpus=0)
class Item:
    """A plain Ray actor: `work` sleeps its base time × `slowdown`."""

    def __init__(self, slowdown: float = 1.0) -> None:
        self.slowdown = slowdown

    def work(self, x: int, base_s: float) -> int:
        time.sleep(base_s * self.slowdown)
        return x


@dataclasses.dataclass(frozen=True)
class Sizes:
    repeats: int  # part 1
    batch: int
    base_s: float
    slowdown: float
    fault_batch: int  # part 2
    fault_s: float
    fault_repeats: int
    hang_s: float  # a result not in after this long counts as a hang


QUICK = Sizes(repeats=5, batch=240, base_s=0.005, slowdown=10.0,
              fault_batch=240, fault_s=0.01, fault_repeats=1, hang_s=20.0)
FULL = Sizes(repeats=8, batch=480, base_s=0.005, slowdown=10.0,
             fault_batch=480, fault_s=0.01, fault_repeats=4, hang_s=30.0)

RAY, POOL, POOL_AA = "ray.util.ActorPool.map", "am.ActorPool.map", "am.ActorPool.map (A/A)"
RAY_UNORDERED, POOL_SED = "ray.util.ActorPool.map_unordered", "am.ActorPool.map, sed ×2 slots"
POOL_UNORDERED = "am.ActorPool.map_unordered"
POOL_RETRY = "am.ActorPool, retries=1"


def make_actors(slowdowns: Sequence[float]) -> list[Any]:
    handles = [Item.remote(s) for s in slowdowns]  # type: ignore[attr-defined]
    ray.get([h.__ray_ready__.remote() for h in handles], timeout=120)
    return handles


def say(text: str) -> None:
    print(text, flush=True)


# -- part 1: a straggler ---------------------------------------------------------------------
def measure_straggler(actors: list[Any], sizes: Sizes) -> dict[str, list[float]]:
    base = sizes.base_s

    def work(x: Any, v: int) -> Any:
        return x.work.remote(v, base)

    ray_pool, pool, twin = RayPool(actors), am.ActorPool(actors), am.ActorPool(actors)
    sed = am.ActorPool(actors, balancer="sed", max_in_flight=2)
    runs: dict[str, Callable[[list[int]], Iterable[Any]]] = {
        RAY: lambda items: ray_pool.map(work, items),
        RAY_UNORDERED: lambda items: ray_pool.map_unordered(work, items),
        POOL: lambda items: pool.map(work, items),
        POOL_AA: lambda items: twin.map(work, items),
        POOL_UNORDERED: lambda items: pool.map_unordered(work, items),
        POOL_SED: lambda items: sed.map(work, items),
    }
    names = list(runs)
    for name in names:
        list(runs[name](list(range(2 * len(actors)))))  # warm up, and teach sed the speeds
    items = list(range(sizes.batch))
    makespans: dict[str, list[float]] = {name: [] for name in names}
    for r in range(sizes.repeats):
        for name in turns.order(names, r, "pool_map/straggler"):
            started = time.perf_counter()
            out = list(runs[name](items))
            makespans[name].append(time.perf_counter() - started)
            if sorted(out) != items:
                raise AssertionError(f"{name} returned wrong results")
            say(f"  straggler, repeat {r + 1}/{sizes.repeats}: {name:36s} "
                f"{makespans[name][-1]:6.3f} s")
    return makespans


def lower_bound_s(sizes: Sizes) -> float:
    """The batch spread over the actors' summed rates: no scheduler can finish sooner."""
    return batch_lower_bound(np.full(sizes.batch, sizes.base_s),
                             [1.0] * (ACTORS - 1) + [sizes.slowdown])


# -- part 2: a killed actor ------------------------------------------------------------------
@dataclasses.dataclass
class FaultRun:
    ok: int
    failed: int
    unfinished: int
    makespan_s: float
    errors: list[str]


def fault_run(make_pool: Callable[[list[Any]], Any], sizes: Sizes) -> FaultRun:
    """Submit a batch, kill one actor once a quarter of the results are read, read the rest
    with a timeout per result. The same loop drives Ray's pool and ours."""
    actors = make_actors([1.0] * ACTORS)
    pool = make_pool(actors)
    base = sizes.fault_s
    for v in range(sizes.fault_batch):
        pool.submit(lambda x, v: x.work.remote(v, base), v)
    ok = failed = 0
    errors: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    while pool.has_next():
        if ok + failed == sizes.fault_batch // 4:
            ray.kill(actors[KILLED])
        try:
            pool.get_next(timeout=sizes.hang_s)
            ok += 1
        except TimeoutError:
            break  # a hang: whatever was not read is unfinished
        except Exception as err:  # noqa: BLE001 - what each pool raises is what is counted
            failed += 1
            errors[type(err).__name__] += 1
    makespan = time.perf_counter() - started
    for actor in actors:
        ray.kill(actor)
    return FaultRun(ok, failed, sizes.fault_batch - ok - failed, makespan,
                    [f"{n}×{e}" for e, n in errors.items()])


def measure_faults(sizes: Sizes) -> dict[str, list[FaultRun]]:
    makers: dict[str, Callable[[list[Any]], Any]] = {
        "ray.util.ActorPool": RayPool,
        "am.ActorPool": am.ActorPool,
        POOL_RETRY: lambda actors: am.ActorPool(actors, retries=1),
    }
    names = list(makers)
    runs: dict[str, list[FaultRun]] = {name: [] for name in names}
    for r in range(sizes.fault_repeats):
        for name in turns.order(names, r, "pool_map/faults"):
            run_ = fault_run(makers[name], sizes)
            runs[name].append(run_)
            say(f"  killed actor, repeat {r + 1}/{sizes.fault_repeats}: {name:26s} "
                f"{run_.ok} ok, {run_.failed} failed, {run_.unfinished} unfinished, "
                f"{run_.makespan_s:.2f} s {' '.join(run_.errors)}")
    return runs


# -- the report --------------------------------------------------------------------------------
def ratio_rows(values: dict[str, list[float]], block: dict[str, Any], baselines: Sequence[str],
               higher_is_better: bool, unit: Callable[[float], str]) -> list[list[str]]:
    """Per contender: its values, then per baseline the paired ratio per repeat (median and
    range) and, for a contender, the bootstrap interval and the verdict against the A/A."""
    control = stats.control_of(block)
    rows = []
    for name, runs in values.items():
        s = stats.spread(runs)
        cells = [name, f"{unit(s['median'])} ({unit(s['min'])}–{unit(s['max'])})"]
        for baseline in baselines:
            if name == baseline:
                cells.append("baseline")
                continue
            q = stats.paired(runs, values[baseline], higher_is_better)
            cell = f"{q['median']:.2f}× ({q['min']:.2f}–{q['max']:.2f})"
            if name == POOL_AA:
                cell += f"; the A/A control, {POOL} ÷ this: {stats.interval_text(control)}"
            elif name not in baselines:
                r = stats.find(block, name, baseline)
                cell += f"; {stats.interval_text(r)}; {stats.verdict(r, control) if r else '–'}"
            cells.append(cell)
        rows.append(cells)
    return rows


def headline(block: dict[str, Any], scenario: str, metric_words: str, contender: str,
             values: dict[str, list[float]], unit: Callable[[float], str],
             baseline: str | None = None) -> dict[str, Any] | None:
    """A row for the harness's main table: `contender` against `baseline` (like for like: the
    same calls outstanding per actor), else the strongest baseline."""
    strongest = baseline or block.get("strongest")
    r = stats.find(block, contender, strongest)
    if r is None or strongest is None:
        return None
    control = stats.control_of(block)
    return {"scenario": "pool_map",
            "title": f"{scenario} · {metric_words}, {contender} ÷ {strongest}",
            "metric": r.metric, "contender": contender, "strongest": strongest,
            "best": block.get("best"),
            "values": " · ".join(f"{n} {unit(statistics.median(values[n]))}"
                                 for n in (contender, strongest)),
            "vs_strongest": r.as_dict(), "control": control.as_dict() if control else None,
            "verdict": stats.verdict(r, control)}


def run(quick: bool, out_dir: str | Path, repeats: int | None = None) -> dict[str, Any]:
    """Run both parts (sizes `QUICK` or `FULL`) and return the figures as a side scenario of
    `python -m benchmarks` does (`summary`, `tables`, `headline`; see
    benchmarks/side/__init__.py), with the raw numbers beside."""
    sizes = QUICK if quick else FULL
    if repeats:
        sizes = dataclasses.replace(sizes, repeats=repeats, fault_repeats=repeats)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    say(f"pool map: {ACTORS} actors; part 1: {sizes.batch} calls of {sizes.base_s * 1e3:g} ms, "
        f"one actor {sizes.slowdown:g}× slower, × {sizes.repeats}; part 2: {sizes.fault_batch} "
        f"calls of {sizes.fault_s * 1e3:g} ms, one actor killed, × {sizes.fault_repeats}")
    actors = make_actors([sizes.slowdown if i == STRAGGLER else 1.0 for i in range(ACTORS)])
    makespans = measure_straggler(actors, sizes)
    for actor in actors:
        ray.kill(actor)
    faults = measure_faults(sizes)

    straggler_block = stats.compare_scalars(
        makespans, "makespan_s", contenders=[POOL, POOL_UNORDERED, POOL_SED],
        baselines=[RAY, RAY_UNORDERED], control=(POOL, POOL_AA))
    straggler_rows = ratio_rows(makespans, straggler_block, [RAY, RAY_UNORDERED], False,
                                lambda v: f"{v:.3f} s")
    bound = lower_bound_s(sizes)
    for row, runs in zip(straggler_rows, makespans.values()):
        row.append(f"{statistics.median(runs) / bound:.2f}×")
    fault_rows = []
    for name, fruns in faults.items():
        fault_rows.append([
            name,
            f"{statistics.median(f.failed for f in fruns):g} (max {max(f.failed for f in fruns)})",
            f"{statistics.median(f.unfinished for f in fruns):g} "
            f"(max {max(f.unfinished for f in fruns)})",
            f"{statistics.median(f.makespan_s for f in fruns):.2f} s",
            ", ".join(sorted({e for f in fruns for e in f.errors})) or "–",
        ])
    tables = [
        {"title": f"A straggler: makespan of a map over {sizes.batch} calls "
                  f"(lower bound {bound:.3f} s)",
         "header": ["contender", "makespan median (range)", f"÷ {RAY}", f"÷ {RAY_UNORDERED}",
                    "÷ lower bound"],
         "rows": straggler_rows},
        {"title": f"A killed actor: {sizes.fault_batch} calls, one of {ACTORS} actors killed "
                  f"after a quarter (no A/A: counts, not a ratio)",
         "header": ["pool", "calls failed, median (max)", "unfinished (hang), median (max)",
                    "makespan median", "errors seen"],
         "rows": fault_rows},
    ]
    for table in tables:
        say(f"{table['title']}:")
        say("  " + " · ".join(table["header"]))
        for row in table["rows"]:
            say("  " + " · ".join(row))

    pool_straggler = stats.paired(makespans[POOL], makespans[RAY], False)
    head = headline(straggler_block, f"map, one actor {sizes.slowdown:g}× slower", "makespan",
                    POOL, makespans, lambda v: f"{v:.3f} s")
    lost = {name: statistics.median(f.failed + f.unfinished for f in fruns)
            for name, fruns in faults.items()}
    return {
        "summary": (
            f"{ACTORS} plain Ray actors shared by every contender. With one actor "
            f"{sizes.slowdown:g}× slower, am.ActorPool's ordered map finishes a batch "
            f"{pool_straggler['median']:.2f}× sooner than Ray's (median of {sizes.repeats} paired "
            f"repeats, range {pool_straggler['min']:.2f}–{pool_straggler['max']:.2f}; Ray's pool "
            f"frees an actor only when its result is read). With an actor killed mid-run, calls "
            f"lost (median): " + ", ".join(f"{n} {v:g}" for n, v in lost.items()) + "."),
        "tables": tables,
        "headline": [head] if head else [],
        "sizes": dataclasses.asdict(sizes),
        "straggler_makespan_s": makespans,
        "straggler_lower_bound_s": bound,
        "faults": {name: [dataclasses.asdict(f) for f in fruns] for name, fruns in faults.items()},
        "comparison": {"straggler": straggler_block},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the sizes make bench runs")
    parser.add_argument("--repeats", type=int, help="repeats per contender and part")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="output directory (bench-results)")
    opts = parser.parse_args()
    if opts.repeats is not None and opts.repeats < 1:
        parser.error(f"--repeats {opts.repeats}: need at least 1")
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    results = run(opts.quick, opts.out, opts.repeats)
    (opts.out / "pool_map.json").write_text(json.dumps(results, indent=1, default=str))
    ray.shutdown()


if __name__ == "__main__":
    main()
