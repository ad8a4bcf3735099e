"""`python -m benchmarks.side.jax_broadcast`: JaxMesh start-up, and broadcasting a batch put once.

Two measurements, on a local Ray cluster started here (or the one at RAY_ADDRESS):

- start-up: `JaxMesh(...)` until `wait_ready()` returns, i.e. every process has joined
  `jax.distributed`, against a plain `ActorMesh` of the same class and size until `wait_ready()`
  (the Ray actors alone). The difference is what joining JAX costs.
- one broadcast step of a `--mb` MB batch to every process: `mesh.methods.consume.all(batch)`,
  which puts the batch in the object store once, against the usual loop
  `[actor.consume.remote(batch) for actor in actors]`, where Ray puts it once per call.
  `consume` only maps the batch (zero-copy from the object store) and returns its size, so the
  step measures the transport, not the work.

Each figure is the median of `--repeats` start-ups or `--steps` steps after one warm-up, the two
ways taking turns; min and max are shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

import actormesh as am
from actormesh.integrations.jax import JaxMesh
from benchmarks.harness.turns import summary, timed


class Consumer:
    """One process of the benchmark: receives batches."""

    @am.method
    def consume(self, batch: np.ndarray) -> int:
        return int(batch.nbytes)


def startup(processes: int, repeats: int) -> dict[str, dict[str, float]]:
    """Seconds from constructing the mesh until every actor is ready, JAX mesh and plain mesh."""
    def jax_mesh() -> None:
        with JaxMesh(Consumer, processes, platforms="cpu", num_cpus=0.5) as mesh:
            mesh.wait_ready(timeout=300)

    def plain_mesh() -> None:
        with am.ActorMesh(Consumer, processes, num_cpus=0.5) as mesh:
            mesh.wait_ready(timeout=300)

    jax_times, plain_times = timed([jax_mesh, plain_mesh], repeats,
                                   what=f"start-up, {processes} processes")
    return {"jax_mesh": summary(jax_times), "actor_mesh": summary(plain_times)}


def broadcast(processes: int, megabytes: int, repeats: int) -> dict[str, Any]:
    """Seconds for one step that hands the same batch to every process and waits for them."""
    batch = np.random.default_rng(0).integers(0, 255, megabytes * 10**6, dtype=np.uint8)
    with JaxMesh(Consumer, processes, platforms="cpu", num_cpus=0.5) as mesh:
        mesh.wait_ready(timeout=300)
        actors: list[Any] = mesh.actors

        def put_once() -> None:
            assert list(mesh.methods.consume.all(batch).get(timeout=300)) == [batch.nbytes] * processes

        def put_per_actor() -> None:
            sizes = ray.get([a.consume.remote(batch) for a in actors], timeout=300)
            assert sizes == [batch.nbytes] * processes

        once, per_actor = timed([put_once, put_per_actor], repeats,
                                what=f"{megabytes} MB broadcast steps")
    return {
        "batch_mb": batch.nbytes / 1e6,
        "put_once": {**summary(once), "object_store_writes_mb": batch.nbytes / 1e6},
        "put_per_actor": {**summary(per_actor),
                          "object_store_writes_mb": processes * batch.nbytes / 1e6},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.side.jax_broadcast",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", default="2", help="JAX processes, comma-separated (2)")
    parser.add_argument("--mb", type=int, default=50, help="batch size in MB (50)")
    parser.add_argument("--repeats", type=int, default=5, help="timed start-ups per mesh (5)")
    parser.add_argument("--steps", type=int, default=20, help="timed broadcast steps per way (20)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.processes.split(",")]

    if not ray.is_initialized():
        started = time.perf_counter()
        if os.environ.get("RAY_ADDRESS"):
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=max(8, max(counts)), include_dashboard=False,
                     log_to_driver=False,
                     # Ray refuses a store under 75 MiB; room for one batch per process and two.
                     object_store_memory=max((max(counts) + 2) * args.mb * 10**6, 100 * 2**20))
        print(f"ray.init: {time.perf_counter() - started:.1f} s")
    results: dict[str, Any] = {"mb": args.mb, "repeats": args.repeats, "steps": args.steps,
                               "runs": {}}
    print(f"{'processes':>9}  {'what':<36} {'median':>9} {'min':>9} {'max':>9}")
    for n in counts:
        up = startup(n, args.repeats)
        cast = broadcast(n, args.mb, args.steps)
        results["runs"][n] = {"startup": up, "broadcast": cast}
        rows = [
            ("start-up: JaxMesh until jax ready", up["jax_mesh"]),
            ("start-up: plain ActorMesh until ready", up["actor_mesh"]),
            (f"{args.mb} MB step: all() put once", cast["put_once"]),
            (f"{args.mb} MB step: put per actor", cast["put_per_actor"]),
        ]
        for label, row in rows:
            print(f"{n:>9}  {label:<36} {row['median_s'] * 1e3:>7.1f}ms {row['min_s'] * 1e3:>7.1f}ms "
                  f"{row['max_s'] * 1e3:>7.1f}ms")
        ratio = cast["put_per_actor"]["median_s"] / cast["put_once"]["median_s"]
        print(f"{n:>9}  put once is {ratio:.2f}x faster per step; object store writes "
              f"{cast['put_once']['object_store_writes_mb']:.0f} MB against "
              f"{cast['put_per_actor']['object_store_writes_mb']:.0f} MB")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
