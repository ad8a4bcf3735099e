"""`map` over many tiny items, and `am.ActorPool` against `ray.util.ActorPool`, on the same actors.

Three parts, on 8 actors made once and shared by every contender (the fault part makes fresh
ones per run, since it kills one):

1. Tiny calls (the method returns its argument): `items` values mapped, results read in
   order, calls/s. Contenders: `mesh.methods.f.map(items)` on `ActorMesh.from_actors(actors)`
   (pow2, its default window), `ray.util.ActorPool.map` (twice: the A/A control), a hand loop
   of raw `.remote()` calls round robin with at most 2 per actor outstanding (one running, one
   waiting in the actor), `am.ActorPool.map` with its defaults (pull, one call per actor, as
   Ray's pool), and `am.ActorPool.map` with `max_in_flight=2`.
2. A straggler: each call sleeps 5 ms, on one actor 10× longer; the makespan of a `map` over
   a batch, against the lower bound (the batch over the actors' summed rates). Ray's pool frees
   an actor only when its result is read, so an ordered `map` stalls behind the straggler;
   its `map_unordered` is shown too, as its strongest form.
3. A killed actor: a batch of 10 ms calls, one actor killed once a quarter of the results are
   read; each result is read with `get_next(timeout)`, so a hang shows as calls unfinished and
   the benchmark itself never hangs. The same driver loop runs Ray's pool and ours (the same
   interface); counted: calls failed, unfinished, and the makespan.

Contenders take turns, the order rotating every repeat; ratios are paired within a repeat and
given with a bootstrap interval (`benchmarks.stats`) judged against the A/A control's.
`run(quick, out_dir)` is the side scenario `python -m benchmarks` calls (benchmarks/side.py).

    python -m benchmarks.pool_map [--quick] [--repeats N] [--out DIR]
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

from . import stats
from .metrics import batch_lower_bound

ACTORS = 8
STRAGGLER = 0  # the actor 10× slower in part 2
KILLED = 3  # the actor killed in part 3


@ray.remote(num_cpus=0)
class Item:
    """A plain Ray actor: `f` returns at once, `work` sleeps its base time × `slowdown`."""

    def __init__(self, slowdown: float = 1.0) -> None:
        self.slowdown = slowdown

    def f(self, x: int) -> int:
        return x

    def work(self, x: int, base_s: float) -> int:
        time.sleep(base_s * self.slowdown)
        return x


@dataclasses.dataclass(frozen=True)
class Sizes:
    items: int  # part 1
    repeats: int
    batch: int  # part 2
    base_s: float
    slowdown: float
    fault_batch: int  # part 3
    fault_s: float
    fault_repeats: int
    hang_s: float  # a result not in after this long counts as a hang


QUICK = Sizes(items=4000, repeats=3, batch=240, base_s=0.005, slowdown=10.0,
              fault_batch=240, fault_s=0.01, fault_repeats=2, hang_s=20.0)
FULL = Sizes(items=10_000, repeats=5, batch=480, base_s=0.005, slowdown=10.0,
             fault_batch=480, fault_s=0.01, fault_repeats=4, hang_s=30.0)

RAY, RAY_AA, RAW = "ray.util.ActorPool.map", "ray.util.ActorPool.map (A/A)", "raw .remote() loop"
MESH, POOL, POOL2 = "mesh.methods.f.map", "am.ActorPool.map", "am.ActorPool.map, max_in_flight=2"
RAY_UNORDERED, POOL_SED = "ray.util.ActorPool.map_unordered", "am.ActorPool.map, sed ×2 slots"
POOL_UNORDERED = "am.ActorPool.map_unordered"
POOL_RETRY = "am.ActorPool, retries=1"


def tiny(x: Any, v: int) -> Any:
    return x.f.remote(v)


def make_actors(slowdowns: Sequence[float]) -> list[Any]:
    handles = [Item.remote(s) for s in slowdowns]  # type: ignore[attr-defined]
    ray.get([h.__ray_ready__.remote() for h in handles], timeout=120)
    return handles


def say(text: str) -> None:
    print(text, flush=True)


# -- part 1: tiny calls ------------------------------------------------------------------------
def tiny_contenders(actors: list[Any]) -> dict[str, Callable[[list[int]], list[Any]]]:
    """Each maps `f` over the items on the shared actors and returns the results in order."""
    ray_pool, ray_pool_aa = RayPool(actors), RayPool(actors)
    pool, pool2 = am.ActorPool(actors), am.ActorPool(actors, max_in_flight=2)
    window = 2 * len(actors)

    def raw(items: list[int]) -> list[Any]:
        out: list[Any] = []
        pending: collections.deque[Any] = collections.deque()
        for i, x in enumerate(items):
            if len(pending) >= window:
                out.append(ray.get(pending.popleft()))
            pending.append(actors[i % len(actors)].f.remote(x))
        out.extend(ray.get(ref) for ref in pending)
        return out

    runs: dict[str, Callable[[list[int]], list[Any]]] = {
        RAY: lambda items: list(ray_pool.map(tiny, items)),
        RAY_AA: lambda items: list(ray_pool_aa.map(tiny, items)),
        RAW: raw,
        POOL: lambda items: list(pool.map(tiny, items)),
        POOL2: lambda items: list(pool2.map(tiny, items)),
    }
    mesh: am.ActorMesh[Any] = am.ActorMesh.from_actors(actors)  # held by the lambda: a
    if hasattr(mesh.methods.f, "map"):  # dropped mesh shuts down. `map` is new: measured once
        runs[MESH] = lambda items: list(mesh.methods.f.map(items))  # it is there
    else:
        say(f"  {MESH}: not in this build of actormesh; not measured")
    return runs


def measure_tiny(actors: list[Any], sizes: Sizes) -> dict[str, list[float]]:
    runs = tiny_contenders(actors)
    names = list(runs)
    warm = list(range(200))
    for name in names:
        if runs[name](warm) != warm:
            raise AssertionError(f"{name} returned wrong results")
    items = list(range(sizes.items))
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(sizes.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            started = time.perf_counter()
            out = runs[name](items)
            elapsed = time.perf_counter() - started
            if out != items:
                raise AssertionError(f"{name} returned wrong results")
            rates[name].append(len(items) / elapsed)
            say(f"  tiny calls, repeat {r + 1}/{sizes.repeats}: {name:36s} "
                f"{rates[name][-1]:7.0f} calls/s")
    return rates


# -- part 2: a straggler ---------------------------------------------------------------------
def measure_straggler(actors: list[Any], sizes: Sizes) -> dict[str, list[float]]:
    base = sizes.base_s

    def work(x: Any, v: int) -> Any:
        return x.work.remote(v, base)

    ray_pool, ray_pool_aa = RayPool(actors), RayPool(actors)
    pool, sed = am.ActorPool(actors), am.ActorPool(actors, balancer="sed", max_in_flight=2)
    runs: dict[str, Callable[[list[int]], Iterable[Any]]] = {
        RAY: lambda items: ray_pool.map(work, items),
        RAY_AA: lambda items: ray_pool_aa.map(work, items),
        RAY_UNORDERED: lambda items: ray_pool.map_unordered(work, items),
        POOL: lambda items: pool.map(work, items),
        POOL_UNORDERED: lambda items: pool.map_unordered(work, items),
        POOL_SED: lambda items: sed.map(work, items),
    }
    names = list(runs)
    for name in names:
        list(runs[name](list(range(2 * len(actors)))))  # warm up, and teach sed the speeds
    items = list(range(sizes.batch))
    makespans: dict[str, list[float]] = {name: [] for name in names}
    for r in range(sizes.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
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


# -- part 3: a killed actor ------------------------------------------------------------------
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
        for name in names[r % len(names):] + names[:r % len(names)]:
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
            if name == RAY_AA and baseline == RAY:
                cell += f"; {stats.interval_text(control)}; the A/A control"
            elif name != RAY_AA and name not in baselines:
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
            "metric": r.metric, "strongest": strongest, "best": block.get("best"),
            "values": " · ".join(f"{n} {unit(statistics.median(values[n]))}"
                                 for n in (contender, strongest)),
            "vs_strongest": r.as_dict(), "control": control.as_dict() if control else None,
            "verdict": stats.verdict(r, control)}


def run(quick: bool, out_dir: str | Path, repeats: int | None = None) -> dict[str, Any]:
    """Run the three parts (sizes `QUICK` or `FULL`) and return the figures as a side scenario
    of `python -m benchmarks` does (`summary`, `tables`, `headline`; see benchmarks/side.py),
    with the raw numbers beside."""
    sizes = QUICK if quick else FULL
    if repeats:
        sizes = dataclasses.replace(sizes, repeats=repeats, fault_repeats=repeats)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    say(f"pool map: {ACTORS} actors; part 1: {sizes.items:,} tiny calls × {sizes.repeats} "
        f"repeats; part 2: {sizes.batch} calls of {sizes.base_s * 1e3:g} ms, one actor "
        f"{sizes.slowdown:g}× slower; part 3: {sizes.fault_batch} calls of "
        f"{sizes.fault_s * 1e3:g} ms, one actor killed, × {sizes.fault_repeats}")
    actors = make_actors([sizes.slowdown if i == STRAGGLER else 1.0 for i in range(ACTORS)])
    rates = measure_tiny(actors, sizes)
    makespans = measure_straggler(actors, sizes)
    for actor in actors:
        ray.kill(actor)
    faults = measure_faults(sizes)

    tiny_ours = [n for n in (MESH, POOL, POOL2) if n in rates]
    tiny_block = stats.compare_scalars(rates, "throughput_per_s", contenders=tiny_ours,
                                       baselines=[RAY, RAW], control=(RAY_AA, RAY))
    tiny_rows = ratio_rows(rates, tiny_block, [RAY, RAW], True, lambda v: f"{v:,.0f}")
    straggler_block = stats.compare_scalars(
        makespans, "makespan_s", contenders=[POOL, POOL_UNORDERED, POOL_SED],
        baselines=[RAY, RAY_UNORDERED], control=(RAY_AA, RAY))
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
        {"title": f"Tiny calls: map over {sizes.items:,} items, calls/s",
         "header": ["contender", "calls/s median (range)", f"÷ {RAY}", f"÷ {RAW}"],
         "rows": tiny_rows},
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

    pool_tiny = stats.paired(rates[POOL], rates[RAY], True)
    pool_straggler = stats.paired(makespans[POOL], makespans[RAY], False)
    # Like for like: one call per actor (Ray's pool, ours by default), two per actor (a raw loop
    # with a window of two per actor, mesh map's default window, our pool with two slots).
    heads = [
        headline(tiny_block, f"map over {sizes.items:,} tiny calls", "calls/s", POOL, rates,
                 lambda v: f"{v:,.0f}/s", RAY),
        headline(tiny_block, f"map over {sizes.items:,} tiny calls", "calls/s", POOL2, rates,
                 lambda v: f"{v:,.0f}/s", RAW),
        headline(tiny_block, f"map over {sizes.items:,} tiny calls", "calls/s", MESH, rates,
                 lambda v: f"{v:,.0f}/s", RAW),
        headline(straggler_block, f"map, one actor {sizes.slowdown:g}× slower", "makespan",
                 POOL, makespans, lambda v: f"{v:.3f} s"),
    ]
    lost = {name: statistics.median(f.failed + f.unfinished for f in fruns)
            for name, fruns in faults.items()}
    return {
        "summary": (
            f"{ACTORS} plain Ray actors shared by every contender. Tiny calls: am.ActorPool.map "
            f"(defaults) runs {pool_tiny['median']:.2f}× the calls/s of ray.util.ActorPool.map "
            f"(range {pool_tiny['min']:.2f}–{pool_tiny['max']:.2f} over {sizes.repeats} paired "
            f"repeats). With one actor {sizes.slowdown:g}× slower its ordered map finishes a "
            f"batch {pool_straggler['median']:.2f}× sooner than Ray's (which frees an actor "
            f"only when its result is read). With an actor killed mid-run, calls lost "
            f"(median): " + ", ".join(f"{n} {v:g}" for n, v in lost.items()) + "."),
        "tables": tables,
        "headline": [h for h in heads if h is not None],
        "sizes": dataclasses.asdict(sizes),
        "calls_per_s": rates,
        "straggler_makespan_s": makespans,
        "straggler_lower_bound_s": bound,
        "faults": {name: [dataclasses.asdict(f) for f in fruns] for name, fruns in faults.items()},
        "comparison": {"tiny": tiny_block, "straggler": straggler_block},
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
