"""Samples/s of the async trainer against the synchronous loop, on heavy-tailed rollouts.

The workload, the same for every contender: `prompts` prompts; a rollout sleeps (asyncio) for a
lognormal time seeded by its uid, and about 10% return `None` (filtered); an engine pool of
`slots` slots bounds the rollouts running at once (the trainer's `max_concurrency` is the same);
`train` is a plain function costing a fixed time (a GIL-free sleep, on the trainer's thread);
`sync_weights` a fixed async cost. Contenders: `sync=True` (generate a batch, train, sync), the
same again (an A/A control: its ratio to the first is the noise floor), `max_staleness` 1, 2, 4,
and, as a reference, the rule of AReaL and SkyRL at max_staleness 2: the same admission, but
each step trains the first groups to *complete* (`completion_order_run`, written here), which
does not bound any one group's staleness. Every repeat runs each contender once on a workload
seeded by the repeat, the order rotating, and ratios are paired within a repeat. Reported:
samples (groups trained) per second, each ratio to `sync=True` as the median and range of the
per-repeat ratios and as a 95% paired bootstrap interval (`benchmarks.stats`) judged against the
A/A control's, the share of groups staler than the setting, and a histogram of the groups'
staleness (`async_trainer_staleness.png` in --out). `run(quick, out_dir)` is the side scenario
`python -m benchmarks` calls (benchmarks/side.py).

    python -m benchmarks.async_trainer [--quick] [--repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from actormesh.integrations.trainer import AsyncTrainer, epoch_order

from . import stats

CONTENDERS: dict[str, dict[str, Any]] = {
    "sync": {"sync": True},
    "sync (A/A)": {"sync": True},
    "max_staleness=1": {"max_staleness": 1},
    "max_staleness=2": {"max_staleness": 2},
    "max_staleness=4": {"max_staleness": 4},
    "completion order, S=2": {"completion_order": 2},
}
BASELINE, CONTROL = "sync", "sync (A/A)"
BOUND = {name: next(iter(o.values())) for name, o in CONTENDERS.items() if "sync" not in o}
"""The staleness each asynchronous contender is set to (a bound only for AsyncTrainer)."""
PLOT = "async_trainer_staleness.png"


@dataclasses.dataclass(frozen=True)
class Workload:
    prompts: int
    batch_size: int = 8
    slots: int = 8
    median_s: float = 0.02
    sigma: float = 1.0
    filter_rate: float = 0.1
    train_s: float = 0.04
    sync_s: float = 0.005
    seed: int = 0

    def duration(self, uid: int) -> float:
        rng = random.Random(f"rollout/{self.seed}/{uid}")
        return rng.lognormvariate(math.log(self.median_s), self.sigma)

    def filtered(self, uid: int) -> bool:
        return random.Random(f"filter/{self.seed}/{uid}").random() < self.filter_rate


QUICK = Workload(prompts=240)
FULL = Workload(prompts=480)


class Fakes:
    """The workload's rollout (an engine pool of `slots` slots), train and sync_weights."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.slots: asyncio.Semaphore | None = None

    async def rollout(self, uid: int, _: int) -> int | None:
        self.slots = self.slots or asyncio.Semaphore(self.work.slots)  # on the run's own loop
        async with self.slots:
            await asyncio.sleep(self.work.duration(uid))
        return None if self.work.filtered(uid) else uid

    def train(self, groups: list[int], step: int) -> None:
        time.sleep(self.work.train_s)

    async def sync_weights(self, version: int) -> None:
        await asyncio.sleep(self.work.sync_s)


def run_once(work: Workload, options: dict[str, Any]) -> tuple[float, list[int]]:
    """One training run: (samples/s, the staleness of every group trained)."""
    fakes = Fakes(work)
    start = time.perf_counter()
    if "completion_order" in options:
        staleness = asyncio.run(completion_order_run(work, fakes, options["completion_order"]))
    else:
        trainer = AsyncTrainer(list(range(work.prompts)), fakes.rollout, fakes.train,
                               batch_size=work.batch_size, max_concurrency=work.slots,
                               sync_weights=fakes.sync_weights, seed=work.seed, **options)
        staleness = [s for m in trainer.run() for s in m["staleness"]]
    return len(staleness) / (time.perf_counter() - start), staleness


