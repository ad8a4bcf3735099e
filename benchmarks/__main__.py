"""`python -m benchmarks [--quick | --full] [--out DIR] [--only NAME...]`: what `choose` wins.

Runs, in one go and on a local Ray cluster it starts itself (or the one at RAY_ADDRESS):
the decision cost of every policy, native against the same algorithm in pure Python; a
simulation of the native balancer at 4096 actors and its check against queueing theory (no Ray,
labelled SIMULATED); the Ray scenarios, each played by every actormesh policy and by the
baselines users have today (random choice, raw round robin, ray.util.ActorPool), with an A/A
control and bootstrap intervals for every ratio; and the side scenarios registered in
`benchmarks.side`. Writes results.json, report.md, headline.md (the README's table, verbatim)
and PNG plots to bench-results/ (or --out), and prints a table per scenario and the headline.

For a bigger machine or a real cluster, run on one of its nodes (actormesh installed on every
node): `RAY_ADDRESS=auto python -m benchmarks --full` (or `RAY_ADDRESS=<head>:6379`); the harness
then joins that cluster instead of starting one. `--actors N` sets the number of actors.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import headline, plots, report, scenarios, side, sim, theory
from .contenders import BASELINES, POLICIES

SECTIONS = {"decision_cost": "decision cost per policy and N (no Ray)",
            "sim": "SIMULATED queue model at 4096 actors (no Ray)",
            "theory": "SIMULATED mean time in system against queueing theory (no Ray)"}
PUBLISH_DIR = os.path.dirname(os.path.realpath(__file__))  # benchmarks/: the README's plot


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ([s.name for s in scenarios.build(scenarios.QUICK)] + list(SECTIONS)
             + list(side.SIDE))
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
        epilog="Sections: " + ", ".join(names) + ". A prefix selects several (uniform, tiny, "
               "batch). To use an existing Ray cluster, set RAY_ADDRESS.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="about seven minutes on two cores (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="longer runs, 16 actors per mesh, 5 repeats, 1M simulated calls")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="tiny sizes, for the test suite")
    p.add_argument("--out", default="bench-results", help="output directory (bench-results)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these sections")
    p.add_argument("--contenders", nargs="+", metavar="NAME",
                   choices=[*POLICIES, *BASELINES],
                   help="run only these contenders (policies, ray-random, ray-rr, ActorPool)")
    p.add_argument("--actors", type=int, help="actors per mesh (default 8 quick, 16 full)")
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
    return args


def selected(name: str, only: Sequence[str] | None) -> bool:
    return not only or any(name.startswith(o) for o in only)


# -- facts about the run ------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = math.nan
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = math.nan
    return {"cpu_model": model, "nproc": os.cpu_count(), "memory_gib": round(memory, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "hostname": platform.node(), "load_average_at_start": round(load, 2)}


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("actormesh", "ray", "numpy", "nanobind", "matplotlib", "rich"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git() -> dict[str, Any]:
    """The commit measured, and whether tracked files differed from it (untracked ones do not
    count: other work in the checkout that nothing imports)."""
    root = os.path.dirname(PUBLISH_DIR)

    def run(*cmd: str) -> str:
        return subprocess.run(["git", "-C", root, *cmd], capture_output=True, text=True,
                              timeout=10).stdout.rstrip("\n")

    try:
        commit = run("rev-parse", "--short", "HEAD")
        changed = [line[3:] for line in run("status", "--porcelain",
                                            "--untracked-files=no").splitlines()]
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None, "changed": []}
    return {"commit": commit or "unknown", "dirty": bool(changed), "changed": changed,
            "subject": run("log", "-1", "--format=%s") if commit else ""}


def clean(value: Any) -> Any:
    """NaN and infinity as null, so results.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


# Keys whose null means "none" (no control, no such contender), not a number that was NaN.
NULLABLE = {"control", "strongest", "best", "vs_strongest", "vs_random", "best_vs_strongest",
            "no_control", "native_ns", "scan_ns", "dirty"}


