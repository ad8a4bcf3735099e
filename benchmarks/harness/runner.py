"""Plays a balancing scenario: every contender of the fleet, repeat by repeat, taking turns.

Within a repeat every contender plays the same plan (the same send times and service times,
`Scenario.plan`), in an order shuffled per repeat (`turns.order`); before its turn the actors
work off whatever the last contender left (`cluster.barrier`). The contenders the headline
needs (the default, its twin and the baselines) play every repeat; the library's other
policies every `Config.others_every`-th, in turns, which buys the headline its repeats. A
scenario whose baselines are slow and far from the default (`Scenario.baselines_every`) plays
them, and the other policies with them, every n-th repeat only: the default, its twin and the
references of its headline rows (a mesh made anew) get the repeats their A/A control needs,
for a few fast turns more. After the repeats, every ratio gets its
interval over the repeats both sides played, and the default against its twin is the A/A
control (`benchmarks.harness.section`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from benchmarks.config import Config
from benchmarks.harness import driver, metrics, section, turns
from benchmarks.harness.cluster import Fleet, barrier
from benchmarks.harness.contenders import twin_name
from benchmarks.report import stats

if TYPE_CHECKING:
    from benchmarks.scenarios.balancing import Scenario

Progress = Callable[[str], None]


def sitting_out(names: list[str], headline: set[str], others: list[str], repeat: int,
                repeats: int, every: int, others_every: int) -> set[str]:
    """Who sits repeat `repeat` out: every contender but the `headline` ones (which play every
    repeat) plays every `every`-th repeat, and the library's `others` every `others_every`-th of
    those again (by their order, so each repeat holds some). A contender sits none out unless
    it still plays two repeats, so that its ratios get an interval."""
    out: set[str] = set()
    if repeats >= 2 * every and repeat % every:
        out = {name for name in names if name not in headline}
    if repeats >= 2 * every * others_every:
        out |= {name for i, name in enumerate(others)
                if name not in headline and (repeat // every + i) % others_every}
    return out


def run_scenario(fleet: Fleet, cfg: Config, scenario: Scenario,
                 progress: Progress) -> dict[str, Any]:
    """Every contender on every repeat of `scenario`; returns its results section."""
    started = time.perf_counter()
    repeats = scenario.repeats or cfg.repeats
    slowdowns = scenario.slowdowns(cfg.actors)
    contenders = fleet.contenders + ([fleet.fresh] if scenario.fresh else [])
    others = [c.name for c in contenders if c.family == "actormesh" and c.name != fleet.default]
    headline = {fleet.default, twin_name(fleet.default),
                *(row.baseline for row in scenario.headline if row.baseline in others)}
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    samples: dict[str, list[stats.RunSample | None]] = {c.name: [] for c in contenders}
    timed = scenario.kind in ("open", "fault")
    warmup = cfg.warmup_s if timed else -1.0
    drain = {"open": cfg.drain_s, "fault": cfg.fault_drain_s}.get(scenario.kind,
                                                                   cfg.batch_drain_s)
    if scenario.slow_rank >= 0:
        fleet.set_slowdowns(slowdowns)
    try:
        for r in range(repeats):
            planned, durations = scenario.plan(cfg, r, fleet.overhead_s)
            resting = sitting_out([c.name for c in contenders], headline, others, r, repeats,
                                  scenario.baselines_every, cfg.others_every)
            for name in resting:
                samples[name].append(None)
            playing = [c for c in contenders if c.name not in resting]
            for contender in turns.order(playing, r, scenario.name):
                progress(f"{scenario.name} · repeat {r + 1}/{repeats} · {contender.name}")
                barrier(contender)
                events = []
                if scenario.kill_rank >= 0:
                    handle = contender.handles[scenario.kill_rank]
                    events.append((scenario.kill_at_s, "kill",
                                   lambda h=handle: ray.kill(h, no_restart=False)))
                run = driver.play(contender, scenario.method, planned, durations,
                                  drain_s=drain, events=events,
                                  retries=1 if scenario.kind == "fault" else 0)
                m = metrics.run_metrics(run, warmup_s=warmup, slowdowns=slowdowns,
                                        killed_rank=scenario.kill_rank if scenario.kill_rank >= 0
                                        else None, slow_ms=scenario.slow_ms())
                runs[contender.name].append(m)
                samples[contender.name].append(metrics.sample(run, m, warmup,
                                                              scenario.slow_ms()))
    finally:
        if scenario.slow_rank >= 0:
            fleet.set_slowdowns([1.0] * cfg.actors)
    progress(f"{scenario.name} · bootstrap intervals")
    return section.build(
        name=scenario.name, title=scenario.title, kind=scenario.kind,
        description=scenario.describe(cfg.actors),
        entrants=[section.Entrant(c.name, c.label, c.family) for c in contenders],
        default=fleet.default, twin=twin_name(fleet.default), runs=runs, samples=samples,
        judged_on=scenario.judged_on(), rows=scenario.headline,
        columns=scenario.columns(), started=started, params=scenario.params(),
        overhead=("random", "ray-random"), overhead_note=scenario.overhead_note,
        slow_ms=scenario.slow_ms())
