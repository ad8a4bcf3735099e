"""What `choose` adds to a plain Ray call, measured on the same actors in one run.

Two views, each over interleaved repeats (the order alternates, so drift hits both sides):
- calls/s: N no-op calls sent, then every result read, `choose` against `actor.f.remote()` in turn;
- driver CPU per call (`time.process_time`, every thread of this process), the cost that matters
  when the driver shares its cores, with results read one by one or as one batch.

    python -m benchmarks.choose_overhead [--calls 3000] [--repeats 8] [--actors 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import ray

import actormesh as am


class Echo:
    @am.method
    def f(self, x: int) -> int:
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--actors", type=int, default=4)
    opts = parser.parse_args()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    mesh = am.ActorMesh(Echo, shape=opts.actors, num_cpus=0.1)
    mesh.wait_ready()
    actors, n, calls = mesh.actors, opts.actors, opts.calls

    def raw_batch() -> None:
        ray.get([actors[i % n].f.remote(i) for i in range(calls)])

    def raw_each() -> None:
        for ref in [actors[i % n].f.remote(i) for i in range(calls)]:
            ray.get(ref)

    def choose_batch() -> None:
        futures = [mesh.methods.f.choose(i) for i in range(calls)]
        ray.get([f.ref for f in futures])

    def choose_each() -> None:
        for future in [mesh.methods.f.choose(i) for i in range(calls)]:
            future.get()

    contenders: list[tuple[str, Callable[[], None]]] = [
        ("raw, batch", raw_batch), ("choose, batch", choose_batch),
        ("raw, each", raw_each), ("choose, each", choose_each),
    ]
    wall: dict[str, list[float]] = {name: [] for name, _ in contenders}
    cpu: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for repeat in range(opts.repeats):
        for name, run in contenders if repeat % 2 == 0 else contenders[::-1]:
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    print(f"{calls} no-op calls over {n} actors, median of {opts.repeats} interleaved repeats")
    for mode in ("batch", "each"):
        raw, ours = f"raw, {mode}", f"choose, {mode}"
        ratios = [r / c for r, c in zip(wall[raw], wall[ours])]
        cpu_raw = statistics.median(cpu[raw]) / calls * 1e6
        cpu_ours = statistics.median(cpu[ours]) / calls * 1e6
        print(f"results read {mode:5s}: choose calls/s / raw calls/s = {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}); driver CPU per call raw {cpu_raw:.0f} us, "
              f"choose {cpu_ours:.0f} us (+{(cpu_ours / cpu_raw - 1) * 100:.0f}%)")
    mesh.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