def unclean(value: Any, key: str = "") -> Any:
    """Back from results.json: null metric values become NaN again."""
    if value is None:
        return None if key in NULLABLE else math.nan
    if isinstance(value, dict):
        return {k: unclean(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [unclean(v) for v in value]
    return value


# -- the run ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=False)
    cfg = scenarios.MODES[args.mode]
    if args.actors:
        cfg = dataclasses.replace(cfg, actors=args.actors)
    if args.repeats:
        cfg = dataclasses.replace(cfg, repeats=args.repeats,
                                  tiny_repeats=max(args.repeats, 1))
    ray_scenarios = [s for s in scenarios.build(cfg) if selected(s.name, args.only)
                     and (args.only or s.name not in cfg.skip)]
    sides = side.selected(cfg.mode, args.only)
    do_dc = selected("decision_cost", args.only)
    do_sim = selected("sim", args.only)
    do_theory = selected("theory", args.only)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": 2,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if args.argv is None
                                                      else args.argv),
        "mode": cfg.mode,
        "machine": machine(),
        "versions": versions(),
        "git": git(),
        "config": dataclasses.asdict(cfg),
        "ray": {"address": "not used", "actors": 0, "startup_s": math.nan},
        "scenarios": [],
        "side": [],
        "plots": {},
    }
    console.rule(f"actormesh benchmarks · {cfg.mode}")
    console.print(f"Machine: {report.machine_line(results)}")
    g = results["git"]
    console.print(f"Commit {g['commit']}" + (f", with uncommitted changes in {len(g['changed'])} "
                                              "tracked files" if g["dirty"] else ", clean tree"))

    contenders = len(args.contenders or [*POLICIES, *BASELINES])
    total = sum((s.repeats or cfg.repeats) * contenders + 1 for s in ray_scenarios)
    total += (len(POLICIES) * (len(sim.scenarios()) + 1)) if do_sim else 0
    total += 2 * len(cfg.theory_loads) if do_theory else 0
    total += 1 if do_dc else 0
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console, transient=True)
    with progress:
        task = progress.add_task("starting", total=total)

        def step(text: str) -> None:
            progress.update(task, description=text, advance=1)

        fleet = None
        started_ray = False
        if ray_scenarios or sides:
            from . import runner

            progress.update(task, description="starting Ray and the actors")
            started_ray, address = runner.connect(cfg)
            results["ray"] = {"address": address, "actors": 0, "startup_s": math.nan}
        if ray_scenarios:
            fleet = runner.Fleet.start(cfg, only=args.contenders)
            results["ray"] |= {"actors": fleet.actor_count, "shared_actors": fleet.shared,
                               "not_shared_because": fleet.not_shared_because}
            if not fleet.shared:
                console.print(
                    "[bold yellow]Could not share actors between contenders[/] "
                    f"({fleet.not_shared_because}): each policy runs on actors of its own, so "
                    "`choose` and the raw baselines are no longer compared on the same "
                    "processes.", highlight=False)
        try:
            # While the actors start, the decision cost (in a process of its own: thread CPU time,
            # so sharing the machine does not inflate it) and the simulations (simulated time).
            pending_dc = start_decision_cost(cfg) if do_dc else None
            if do_sim:
                first = [True]

                def sim_step(text: str) -> None:
                    if not first[0]:
                        progress.advance(task)
                    first[0] = False
                    progress.update(task, description=text)

                t = time.perf_counter()
                results["simulation"] = sim.run_all(POLICIES, cfg.sim_actors, cfg.sim_calls,
                                                    cfg.sim_ref_actors, cfg.sim_ref_calls,
                                                    sim_step)
                results["simulation"]["duration_s"] = time.perf_counter() - t
                progress.advance(task)
                console.print(sim_table(results["simulation"]))
            if do_theory:
                t = time.perf_counter()
                results["theory"] = theory.check(
                    cfg.theory_loads, {"random": cfg.theory_random, "pow2": cfg.theory_pow2},
                    progress=step)
                results["theory"]["duration_s"] = time.perf_counter() - t
                console.print(theory_table(results["theory"]))
            if pending_dc is not None:
                progress.update(task, description="decision cost (no Ray)")
                results["decision_cost"] = finish_decision_cost(*pending_dc)
                progress.advance(task)
                console.print(decision_cost_table(results["decision_cost"]))
            if fleet is not None:
                progress.update(task, description="waiting for the actors to start")
                fleet.wait_ready()
                results["ray"]["startup_s"] = fleet.started_s
                progress.update(task, description="measuring the per-call overhead")
                results["calibration"] = runner.calibrate(fleet, cfg)
                cal = results["calibration"]
                console.print(
                    f"Calibration: a {report.num(cal['service_s'] * 1e3)} ms call takes "
                    f"{report.num(cal['per_call_s'] * 1e3)} ms of actor time; loads are relative "
                    f"to {report.num(cal['capacity_per_s'])} calls/s for {cfg.actors} actors "
                    f"(nominal {report.num(cal['nominal_capacity_per_s'])}).")
                results["contenders"] = [
                    {"name": c.name, "label": c.label, "family": c.family,
                     "display": report.display({"name": c.name, "family": c.family})}
                    for c in fleet.contenders]
                for sc in ray_scenarios:
                    section = runner.run_scenario(fleet, cfg, sc, step)
                    results["scenarios"].append(section)
                    console.print(report.rich_table(section))
                    console.print(report.paragraph(section), style="italic", highlight=False)
                    console.print()
                fleet.shutdown()
                fleet = None
                gc.collect()  # the meshes' callbacks form cycles; free them while Ray is up
            for name in sides:
                progress.update(task, description=f"side scenario {name}")
                progress.stop()  # a side scenario prints its own progress
                console.rule(f"side scenario: {side.SIDE[name].title}")
                section = side.run(name, cfg.mode != "full", args.out)
                results["side"].append(section)
                console.print(section.get("skipped") or section.get("error")
                              or f"done in {report.num(section['duration_s'])} s",
                              highlight=False)
                progress.start()
        finally:
            if fleet is not None:
                fleet.shutdown()
                del fleet
                gc.collect()
            if started_ray:
                import ray

                ray.shutdown()
    results["duration_s"] = time.perf_counter() - started
    return results


