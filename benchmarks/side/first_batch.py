"""A new mesh's first batch with a straggler among its actors, against `ray.util.ActorPool`.

A mesh knows nothing of its actors' speeds at first: an actor's first call may have waited for
its `__init__`, so its speed is known from its second. What the default does meanwhile decides
how many calls a straggler takes before it is known to be one. Each round: a mesh made anew
over the same actors (`ActorMesh.from_actors`) runs a batch of calls sent at once (exponential
service times, one actor `--slowdown` times slower), then `ray.util.ActorPool.map_unordered`
runs the same batch on the same actors; the two take turns, so both see the same machine.
Printed: each one's makespan (mean, median, 90th percentile, worst) and the calls the slow
actor ran.

    python -m benchmarks.side.first_batch [--rounds 30] [--calls 96] [--actors 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import ray
from ray.util import ActorPool

import actormesh as am
from benchmarks.harness.workloads import BenchWorker


def mesh_round(actors: list[Any], durations: np.ndarray, slow: int) -> tuple[float, int]:
    """(makespan, calls the slow actor ran) of the batch through a mesh made for it."""
    mesh: am.ActorMesh[BenchWorker] = am.ActorMesh.from_actors(actors)
    try:
        start = time.perf_counter()
        futures = [mesh.methods.work.choose(i, float(d)) for i, d in enumerate(durations)]
        ranks = [future.get(timeout=120)[1] for future in futures]
        return time.perf_counter() - start, ranks.count(slow)
    finally:
        mesh.shutdown()


def pool_round(actors: list[Any], durations: np.ndarray, slow: int) -> tuple[float, int]:
    """(makespan, calls the slow actor ran) of the batch through `ray.util.ActorPool`."""
    def submit(actor: Any, item: tuple[int, float]) -> Any:
        return actor.work.remote(*item)

    pool = ActorPool(actors)
    start = time.perf_counter()
    results = list(pool.map_unordered(submit, [(i, float(d)) for i, d in enumerate(durations)]))
    return time.perf_counter() - start, sum(1 for _, rank, _ in results if rank == slow)


def summary(name: str, makespans: list[float], slow_calls: list[int]) -> str:
    ordered = sorted(makespans)
    return (f"{name}: makespan mean {statistics.mean(ordered):.3f} s, median "
            f"{statistics.median(ordered):.3f} s, p90 {ordered[int(0.9 * len(ordered))]:.3f} s, "
            f"worst {ordered[-1]:.3f} s; calls on the slow actor: mean "
            f"{statistics.mean(slow_calls):.2f}, most {max(slow_calls)}")


def main() -> None:
    parser = argparse.ArgumentParser(description="A new mesh's first batch with a straggler")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=96)
    parser.add_argument("--actors", type=int, default=8)
    parser.add_argument("--mean-s", type=float, default=0.010)
    parser.add_argument("--slowdown", type=float, default=10.0)
    args = parser.parse_args()
    ray.init(num_cpus=max(8, args.actors), log_to_driver=False)
    owner = am.ActorMesh(BenchWorker, shape=args.actors, num_cpus=0.5)
    try:
        owner.wait_ready(timeout=300)
        slow = args.actors // 2
        ray.get([actor.set_slowdown.remote(args.slowdown if rank == slow else 1.0)
                 for rank, actor in enumerate(owner.actors)], timeout=60)
        actors = list(owner.actors)
        mesh: tuple[list[float], list[int]] = ([], [])
        pool: tuple[list[float], list[int]] = ([], [])
        for round_ in range(args.rounds):
            durations = np.random.default_rng(round_).exponential(args.mean_s, args.calls)
            for out, play in ((mesh, mesh_round), (pool, pool_round)):
                makespan, slow_calls = play(actors, durations, slow)
                out[0].append(makespan)
                out[1].append(slow_calls)
        print(f"{args.calls} calls at once, exponential {args.mean_s * 1e3:g} ms, {args.actors} "
              f"actors, rank {slow} {args.slowdown:g}x slower; {args.rounds} rounds taking turns")
        print(summary("a new mesh (the default)", *mesh))
        print(summary("ray.util.ActorPool      ", *pool))
    finally:
        owner.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
