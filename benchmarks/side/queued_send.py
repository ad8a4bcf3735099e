"""What it costs to send a queued call from the library's loop thread instead of Ray's.

When a call ends and frees a slot, a call waiting in the scheduler's queue gets the slot at once
(on Ray's completion thread, in the native core), but is *sent* from the library's loop thread:
one `call_soon_threadsafe` hop, so that Ray's thread never serialises arguments or submits.

Measured:
1. the hop alone: time from `post` on another thread until the loop runs it (percentiles);
2. on real actors: tiny calls through a full queue (`pull`, one slot per actor: every call after
   the first N waits for a slot and goes through the hop) against the same calls with no queue
   (`pow2`, no slot limit), calls/s and driver CPU per call, in alternating rounds.

    python -m benchmarks.side.queued_send [--calls 2000] [--rounds 6] [--actors 4]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import ray

import actormesh as am
from actormesh import _loop
from benchmarks.harness.workloads import Echo


def hop_latency_us(samples: int) -> list[float]:
    """Latency of one post to the loop thread, from a thread that stands for Ray's."""
    out: list[float] = []
    done = threading.Event()

    def arrived(sent: float) -> None:
        out.append((time.perf_counter() - sent) * 1e6)
        done.set()

    def sender() -> None:
        for _ in range(samples):
            done.clear()
            _loop.post(arrived, time.perf_counter())
            done.wait(5)

    thread = threading.Thread(target=sender)
    thread.start()
    thread.join()
    return out


def block(mesh: am.ActorMesh[Echo], calls: int) -> tuple[float, float]:
    """(calls/s, driver CPU us per call) for `calls` calls sent at once, read as one batch."""
    wall, cpu = time.perf_counter(), time.process_time()
    futures = [mesh.methods.f.choose(i) for i in range(calls)]
    for future in futures:
        future.get(timeout=120)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return calls / wall, cpu / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--actors", type=int, default=4)
    args = parser.parse_args()

    hops = sorted(hop_latency_us(2000))
    q = statistics.quantiles(hops, n=100)
    print(f"hop to the loop thread: median {q[49]:.0f} us, p90 {q[89]:.0f} us, p99 {q[98]:.0f} us "
          f"({len(hops)} posts)", flush=True)

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    with am.ActorMesh(Echo, args.actors, num_cpus=0.1, balancer="pull") as queued, \
            am.ActorMesh(Echo, args.actors, num_cpus=0.1) as direct:
        queued.wait_ready(60)
        direct.wait_ready(60)
        block(queued, 200)
        block(direct, 200)
        results: dict[str, list[tuple[float, float]]] = {"queued (pull, 1 slot)": [],
                                                         "direct (pow2)": []}
        for round_ in range(args.rounds):
            order = [("queued (pull, 1 slot)", queued), ("direct (pow2)", direct)]
            for name, mesh in order if round_ % 2 == 0 else order[::-1]:
                results[name].append(block(mesh, args.calls))
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    print(f"{args.calls} no-op calls per round over {args.actors} actors, {args.rounds} rounds:")
    for name, rows in results.items():
        rates = [r for r, _ in rows]
        cpus = [c for _, c in rows]
        print(f"  {name:22s} {statistics.median(rates):7.0f} calls/s "
              f"(range {min(rates):.0f}-{max(rates):.0f}); driver CPU "
              f"{statistics.median(cpus):.0f} us/call (range {min(cpus):.0f}-{max(cpus):.0f})")


if __name__ == "__main__":
    main()