def start_decision_cost(cfg: scenarios.Config) -> tuple[Any, Any, float]:
    """Start `benchmarks.decision_cost.measure` in a fresh process (spawned: Ray's threads must
    not be forked); returns what `finish_decision_cost` needs."""
    import concurrent.futures as cf
    import multiprocessing

    from . import decision_cost as dc

    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(dc.measure, list(POLICIES), list(cfg.dc_sizes), cfg.dc_decisions,
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
                 "busy), thread CPU time, best of 3, from `benchmarks/decision_cost.py`: *native* "
                 "is a C++ loop over the scheduler; *via nanobind* drives the native scheduler "
                 "from a Python loop (what `choose` pays); *pure Python* drives the same "
                 "algorithm written in Python from the same loop: for least_loaded, pull and sed "
                 "an indexed heap like the native one (`benchmarks/reference_heap.py`, twin "
                 "*heap*), for the others the reference (`benchmarks/reference.py`, twin "
                 "*reference*, whose random and pow2 draw from the same SplitMix64 generator as "
                 "the native core to make its decisions; Python's own `random` would be "
                 "cheaper). *scan* is the readable reference, which scans the actors: an extra "
                 "line, not the comparison. Each twin is checked to choose the native core's "
                 "actors over the first 2,000 decisions. The Python loop alone costs about "
                 f"{report.num(rows[0]['loop_ns'])} ns. Measured in a process of its own while "
                 "the Ray actors start; CPU time of the measuring thread is what other processes "
                 "inflate least."),
    }


def decision_cost_table(dc: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="Decision cost: ns per decision through nanobind (the same algorithm in pure "
              "Python ÷ that); report.md has every column", title_justify="left",
              show_edge=False)
    sizes = sorted({r["num_actors"] for r in dc["rows"]})
    t.add_column("policy")
    for n in sizes:
        t.add_column(f"N={n}", justify="right")
    for policy in dict.fromkeys(r["policy"] for r in dc["rows"]):
        cells = []
        for n in sizes:
            r = next((r for r in dc["rows"] if r["policy"] == policy and r["num_actors"] == n),
                     None)
            cells.append("–" if r is None else
                         f"{report.num(r['via_python_ns'])} "
                         f"({report.num(r['python_ns'] / r['via_python_ns'], 2)}×"
                         + ("" if r["same_decisions"] else ", decisions differ!") + ")")
        t.add_row(policy, *cells)
    return t