async def completion_order_run(work: Workload, fakes: Fakes, max_staleness: int) -> list[int]:
    """The rule of AReaL and SkyRL, for reference: admission while accepted + running <
    (max_staleness + version + 1) * batch_size, in the same order; each step trains the first
    batch_size groups to complete. Returns each trained group's staleness."""
    order = epoch_order(work.prompts, work.seed, 0)
    batch_size, cond = work.batch_size, asyncio.Condition()
    buffer: list[tuple[int, int]] = []  # (uid, version) in completion order
    nxt = running = accepted = version = 0
    tasks: set[asyncio.Task[None]] = set()

    def admit() -> None:
        nonlocal nxt, running
        while (nxt < len(order) and running < work.slots
               and accepted + running < (max_staleness + version + 1) * batch_size):
            task = asyncio.create_task(one(order[nxt], version))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            nxt, running = nxt + 1, running + 1

    async def one(uid: int, started_with: int) -> None:
        nonlocal running, accepted
        group = await fakes.rollout(uid, uid)
        async with cond:
            running -= 1
            if group is not None:
                accepted += 1
                buffer.append((uid, started_with))
            admit()
            cond.notify_all()

    staleness: list[int] = []
    async with cond:
        admit()
    while True:
        async with cond:
            await asyncio.wait_for(cond.wait_for(
                lambda: len(buffer) >= batch_size or (nxt == len(order) and not running)), 60)
            batch, buffer[:] = buffer[:batch_size], buffer[batch_size:]
        if not batch:
            return staleness
        staleness.extend(version - v for _, v in batch)
        await asyncio.to_thread(fakes.train, [uid for uid, _ in batch], version)
        await fakes.sync_weights(version + 1)
        async with cond:
            version += 1
            admit()


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def plot(staleness: dict[str, list[int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in staleness if name in BOUND]
    top = max((max(staleness[name], default=0) for name in names), default=0)
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, name in enumerate(names):
        counts = Counter(staleness[name])
        total = max(len(staleness[name]), 1)
        xs = [k + (i - (len(names) - 1) / 2) * width for k in range(top + 1)]
        ax.bar(xs, [counts[k] / total for k in range(top + 1)], width, label=name)
    ax.set_xlabel("staleness (step that trained the group − version it was generated with)")
    ax.set_ylabel("fraction of groups")
    ax.set_xticks(range(top + 1))
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("staleness of the groups trained (all repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool, out_dir: str | Path, repeats: int | None = None) -> dict[str, Any]:
    """Measure every contender `repeats` times (3 quick, 5 full), write the staleness histogram
    to `out_dir`, and return the figures as a side scenario of `python -m benchmarks` does
    (`summary`, `tables`, `headline`; see benchmarks/side.py), with the raw numbers beside."""
    work = QUICK if quick else FULL
    repeats = repeats or (3 if quick else 5)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(CONTENDERS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    staleness: dict[str, list[int]] = {name: [] for name in names}
    print(f"async trainer: {work.prompts} prompts, batch {work.batch_size}, {work.slots} slots, "
          f"rollouts lognormal(median {work.median_s * 1e3:g} ms, sigma {work.sigma}), "
          f"train {work.train_s * 1e3:g} ms, {repeats} repeats", flush=True)
    for r in range(repeats):
        seeded = dataclasses.replace(work, seed=r)
        for name in names[r % len(names):] + names[:r % len(names)]:
            rate, stale = run_once(seeded, CONTENDERS[name])
            rates[name].append(rate)
            staleness[name].extend(stale)
            print(f"  repeat {r + 1}/{repeats} {name:22s} {rate:7.1f} samples/s", flush=True)
    plot(staleness, out / PLOT)

    ranges = {name: summary([a / b for a, b in zip(rates[name], rates[BASELINE])])
              for name in names if name != BASELINE}
    runs = {name: [stats.RunSample(np.empty(0), 0, {}, {"throughput_per_s": rate})
                   for rate in rates[name]] for name in names}
    comparison = stats.compare(runs, ["throughput_per_s"], contenders=names[1:],
                               baselines=[BASELINE], control=(CONTROL, BASELINE))
    block = comparison["throughput_per_s"]
    control = stats.control_of(block)
    staler = {name: {"fraction": sum(x > bound for x in staleness[name]) / len(staleness[name]),
                     "max": float(max(staleness[name]))}
              for name, bound in BOUND.items()}

    rows = []
    print("samples/s (median, range over repeats); ratio to sync=True: paired median (range), "
          "95% bootstrap interval, verdict against the A/A noise:")
    for name in names:
        samples = summary(rates[name])
        cells = [name, f"{samples['median']:.1f} ({samples['min']:.1f}–{samples['max']:.1f})"]
        ratio = stats.find(block, name, BASELINE) if name != BASELINE else None
        if ratio is None:
            cells += ["baseline", "–"]
        else:
            q = ranges[name]
            cells += [f"{q['median']:.2f}× ({q['min']:.2f}–{q['max']:.2f}); "
                      f"{stats.interval_text(ratio)}", stats.verdict(ratio, control)]
        over = staler.get(name)
        cells.append(f"{over['fraction']:.1%} (max {over['max']:g})" if over else "0 (sync)")
        rows.append(cells)
        print("  " + " · ".join(cells))
    print(f"staleness histogram: {out / PLOT}")

    s2 = stats.find(block, "max_staleness=2", BASELINE)
    reference = ranges["completion order, S=2"]["median"]
    return {
        "summary": (
            f"{work.prompts} prompts, batches of {work.batch_size} groups, an engine pool of "
            f"{work.slots} slots, lognormal rollouts (median {work.median_s * 1e3:g} ms, σ "
            f"{work.sigma}), {work.filter_rate:.0%} filtered, train {work.train_s * 1e3:g} ms "
            f"in a thread, sync {work.sync_s * 1e3:g} ms; {repeats} repeats, one workload seed "
            f"each. AsyncTrainer at max_staleness=2 trains {ranges['max_staleness=2']['median']:.2f}× "
            f"the samples/s of sync=True (goal 2.5×) with every group at staleness ≤ 2; the "
            f"AReaL/SkyRL rule (first groups to complete) reaches {reference:.2f}× but trains "
            f"{staler['completion order, S=2']['fraction']:.0%} of its groups staler than 2 "
            f"(up to {staler['completion order, S=2']['max']:g}). Staleness histogram: `{PLOT}`."),
        "tables": [{
            "title": "Async trainer: samples/s against sync=True",
            "header": ["contender", "samples/s median (range)", "÷ sync=True",
                       "verdict", "groups staler than the setting (max)"],
            "rows": rows,
        }],
        "headline": [{
            "scenario": "async_trainer",
            "title": "async trainer, heavy-tailed rollouts · samples/s, max_staleness=2 ÷ sync",
            "metric": "throughput_per_s",
            "strongest": BASELINE,
            "best": block.get("best"),
            "values": " · ".join(f"{n} {summary(rates[n])['median']:.1f}/s"
                                 for n in (BASELINE, "max_staleness=2")),
            "vs_strongest": s2.as_dict() if s2 else None,
            "control": control.as_dict() if control else None,
            "verdict": stats.verdict(s2, control) if s2 else "–",
        }],
        "workload": dataclasses.asdict(work),
        "repeats": repeats,
        "samples_per_s": {name: rates[name] for name in names},
        "ratio_to_sync": ranges,
        "comparison": comparison,
        "staleness": {name: dict(sorted(Counter(staleness[name]).items())) for name in names},
        "staler_than_setting": staler,
        "plots": {"staleness": PLOT},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="240 prompts, 3 repeats (what make bench runs)")
    parser.add_argument("--repeats", type=int, help="repeats per contender")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="output directory (bench-results)")
    opts = parser.parse_args()
    if opts.repeats is not None and opts.repeats < 1:
        parser.error(f"--repeats {opts.repeats}: need at least 1")
    results = run(opts.quick, opts.out, opts.repeats)
    (opts.out / "async_trainer.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
