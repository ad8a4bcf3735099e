"""How fast `choose` stops routing to an actor that died, busy or idle.

For each trial, one actor of a mesh is killed with `ray.kill` and the time until the balancer marks
it dead is measured (`mesh.load().alive`): an idle actor is noticed by its death watch alone, a
busy one also by its failing call. Then restart time with `max_restarts=1`: from the kill until
`choose` routes to the actor again.

    python -m benchmarks.side.death_notice [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import ray
from rich.progress import Progress

import actormesh as am


class Victim:
    @am.method
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def until(condition: Callable[[], bool], timeout: float = 60.0) -> float:
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("condition not met")
        time.sleep(0.0005)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    opts = parser.parse_args()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    results: dict[str, list[float]] = {"idle": [], "busy": [], "restart": []}
    with Progress(transient=True) as bar:
        task = bar.add_task("death notice", total=opts.trials * 3)
        for trial in range(opts.trials):
            for state in ("idle", "busy"):
                bar.update(task, description=f"trial {trial + 1}/{opts.trials} · {state} actor")
                with am.ActorMesh(Victim, shape=2, num_cpus=0.1) as mesh:
                    mesh.wait_ready()
                    if state == "busy":
                        pending = mesh[1].methods.sleep.choose(60)
                        until(lambda m=mesh: m.load()[1] == 1)
                    ray.kill(mesh.actors[1])
                    results[state].append(until(lambda m=mesh: not m.load().alive[1]))
                    if state == "busy":
                        try:
                            pending.get(timeout=60)
                        except am.ActorDiedError:
                            pass
                bar.advance(task)
            bar.update(task, description=f"trial {trial + 1}/{opts.trials} · restart")
            with am.ActorMesh(Victim, shape=2, num_cpus=0.1, max_restarts=1) as mesh:
                mesh.wait_ready()
                killed = time.perf_counter()
                ray.kill(mesh.actors[1], no_restart=False)
                until(lambda m=mesh: not m.load().alive[1])
                until(lambda m=mesh: m.load().alive[1])
                results["restart"].append(time.perf_counter() - killed)
            bar.advance(task)
    for name, values in results.items():
        ms = sorted(v * 1000 for v in values)
        print(f"{name:8s} median {statistics.median(ms):8.1f} ms   min {ms[0]:8.1f}   max {ms[-1]:8.1f}"
              f"   ({len(ms)} trials)")
    ray.shutdown()


if __name__ == "__main__":
    main()
