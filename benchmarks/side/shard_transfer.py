"""What `shard` costs and saves on big batches, against doing the same by hand with plain Ray.

1. Time: `shard` of a numpy batch (200 MB by default) over 4 actors with `am.dispatch.split()`,
   against `np.array_split` + one `actor.f.remote(chunk)` per actor + `ray.get`.
2. Object-store bytes for a replicated split (`split(dim="dp")` on a {dp: 2, tp: 2} mesh: each
   chunk goes to 2 actors): the shared-chunk path puts each chunk once; plain Ray calls write the
   chunk once per actor. Measured from the object store itself while every actor holds its
   argument (the calls wait on a signal until the store has been read).

    python -m benchmarks.side.shard_transfer [--mb 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from typing import Any

import numpy as np
import ray
from ray._private.internal_api import memory_summary
from rich.progress import Progress

import actormesh as am


@ray.remote(num_cpus=0)
class Signal:
    """Holds calls until released, so their arguments stay in the store while it is read."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiting = 0

    async def wait(self) -> None:
        self.waiting += 1
        await self.event.wait()

    async def count(self) -> int:
        return self.waiting

    async def send(self) -> None:
        self.event.set()


class Sink:
    @am.method
    def consume(self, chunk: Any) -> list[int]:
        return [int(chunk.nbytes)]

    @am.method
    def hold(self, chunk: Any, signal: Any) -> list[int]:
        ray.get(signal.wait.remote())
        return [int(chunk.nbytes)]


def settled_mib(address: str) -> float:
    """Object-store usage once frees of earlier objects (asynchronous in Ray) have landed."""
    last = plasma_mib(address)
    while True:
        time.sleep(0.5)
        now = plasma_mib(address)
        if now == last:
            return now
        last = now


def held_mib(address: str, start: Any, actors: int) -> float:
    """Object-store MiB used by calls that `start(signal)` sends, read while they all wait."""
    base = settled_mib(address)
    signal = Signal.remote()  # type: ignore[attr-defined]
    finish = start(signal)
    while ray.get(signal.count.remote()) < actors:
        time.sleep(0.01)
    used = plasma_mib(address) - base
    ray.get(signal.send.remote())
    finish()
    return used


def plasma_mib(address: str) -> float:
    summary = memory_summary(address=address, stats_only=True)
    match = re.search(r"Plasma memory usage (\d+) MiB", summary)
    return float(match.group(1)) if match else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    context = ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                       object_store_memory=max(4 * opts.mb, 400) * 1024**2)
    address = context.address_info["address"]
    batch = np.random.default_rng(0).integers(0, 255, opts.mb * 1024**2, dtype=np.uint8)

    with am.ActorMesh(Sink, shape={"dp": 2, "tp": 2}, num_cpus=0.1) as mesh, \
            Progress(transient=True) as bar:
        task = bar.add_task("starting the actors", total=2 + opts.repeats)
        mesh.wait_ready()
        hold = mesh.methods.hold.options(dispatch=am.dispatch.split(dim="dp"))

        def shared(signal: Any) -> Any:
            return hold.shard(batch, signal).get

        bar.update(task, description="object store: shared chunks")
        shared_mib = held_mib(address, shared, 4)
        bar.advance(task)

        def plain(signal: Any) -> Any:
            chunks = np.array_split(batch, 2)
            refs = [a.hold.remote(chunks[rank // 2], signal) for rank, a in enumerate(mesh.actors)]
            return lambda: ray.get(refs)

        bar.update(task, description="object store: plain Ray calls")
        plain_mib = held_mib(address, plain, 4)
        bar.advance(task)
        split = mesh.methods.consume.options(dispatch=am.dispatch.split())
        split.shard(batch[:1024]).get()
        ours, by_hand = [], []
        for r in range(opts.repeats):
            bar.update(task, description=f"time: repeat {r + 1}/{opts.repeats}")
            start = time.perf_counter()
            assert sum(split.shard(batch).get()) == batch.nbytes
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            chunks = np.array_split(batch, len(mesh.actors))
            refs = [a.consume.remote(c) for a, c in zip(mesh.actors, chunks)]
            assert sum(sum(r) for r in ray.get(refs)) == batch.nbytes
            by_hand.append(time.perf_counter() - start)
            bar.advance(task)
        t_ours, t_hand = statistics.median(ours), statistics.median(by_hand)
        print(f"shard of {opts.mb} MB over 4 actors: actormesh {t_ours:.3f} s, "
              f"by hand {t_hand:.3f} s (median of {opts.repeats}; ratio by hand / actormesh "
              f"{t_hand / t_ours:.2f})")

    print(f"replicated split (each chunk to 2 actors) of {opts.mb} MB: object store holds "
          f"{shared_mib:.0f} MiB with shared chunks, {plain_mib:.0f} MiB with plain Ray calls "
          f"(ratio {plain_mib / max(shared_mib, 1):.2f})")
    ray.shutdown()


if __name__ == "__main__":
    main()
