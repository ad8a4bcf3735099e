"""`python -m benchmarks [--quick | --full] [--out DIR] [--only NAME...]`: what `choose` wins.

Runs, in one go and on a local Ray cluster it starts itself (or the one at RAY_ADDRESS):
the decision cost of every policy, native against its pure-Python reference; a simulation of the
native balancer at 4096 actors (no Ray, labelled SIMULATED); and the Ray scenarios, each played by
every actormesh policy and by the baselines users have today (random choice, raw round robin,
ray.util.ActorPool). Writes results.json, report.md and PNG plots to bench-results/ (or --out)
and prints a table per scenario and the headline ratios.

For a bigger machine or a real cluster, run on one of its nodes (actormesh installed on every
node): `RAY_ADDRESS=auto python -m benchmarks --full` (or `RAY_ADDRESS=<head>:6379`); the harness
then joins that cluster instead of starting one. `--actors N` sets the number of actors.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
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

from . import plots, report, scenarios, sim
from .contenders import POLICIES

SECTIONS = ("decision_cost", "sim")
PUBLISH_DIR = os.path.dirname(os.path.abspath(__file__))  # benchmarks/: README results and plot


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = [s.name for s in scenarios.build(scenarios.QUICK)] + list(SECTIONS)
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
        epilog="Sections: " + ", ".join(names) + ". A prefix selects several (uniform, tiny, "
               "batch). To use an existing Ray cluster, set RAY_ADDRESS.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="about five minutes on two cores (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="longer runs, 16 actors per mesh, 5 repeats, 1M simulated calls")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="tiny sizes, for the test suite")
    p.add_argument("--out", default="bench-results", help="output directory (bench-results)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these sections")
    p.add_argument("--contenders", nargs="+", metavar="NAME",
                   choices=[*POLICIES, *report.BASELINES],
                   help="run only these contenders (policies, ray-random, ray-rr, ActorPool)")
    p.add_argument("--actors", type=int, help="actors per mesh (default 8 quick, 16 full)")
    p.add_argument("--repeats", type=int, help="repeats per scenario")
    p.add_argument("--publish", action="store_true",
                   help="also write benchmarks/README_RESULTS.md and its plot for the README")
    p.add_argument("--list", action="store_true", help="list the sections and exit")
    p.add_argument("--report", metavar="RESULTS_JSON",
                   help="rebuild report.md and the plots from a saved results.json (no run)")
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
    try:
        root = os.path.dirname(PUBLISH_DIR)
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        out["git"] = commit + ("+dirty" if dirty else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        out["git"] = "unknown"
    return out


def clean(value: Any) -> Any:
    """NaN and infinity as null, so results.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def unclean(value: Any) -> Any:
    """Back from results.json: null metric values become NaN again."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: unclean(v) for k, v in value.items()}
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
    ray_scenarios = [s for s in scenarios.build(cfg) if selected(s.name, args.only)]
    do_dc = selected("decision_cost", args.only)
    do_sim = selected("sim", args.only)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": 1,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if args.argv is None
                                                      else args.argv),
        "mode": cfg.mode,
        "machine": machine(),
        "versions": versions(),
        "config": dataclasses.asdict(cfg),
        "ray": {"address": "not used", "actors": 0, "startup_s": math.nan},
        "scenarios": [],
        "plots": {},
    }
    console.rule(f"actormesh benchmarks · {cfg.mode}")
    console.print(f"Machine: {report.machine_line(results)}")

    total = (len(ray_scenarios) and sum(
        (s.repeats or cfg.repeats) * len(args.contenders or [*POLICIES, *report.BASELINES])
        for s in ray_scenarios))
    total += (len(POLICIES) * (len(sim.scenarios()) + 1)) if do_sim else 0
    total += 1 if do_dc else 0
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console, transient=True)
    with progress:
        task = progress.add_task("starting", total=total)

        def step(text: str) -> None:
            progress.update(task, description=text, advance=1)

        fleet = None
        started_ray = False
        if ray_scenarios:
            from . import runner

            progress.update(task, description="starting Ray and the actors")
            started_ray, address = runner.connect(cfg)
            fleet = runner.Fleet.start(cfg, only=args.contenders)
            results["ray"] = {"address": address, "actors": fleet.actor_count,
                              "shared_actors": fleet.shared, "startup_s": math.nan}
        try:
            # While the actors start, the decision cost (in a process of its own: thread CPU time,
            # so sharing the machine does not inflate it) and the simulation (simulated time).
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
        finally:
            if fleet is not None:
                fleet.shutdown()
                del fleet
                gc.collect()  # the meshes' callbacks form cycles; free them while Ray is up
            if started_ray:
                import ray

                ray.shutdown()
    results["duration_s"] = time.perf_counter() - started
    results["headlines"] = report.headlines(results)
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
                 "busy), thread CPU time, from `benchmarks/decision_cost.py`: *native* is a C++ "
                 "loop over the scheduler; *via nanobind* drives the native scheduler from a "
                 "Python loop; *reference* drives the pure-Python twin of the same policy "
                 "(`benchmarks/reference.py`) from the same loop. The Python loop alone costs "
                 f"about {report.num(rows[0]['loop_ns'])} ns. Measured in a process of its own "
                 "while the Ray actors start; CPU time of the measuring thread is what other "
                 "processes inflate least."),
    }


def decision_cost_table(dc: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="Decision cost: native ns per decision (pure-Python reference ÷ native); "
              "report.md has the nanobind column", title_justify="left", show_edge=False)
    sizes = sorted({r["num_actors"] for r in dc["rows"]})
    t.add_column("policy")
    for n in sizes:
        t.add_column(f"N={n}", justify="right")
    for policy in dict.fromkeys(r["policy"] for r in dc["rows"]):
        cells = []
        for n in sizes:
            r = next((r for r in dc["rows"] if r["policy"] == policy and r["num_actors"] == n),
                     None)
            cells.append("–" if r is None or not r.get("native_ns") else
                         f"{report.num(r['native_ns'])} "
                         f"({report.num(r['reference_ns'] / r['native_ns'], 2)}×)")
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


def write(results: dict[str, Any], out: str, publish: bool,
          say: Callable[[str], None] = print) -> None:
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
    readme_plot = figures.get("straggler")
    with open(os.path.join(out, "README_RESULTS.md"), "w") as f:
        f.write(report.readme_snippet(results, readme_plot))
    if publish:
        plot = None
        if readme_plot:
            shutil.copy(os.path.join(out, readme_plot),
                        os.path.join(PUBLISH_DIR, "README_straggler.png"))
            plot = "benchmarks/README_straggler.png"
        with open(os.path.join(PUBLISH_DIR, "README_RESULTS.md"), "w") as f:
            f.write(report.readme_snippet(results, plot))
        say(f"Published {os.path.join(PUBLISH_DIR, 'README_RESULTS.md')}")


def show_headlines(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Headlines (measured in this run)", title_justify="left", show_edge=False)
    t.add_column("what")
    t.add_column("result")
    t.add_column("goal")
    for h in results["headlines"]:
        met = h.get("met")
        mark = "" if met is None else (" ✓" if met else " ✗")
        t.add_row(h["what"], h["text"], h.get("goal", "") + mark)
    Console().print(t)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.argv = list(argv) if argv is not None else None
    if args.list:
        for s in scenarios.build(scenarios.MODES[args.mode]):
            print(f"{s.name:16} {s.title}")
        for name in SECTIONS:
            print(f"{name:16} {'decision cost per policy and N' if name == 'decision_cost' else 'SIMULATED queue model, no Ray'}")
        return 0
    if args.report:
        with open(args.report) as f:
            results = unclean(json.load(f))
        results["headlines"] = report.headlines(results)
    else:
        results = run(args)
    write(results, args.out, args.publish)
    show_headlines(results)
    print(f"\nWrote {args.out}/results.json, {args.out}/report.md and "
          f"{len(results['plots'])} plots in {report.num(results['duration_s'])} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
