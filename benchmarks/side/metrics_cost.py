"""What a mesh's metrics cost on tiny calls, against the goal of 1% of their throughput.

The call path pays `MeshMetrics.call_ended` per call and `task_sent` per Ray task (plain Python
counters); the export to Ray runs every 2 s on the library's loop thread. Measured:
1. the hooks alone: ns of CPU per call (one `call_ended`, and a `task_sent` per batch of 16
   calls);
2. on real actors, in alternating rounds: tiny no-op calls through `map` (they ride together, the
   fastest the library sends calls), calls/s and driver CPU per call;
3. the share: the metrics' CPU per call over the driver CPU a call costs, and a flush's cost.

    python -m benchmarks.side.metrics_cost [--calls 4000] [--rounds 6] [--actors 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

import actormesh as am
from actormesh._metrics import MeshMetrics
from benchmarks.harness.workloads import Echo


def hooks_ns(calls: int) -> float:
    """ns of CPU per call of what the call path reports, on a metrics object of its own (this
    thread's CPU time: a shared machine's other work does not count)."""
    metrics = MeshMetrics("metrics-cost")
    try:
        start = time.thread_time_ns()
        for i in range(calls):
            metrics.call_ended("f", "ok", 0.0002)
            if i % 16 == 0:
                metrics.task_sent("f", 16)
        return (time.thread_time_ns() - start) / calls
    finally:
        metrics.close()


def flush_ms(calls: int) -> float:
    """ms of one export to Ray after `calls` calls of one method."""
    metrics = MeshMetrics("metrics-cost-flush")
    try:
        for _ in range(calls):
            metrics.call_ended("f", "ok", 0.0002)
        start = time.perf_counter()
        metrics.flush()
        return (time.perf_counter() - start) * 1e3
    finally:
        metrics.close()


def mapped(mesh: am.ActorMesh[Echo], calls: int) -> tuple[float, float]:
    """calls/s and driver CPU µs per call of one `map` over `calls` no-op items."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in mesh.methods.f.map(range(calls)):
        pass
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return calls / wall, cpu / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--actors", type=int, default=4)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    hook = statistics.median(hooks_ns(100_000) for _ in range(5))
    print(f"hooks: {hook:.0f} ns of CPU per call on the call path (call_ended, and task_sent "
          "per 16 calls, with this loop's own cost)")
    print(f"flush: {flush_ms(100_000):.2f} ms to export 100,000 calls of one method")
    with am.ActorMesh(Echo, shape=args.actors, num_cpus=0.5) as mesh:
        mapped(mesh, args.calls)  # warm: actors measured, batches sized
        rates, cpus = [], []
        for _ in range(args.rounds):
            rate, cpu = mapped(mesh, args.calls)
            rates.append(rate)
            cpus.append(cpu)
    rate, cpu = statistics.median(rates), statistics.median(cpus)
    print(f"map over no-op items: {rate:,.0f} calls/s, {cpu:.1f} µs of driver CPU per call "
          f"(median of {args.rounds} rounds of {args.calls:,})")
    print(f"the metrics' share of a call's driver CPU: {hook / 1e3 / cpu:.2%} (goal: <= 1%)")


if __name__ == "__main__":
    main()
