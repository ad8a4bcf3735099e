"""What `choose` adds to a plain Ray call, measured on the same actors in one run.

Three contenders send the same no-op calls to the same actors:
- raw: `actor.f.remote()` round robin, what a user without a router writes;
- raw + notice: the same with a no-op `ObjectRef._on_ready` callback per call, the least any
  router that frees an actor's slot when its call ends (not when the caller reads it) must pay;
- choose: `mesh.methods.f.choose()` with the default balancer (pow2).

Calls are sent in blocks, then read, either as one batch (`ray.get` of every ObjectRef) or one by
one (`ray.get(ref)` / `future.get()`). The contenders take turns block by block, the order
shuffled every round, so the drift and noise of a shared 2-core machine hit all of them alike.
Reported: calls/s of each over all its blocks; its ratio to raw, as the median and quartiles of
the per-round ratios (robust to a round the machine stalled) and over all rounds; and driver CPU
per call (`time.process_time`, every thread of this process), with what it adds to raw's as the
median and quartiles of the per-round differences.

    python -m benchmarks.side.choose_overhead [--calls 1000] [--rounds 24] [--actors 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import ray
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

import actormesh as am
from benchmarks.harness import turns
from benchmarks.harness.workloads import Echo


def _noop(_: object) -> None:
    pass


def contenders(mesh: am.ActorMesh[Echo], calls: int) -> dict[str, Callable[[bool], None]]:
    actors, n = mesh.actors, len(mesh.actors)

    def raw(batch: bool) -> None:
        refs = [actors[i % n].f.remote(i) for i in range(calls)]
        read(refs, batch)

    def raw_notice(batch: bool) -> None:
        refs = []
        for i in range(calls):
            ref = actors[i % n].f.remote(i)
            ref._on_ready(_noop)
            refs.append(ref)
        read(refs, batch)

    def choose(batch: bool) -> None:
        futures = [mesh.methods.f.choose(i) for i in range(calls)]
        if batch:
            ray.get([f.ref for f in futures])
        else:
            for future in futures:
                future.get()

    return {"raw": raw, "raw + notice": raw_notice, "choose": choose}


def read(refs: list[Any], batch: bool) -> None:
    if batch:
        ray.get(refs)
    else:
        for ref in refs:
            ray.get(ref)


def measure(runs: dict[str, Callable[[bool], None]], rounds: int, batch: bool,
            progress: Callable[[str], None] = lambda s: None,
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds per block, per contender; in an order shuffled every round."""
    names = list(runs)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in turns.order(names, r, "choose_overhead"):
            progress(f"round {r + 1}/{rounds} · {name}")
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            runs[name](batch)
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def report(wall: dict[str, list[float]], cpu: dict[str, list[float]], calls: int) -> None:
    raw_rate = len(wall["raw"]) * calls / sum(wall["raw"])
    for name in wall:
        rate = len(wall[name]) * calls / sum(wall[name])
        cpu_us = sum(cpu[name]) / (len(cpu[name]) * calls) * 1e6
        line = f"  {name:13s} {rate:5.0f} calls/s"
        if name != "raw":
            per_round = [r / c for r, c in zip(wall["raw"], wall[name])]
            q1, q2, q3 = quartiles(per_round)
            line += (f"  ÷ raw: {q2:.3f} median of rounds (quartiles {q1:.2f}-{q3:.2f}), "
                     f"{rate / raw_rate:.3f} over all")
        line += f"; driver CPU {cpu_us:3.0f} us/call"
        if name != "raw":
            extra = [(c - r) / calls * 1e6 for r, c in zip(cpu["raw"], cpu[name])]
            e1, e2, e3 = quartiles(extra)
            line += (f", {e2:+.1f} us over raw (median of rounds, quartiles {e1:+.1f} to "
                     f"{e3:+.1f})")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per block")
    parser.add_argument("--rounds", type=int, default=24, help="blocks per contender and mode")
    parser.add_argument("--actors", type=int, default=4)
    opts = parser.parse_args()
    if opts.rounds < 2:
        parser.error(f"--rounds {opts.rounds}: need at least 2 for quartiles")
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    mesh = am.ActorMesh(Echo, shape=opts.actors, num_cpus=0.1)
    mesh.wait_ready()
    runs = contenders(mesh, opts.calls)
    for batch in (True, False):
        mode = "as one batch" if batch else "one by one"
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      transient=True) as bar:
            task = bar.add_task(mode, total=(opts.rounds + 1) * len(runs))

            def step(text: str, task: TaskID = task, bar: Progress = bar, mode: str = mode) -> None:
                bar.update(task, description=f"results read {mode} · {text}", advance=1)

            measure(runs, 1, batch, step)  # warm up
            wall, cpu = measure(runs, opts.rounds, batch, step)
        print(f"{opts.calls} no-op calls per block over {opts.actors} actors, {opts.rounds} rounds, "
              f"results read {mode}:")
        report(wall, cpu, opts.calls)
    mesh.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