def sim_table(s: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"SIMULATED (no Ray): {s['actors']} actors, {s['calls']:,} calls — p99 "
              "latency in mean service times (batch: makespan ÷ lower bound)",
              title_justify="left", show_edge=False)
    t.add_column("policy")
    for sc in s["scenarios"]:
        t.add_column(sc["title"], justify="right")
    t.add_column("same as reference", justify="right")
    same = {r["policy"]: r["identical"] for r in s.get("reference", {}).get("rows", [])}
    for i, policy in enumerate(r["policy"] for r in s["scenarios"][0]["policies"]):
        cells = []
        for sc in s["scenarios"]:
            r = sc["policies"][i]
            cells.append(report.num(r["p99"] if sc["load"] is not None
                                    else r["makespan_over_bound"]))
        t.add_row(policy, *cells, "yes" if same.get(policy) else "NO")
    return t


def theory_table(th: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="SIMULATED against queueing theory: mean time in system (mean service times)",
              title_justify="left", show_edge=False)
    for h in ("policy", "λ", "formula", "predicted", "measured ± SE", "agrees"):
        t.add_column(h, justify="left" if h in ("policy", "formula") else "right")
    for r in th["rows"]:
        t.add_row(r["policy"], f"{r['load']:g}", r["formula"], report.num(r["predicted"]),
                  f"{report.num(r['measured'])} ± {report.num(r['se'], 2)}",
                  "yes" if r["agrees"] else "NO")
    return t


def write(results: dict[str, Any], out: str, publish: bool,
          say: Callable[[str], None] = print) -> None:
    """results.json, report.md, headline.md and the plots; with `publish`, the README's plot."""
    os.makedirs(out, exist_ok=True)
    figures: dict[str, str] = {}
    for s in results["scenarios"]:
        name = (plots.throughput_bars(s, out) if s["kind"] == "throughput"
                else plots.latency_cdf(s, out))
        if name:
            figures[s["name"]] = name
    if results.get("decision_cost"):
        name = plots.decision_cost(results["decision_cost"]["rows"], out)
        if name:
            figures["decision_cost"] = name
    if results.get("simulation"):
        name = plots.simulation(results["simulation"], out)
        if name:
            figures["simulation"] = name
    results["plots"] = figures
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(clean(results), f, indent=1, allow_nan=False)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report.report_md(results))
    with open(os.path.join(out, "headline.md"), "w") as f:
        f.write(headline.markdown(results))
    if publish and figures.get("straggler"):
        target = os.path.join(PUBLISH_DIR, "README_straggler.png")
        shutil.copy(os.path.join(out, figures["straggler"]), target)
        say(f"Published {target}")


def show_headline(results: dict[str, Any]) -> None:
    """The headline on the terminal, one block per row (headline.md has it as a table)."""
    from rich.console import Console

    console = Console()
    say = functools.partial(console.print, markup=False, highlight=False)
    header, body = headline.ray_table(headline.ray_rows(results))
    if body:
        console.rule("Headline: ratio > 1 = actormesh better, [95% interval], A/A = the noise")
        for row in body:
            say(row[0], style="bold")
            for label, cell in zip(header[2:], row[2:]):
                say(f"    {label}: {cell.replace('**', '')}")
    for what, ratio, control, verdict in headline.side_rows(results):
        say(what, style="bold")
        say(f"    {ratio}; A/A {control}: {verdict}")
    other = headline.other_rows(results)
    if other:
        console.rule("Without Ray")
        for what, result, check in other:
            say(what, style="bold")
            say(f"    {result} ({check.replace('**', '')})")
    console.rule()
    say(headline.provenance(results))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.argv = list(argv) if argv is not None else None
    if args.list:
        cfg = scenarios.MODES[args.mode]
        for s in scenarios.build(cfg):
            print(f"{s.name:16} {s.title}" + (f" (not in --{cfg.mode} unless named by --only)"
                                              if s.name in cfg.skip else ""))
        for name, what in SECTIONS.items():
            print(f"{name:16} {what}")
        for name, sd in side.SIDE.items():
            print(f"{name:16} {sd.title} (side scenario{'' if sd.quick else ', only with --only'})")
        return 0
    if args.report:
        with open(args.report) as f:
            results = unclean(json.load(f))
    else:
        results = run(args)
    write(results, args.out, args.publish)
    show_headline(results)
    print(f"\nWrote {args.out}/results.json, report.md, headline.md and "
          f"{len(results['plots'])} plots in {report.num(results['duration_s'])} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
