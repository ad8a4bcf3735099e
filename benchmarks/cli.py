"""`python -m benchmarks [--quick | --full] [--out DIR] [--only NAME...]`: what `choose` wins.

Runs, in one go and on a local Ray cluster it starts itself (or the one at RAY_ADDRESS):
the decision cost of every policy, native against the same algorithm in pure Python; a
simulation of the native balancer at 4096 actors and its check against queueing theory (no Ray,
labelled SIMULATED); the Ray scenarios of `benchmarks.scenarios`, each against the baselines
users have today, with the default run twice as the A/A control and a paired bootstrap interval
for every ratio; and the side scenarios registered in `benchmarks.side`. Writes results.json,
report.md, headline.md (the README's tables, verbatim) and PNG plots to bench-results/ (or
--out), and prints a table per scenario and the headline.

For a bigger machine or a real cluster, run on one of its nodes (actormesh installed on every
node): `RAY_ADDRESS=auto python -m benchmarks --full` (or `RAY_ADDRESS=<head>:6379`); the harness
then joins that cluster instead of starting one. `--actors N` sets the number of actors.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import gc
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import scenarios, side
from benchmarks.config import MODES, Config
from benchmarks.harness.contenders import BASELINES, POLICIES, default_policy, twin_name
from benchmarks.report import output, provenance, terminal
from benchmarks.report.document import paragraph
from benchmarks.report.text import num
from benchmarks.without_ray import POLICIES as SIMULATED_POLICIES
from benchmarks.without_ray import sim, theory

SECTIONS = {"decision_cost": "decision cost per policy and N (no Ray)",
            "sim": "SIMULATED queue model at 4096 actors (no Ray)",
            "theory": "SIMULATED mean time in system against queueing theory (no Ray)"}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ([s.name for s in scenarios.build(MODES["quick"])] + list(SECTIONS)
             + list(side.SIDE))
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=(__doc__ or "").split("\n\n")[0],
        epilog="Sections: " + ", ".join(names) + ". A prefix selects several (uniform, tiny, "
               "batch). To use an existing Ray cluster, set RAY_ADDRESS.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="about eleven minutes on two quiet cores (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="longer runs, 16 actors, more repeats, 1M simulated calls")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="tiny sizes, for the test suite")
    p.add_argument("--out", default="bench-results", help="output directory (bench-results)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these sections")
    p.add_argument("--contenders", nargs="+", metavar="NAME",
                   choices=[*POLICIES, *BASELINES],
                   help="the balancing scenarios' contenders: policies of the library and "
                        "ray-random, ray-rr, ActorPool (the default brings its A/A twin)")
    p.add_argument("--actors", type=int, help="actors of the balancing scenarios (8 quick, 16 "
                                              "full)")
    p.add_argument("--repeats", type=int, help="repeats per scenario")
    p.add_argument("--publish", action="store_true",
                   help="also copy the straggler plot to benchmarks/README_straggler.png")
    p.add_argument("--list", action="store_true", help="list the sections and exit")
    p.add_argument("--report", metavar="RESULTS_JSON",
                   help="rebuild report.md, headline.md and the plots from a saved results.json")
    args = p.parse_args(argv)
    args.mode = args.mode or "quick"
    if args.only:
        unknown = [o for o in args.only if not any(n.startswith(o) for n in names)]
        if unknown:
            p.error(f"--only {' '.join(unknown)}: no such section; choose from {', '.join(names)}")
    for flag in ("actors", "repeats"):
        value = getattr(args, flag)
        if value is not None and value < (2 if flag == "repeats" else 1):
            p.error(f"--{flag} {value}: need at least {2 if flag == 'repeats' else 1}")
    return args


def selected(name: str, only: Sequence[str] | None) -> bool:
    return not only or any(name.startswith(o) for o in only)


def config(args: argparse.Namespace) -> Config:
    cfg = MODES[args.mode]
    if args.actors:
        cfg = dataclasses.replace(cfg, actors=args.actors)
    if args.repeats:
        r = args.repeats
        cfg = dataclasses.replace(cfg, repeats=r, batch_repeats=r, tiny_repeats=r,
                                  fault_repeats=r, call_repeats=r, hedge_repeats=r,
                                  drivers_repeats=r)
    return cfg


def chosen(cfg: Config, only: Sequence[str] | None) -> list[scenarios.Scenario]:
    """The Ray scenarios of this run: those named by --only, else those the mode runs (not the
    ones it skips, not those waiting for a library feature)."""
    return [s for s in scenarios.build(cfg) if selected(s.name, only)
            and (only or (s.name not in cfg.skip and not s.pending))]


# -- the run ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=False)
    cfg = config(args)
    ray_scenarios = chosen(cfg, args.only)
    sides = side.selected(cfg.mode, args.only)
    do_dc = selected("decision_cost", args.only)
    do_sim = selected("sim", args.only)
    do_theory = selected("theory", args.only)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": 3,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if args.argv is None
                                                      else args.argv),
        "mode": cfg.mode,
        "machine": provenance.machine(),
        "versions": provenance.versions(),
        "git": provenance.git(),
        "config": dataclasses.asdict(cfg),
        "default_policy": default_policy(),
        "policies": list(POLICIES),
        "ray": {"address": "not used", "actors": 0, "startup_s": math.nan},
        "scenarios": [],
        "side": [],
        "plots": {},
    }
    console.rule(f"actormesh benchmarks · {cfg.mode}")
    console.print(f"Machine: {provenance.machine_line(results)}; load average "
                  f"{results['machine']['load_average_at_start']}")
    g = results["git"]
    console.print(f"Commit {g['commit']}" + (f", with uncommitted changes in {len(g['changed'])} "
                                              "tracked files" if g["dirty"] else ", clean tree"))
    console.print(f"Default policy (am.ActorMesh's balancer=): {results['default_policy']}; "
                  f"its A/A twin: {twin_name(results['default_policy'])}")
    waiting = [s for s in scenarios.build(cfg) if s.pending and not args.only]
    for s in waiting:
        console.print(f"Not in this run: {s.name} ({s.title}): {s.pending}", highlight=False)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                        console=console, transient=True)
    with progress:
        task = progress.add_task("starting", total=None)

        def step(text: str) -> None:
            progress.update(task, description=text)

        started_ray = False
        ctx = None
        if ray_scenarios or sides:
            from benchmarks.harness import cluster
            from benchmarks.harness.context import Context

            step("starting Ray and the actors")
            started_ray, address = cluster.connect()
            results["ray"] = {"address": address, "actors": 0, "startup_s": math.nan}
            ctx = Context(cfg, step)
            if any(s.needs_fleet for s in ray_scenarios):
                ctx.fleet = cluster.Fleet.start(cfg, only=args.contenders)
                results["ray"]["actors"] = cfg.actors
        try:
            # While the actors start, the decision cost (in a process of its own: thread CPU time,
            # so sharing the machine does not inflate it) and the simulations (simulated time).
            pending_dc = start_decision_cost(cfg) if do_dc else None
            if do_sim:
                t = time.perf_counter()
                results["simulation"] = sim.run_all(SIMULATED_POLICIES, cfg.sim_actors,
                                                    cfg.sim_calls, cfg.sim_ref_actors,
                                                    cfg.sim_ref_calls, step)
                results["simulation"]["duration_s"] = time.perf_counter() - t
                console.print(terminal.sim_table(results["simulation"]))
            if do_theory:
                t = time.perf_counter()
                results["theory"] = theory.check(
                    cfg.theory_loads, {"random": cfg.theory_random, "pow2": cfg.theory_pow2},
                    progress=step)
                results["theory"]["duration_s"] = time.perf_counter() - t
                console.print(terminal.theory_table(results["theory"]))
            if pending_dc is not None:
                step("decision cost (no Ray)")
                results["decision_cost"] = finish_decision_cost(*pending_dc)
                console.print(terminal.decision_cost_table(results["decision_cost"]))
            if ctx is not None and ctx.fleet is not None:
                from benchmarks.harness import cluster

                step("waiting for the actors to start")
                ctx.fleet.wait_ready()
                results["ray"]["startup_s"] = ctx.fleet.started_s
                step("measuring the per-call overhead")
                results["calibration"] = cluster.calibrate(ctx.fleet, cfg)
                cal = results["calibration"]
                console.print(
                    f"Calibration: a {num(cal['service_s'] * 1e3)} ms call takes "
                    f"{num(cal['per_call_s'] * 1e3)} ms of actor time; loads are relative "
                    f"to {num(cal['capacity_per_s'])} calls/s for {cfg.actors} actors "
                    f"(nominal {num(cal['nominal_capacity_per_s'])}).")
            if ctx is not None:
                for sc in ray_scenarios:
                    settle_heap()
                    section = sc.run(ctx)
                    results["scenarios"].append(section)
                    console.print(terminal.scenario_table(section))
                    console.print(paragraph(section), style="italic", highlight=False)
                    console.print()
                close(ctx)
                ctx = None
            for name in sides:
                step(f"side scenario {name}")
                progress.stop()  # a side scenario prints its own progress
                console.rule(f"side scenario: {side.SIDE[name].title}")
                settle_heap()
                section = side.run(name, cfg.mode != "full", args.out)
                results["side"].append(section)
                console.print(section.get("skipped") or section.get("error")
                              or f"done in {num(section['duration_s'])} s", highlight=False)
                progress.start()
        finally:
            if ctx is not None:
                close(ctx)
            if started_ray:
                import ray

                ray.shutdown()
    results["duration_s"] = time.perf_counter() - started
    results["load_average_at_end"] = provenance.load_average()
    return results


def close(ctx: Any) -> None:
    """Shut down the fleet and what the scenarios shared, and free the meshes' callback cycles
    while Ray is still up."""
    if ctx.fleet is not None:
        ctx.fleet.shutdown()
        ctx.fleet = None
    ctx.close()
    gc.unfreeze()  # what `settle_heap` froze may now be garbage
    gc.collect()


def settle_heap() -> None:
    """Before each scenario: collect the driver's garbage, then freeze what is left
    (`gc.freeze`). The driver's heap (Ray, numpy, torch, the scenarios run before) is large: a
    full collection of it took ~95 ms and came every ~10 turns of 800 tiny calls, tripling the
    turn it landed in, whoever's turn that was (`gc.callbacks` around each turn). Frozen, the
    heap is left out of every collection, which then scans what the scenario made (2-3 ms)."""
    gc.collect()
    gc.freeze()


def start_decision_cost(cfg: Config) -> tuple[Any, Any, float]:
    """Start `benchmarks.without_ray.decision_cost.measure` in a fresh process (spawned: Ray's
    threads must not be forked); returns what `finish_decision_cost` needs."""
    from benchmarks.without_ray import decision_cost as dc

    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(dc.measure, list(dc.POLICIES), list(cfg.dc_sizes), cfg.dc_decisions,
                         budget_s=cfg.dc_budget_s)
    return pool, future, time.perf_counter()


def finish_decision_cost(pool: Any, future: Any, started: float) -> dict[str, Any]:
    try:
        rows = future.result()
    finally:
        pool.shutdown()
    return {
        "rows": rows,
        "duration_s": time.perf_counter() - started,
        "note": ("Nanoseconds per decision (one `submit` plus one `complete`, half the actors "
                 "busy), thread CPU time, best of 3, from `benchmarks/without_ray/"
                 "decision_cost.py`: *native* is a C++ loop over the scheduler; *via nanobind* "
                 "drives the native scheduler from a Python loop (what `choose` pays); *pure "
                 "Python* drives the same algorithm written in Python from the same loop: for "
                 "least_loaded, pull and sed an indexed heap like the native one "
                 "(`benchmarks/reference_heap.py`, twin *heap*), for the others the reference "
                 "(`benchmarks/reference.py`, twin *reference*, whose random and pow2 draw from "
                 "the same SplitMix64 generator as the native core to make its decisions; "
                 "Python's own `random` would be cheaper). *scan* is the readable reference, "
                 "which scans the actors: an extra line, not the comparison. Each twin is "
                 "checked to choose the native core's actors over the first 2,000 decisions. "
                 f"The Python loop alone costs about {num(rows[0]['loop_ns'])} ns. Measured in "
                 "a process of its own while the Ray actors start; CPU time of the measuring "
                 "thread is what other processes inflate least."),
    }


def list_sections(args: argparse.Namespace, say: Callable[[str], None] = print) -> None:
    cfg = config(args)
    for s in scenarios.build(cfg):
        note = (f" (prepared: {s.pending}; runs when named by --only)" if s.pending else
                f" (not in --{cfg.mode} unless named by --only)" if s.name in cfg.skip else "")
        say(f"{s.name:16} {s.title}{note}")
    for name, what in SECTIONS.items():
        say(f"{name:16} {what}")
    for name, sd in side.SIDE.items():
        say(f"{name:16} {sd.title} (side scenario{'' if sd.quick else ', only with --only'})")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.argv = list(argv) if argv is not None else None
    if args.list:
        list_sections(args)
        return 0
    results = output.read(args.report) if args.report else run(args)
    output.write(results, args.out, args.publish)
    terminal.show_headline(results)
    print(f"\nWrote {args.out}/results.json, report.md, headline.md and "
          f"{len(results['plots'])} plots in {num(results['duration_s'])} s.")
    return 0
