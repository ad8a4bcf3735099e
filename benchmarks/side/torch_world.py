"""`python -m benchmarks.side.torch_world`: TorchMesh start-up, and a state dict sent over a link.

Two measurements, on a local Ray cluster started here (or the one at RAY_ADDRESS):

- start-up: `TorchMesh(...)` until `wait_ready()` returns, i.e. every process is in the gloo
  world with the group of every dim made (collectives ready), against a plain `ActorMesh` of the
  same class and size until `wait_ready()`. Both classes import torch in `__init__`, so the
  difference is what forming the world costs. 2 processes (one dim) and 4 (`{"dp": 2, "tp": 2}`).
- over 2 and 4 running actors: forming the world (rendezvous, store, `init_process_group`, the
  group of every dim; the code a TorchMesh actor runs before `__init__`), and forming one group
  over them with `link`: what the integration adds, without the noise of process start-up.
- a `--mb` MB state dict (`--tensors` float32 tensors) sent from one actor to 3 others:
  over `link(trainer[0], engines)` (a gloo broadcast per tensor, received into the engines'
  parameters), against the object store (the sender puts the dict once, each engine gets it and
  copies it into its parameters), once as torch tensors (pickled) and once as numpy views of
  them (read without a copy: the strongest object-store baseline). Each round ends when all 3
  engines hold the new values, which they check; the sender's tensors change between rounds.

Each figure is the median of `--repeats` start-ups or `--rounds` rounds after one warm-up, the
contenders taking turns; min and max are shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import ray

import actormesh as am
from actormesh.integrations.torch import TorchMesh, link, process_group
from benchmarks.harness.turns import summary, timed


class Process:
    """One process of the start-up measurement: imports torch, as a training process would."""

    def __init__(self) -> None:
        import torch

        self.threads = torch.get_num_threads()

    @am.method
    def ready(self) -> bool:
        return True


class Holder:
    """Holds a state dict of `count` float32 tensors of `numel` elements each."""

    def __init__(self, count: int, numel: int) -> None:
        import torch

        self.params = [torch.zeros(numel) for _ in range(count)]

    @am.method
    def fill(self, value: float) -> float:
        """Give every tensor new values (the sender, before a round); returns the check value."""
        for i, tensor in enumerate(self.params):
            tensor.fill_(value + i)
        return self.check()

    def check(self) -> float:
        return sum(float(t[0]) + float(t[-1]) for t in self.params)

    @am.method
    def broadcast(self) -> float:
        """Send (link rank 0) or receive every tensor over the link; returns the check value."""
        import torch.distributed as dist

        group = process_group("weights")
        for tensor in self.params:
            dist.broadcast(tensor, group=group, group_src=0)
        return self.check()

    @am.method
    def put(self) -> list[Any]:
        """Put the state dict in the object store once; the ref travels in a list, unresolved."""
        return [ray.put({f"p{i}": t for i, t in enumerate(self.params)})]

    @am.method
    def put_numpy(self) -> list[Any]:
        """Put the state dict as numpy views of the tensors (no copy here), which the object
        store hands to readers without copying: the strongest object-store baseline."""
        return [ray.put({f"p{i}": t.numpy() for i, t in enumerate(self.params)})]

    @am.method
    def get(self, refs: list[Any]) -> float:
        """Read the state dict from the object store into the parameters."""
        import torch

        state: dict[str, Any] = ray.get(refs[0], timeout=300)
        for i, tensor in enumerate(self.params):
            value = state[f"p{i}"]
            tensor.copy_(value if isinstance(value, torch.Tensor) else torch.from_numpy(value))
        return self.check()


def startup(shape: dict[str, int], repeats: int) -> dict[str, Any]:
    """Seconds from constructing the mesh until every actor is ready, torch and plain mesh, and
    the difference of each pair of runs (run back to back, so they share the machine's mood)."""
    def torch_mesh() -> None:
        with TorchMesh(Process, shape, num_cpus=0.5) as mesh:
            mesh.wait_ready(timeout=300)

    def plain_mesh() -> None:
        with am.ActorMesh(Process, shape, num_cpus=0.5) as mesh:
            mesh.wait_ready(timeout=300)

    torch_times, plain_times = timed([torch_mesh, plain_mesh], repeats, what=f"start-up {shape}")
    return {"torch_mesh": summary(torch_times), "actor_mesh": summary(plain_times),
            "difference": summary([t - p for t, p in zip(torch_times, plain_times)])}


def _join(_instance: object, setup: Any) -> None:
    """In a running actor: join the world of `setup`, as a TorchMesh actor does before
    `__init__`."""
    from actormesh.integrations.torch import _world

    _world.join(setup)


def _leave(_instance: object) -> None:
    from actormesh.integrations.torch import _world

    _world._leave()


def forming(shape: dict[str, int], rounds: int) -> dict[str, dict[str, float]]:
    """Seconds to form a world (rendezvous, store, `init_process_group`, the group of every dim)
    over running actors, and to form one group over them with `link`: what the integration adds
    once the processes exist, without the noise of their start-up."""
    from actormesh.integrations.torch._rendezvous import Rendezvous
    from actormesh.integrations.torch._world import WorldSetup

    with am.ActorMesh(Process, shape, num_cpus=0.5) as mesh:
        mesh.wait_ready(timeout=300)
        namespace = ray.get_runtime_context().namespace
        worlds = iter(range(10**6))

        def world() -> None:
            setup = WorldSetup(f"bench.world.{next(worlds)}", namespace, "gloo", 60, 300, False)
            rendezvous = ray.remote(Rendezvous).options(name=setup.world_id, num_cpus=0).remote(
                mesh.size, 300)
            ray.get(rendezvous.epoch.remote(), timeout=300)  # up before the clock starts
            start = time.perf_counter()
            mesh.run_in_actors(_join, setup).get(timeout=300)
            times["world"].append(time.perf_counter() - start)
            mesh.run_in_actors(_leave).get(timeout=300)
            ray.kill(rendezvous)

        def group() -> None:
            start = time.perf_counter()
            formed = link(mesh, name=f"g{next(worlds)}")
            times["link"].append(time.perf_counter() - start)
            formed.close()

        times: dict[str, list[float]] = {"world": [], "link": []}
        timed([world, group], rounds, what=f"forming over {shape}")
        # The warm-up round is in the lists too: drop it.
        return {name: summary(runs[1:]) for name, runs in times.items()}


def state_dict_transfer(megabytes: int, tensors: int, rounds: int) -> dict[str, Any]:
    """Seconds per round that gets a new state dict from the sender into 3 engines."""
    numel = megabytes * 10**6 // 4 // tensors
    with TorchMesh(Holder, {"dp": 2}, args=(tensors, numel), num_cpus=0.5) as trainer, \
            am.ActorMesh(Holder, 3, args=(tensors, numel), num_cpus=0.5) as engines:
        trainer.wait_ready(timeout=300)
        engines.wait_ready(timeout=300)
        sender = trainer[0]
        weights = link(sender, engines, name="weights")
        fills = iter(range(1, 10**6))

        def new_values() -> float:
            """Untimed: the sender's tensors take new values, so no round can pass on stale ones."""
            checks: list[float] = list(sender.methods.fill.all(float(next(fills))).get(300))
            return checks[0]

        def over_link(expected: float) -> None:
            sent = sender.methods.broadcast.all()
            received = list(engines.methods.broadcast.all().get(timeout=300))
            assert received == [expected] * 3 and list(sent.get(timeout=300)) == [expected]

        def over_object_store(expected: float) -> None:
            refs = list(sender.methods.put.all().get(timeout=300))[0]
            assert list(engines.methods.get.all(refs).get(timeout=300)) == [expected] * 3

        def over_object_store_numpy(expected: float) -> None:
            refs = list(sender.methods.put_numpy.all().get(timeout=300))[0]
            assert list(engines.methods.get.all(refs).get(timeout=300)) == [expected] * 3

        contenders = {"link_broadcast": over_link, "object_store": over_object_store,
                      "object_store_numpy": over_object_store_numpy}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for round_ in range(rounds + 1):  # round 0 warms up
            for name, send in contenders.items():
                expected = new_values()
                start = time.perf_counter()
                send(expected)
                if round_:
                    times[name].append(time.perf_counter() - start)
            print(f"  state dict: {round_}/{rounds}" + (" (warm-up)" if not round_ else ""),
                  flush=True)
        weights.close()
    link_times = times["link_broadcast"]
    return {"megabytes": numel * tensors * 4 / 1e6, "tensors": tensors, "receivers": 3,
            **{name: summary(runs) for name, runs in times.items()},
            "ratio_to_link": {name: summary([t / lt for t, lt in zip(runs, link_times)])
                              for name, runs in times.items() if name != "link_broadcast"}}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.side.torch_world",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3, help="timed start-ups per mesh (3)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per way (10)")
    parser.add_argument("--mb", type=int, default=50, help="state dict size in MB (50)")
    parser.add_argument("--tensors", type=int, default=10, help="tensors in the state dict (10)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)

    if not ray.is_initialized():
        started = time.perf_counter()
        if os.environ.get("RAY_ADDRESS"):
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                     object_store_memory=max(8 * args.mb * 10**6, 300 * 2**20))
        print(f"ray.init: {time.perf_counter() - started:.1f} s", flush=True)
    results: dict[str, Any] = {"repeats": args.repeats, "rounds": args.rounds, "startup": {},
                               "forming": {}}
    print(f"{'what':<60} {'median':>9} {'min':>9} {'max':>9}", flush=True)
    for shape in ({"rank": 2}, {"dp": 2, "tp": 2}):
        label = ",".join(f"{d}={n}" for d, n in shape.items())
        row = results["startup"][label] = startup(shape, args.repeats)
        for name, key in (("TorchMesh until the world is formed", "torch_mesh"),
                          ("plain ActorMesh until ready", "actor_mesh"),
                          ("difference per pair of runs", "difference")):
            report(f"start-up {label}: {name}", row[key])
    for shape in ({"rank": 2}, {"dp": 2, "tp": 2}):
        label = ",".join(f"{d}={n}" for d, n in shape.items())
        row = results["forming"][label] = forming(shape, args.rounds)
        report(f"over running actors {label}: forming the world", row["world"])
        report(f"over running actors {label}: forming a link over them", row["link"])
    cast = results["state_dict"] = state_dict_transfer(args.mb, args.tensors, args.rounds)
    what = f"{cast['megabytes']:.0f} MB, {cast['tensors']} tensors, 1 -> 3"
    for name, key in (("link (gloo broadcast)", "link_broadcast"),
                      ("object store (torch, put once)", "object_store"),
                      ("object store (numpy views, put once)", "object_store_numpy")):
        report(f"{what}: {name}", cast[key])
    for name, key in (("torch tensors", "object_store"), ("numpy views", "object_store_numpy")):
        ratio = cast["ratio_to_link"][key]
        print(f"object store ({name}) time / link time, per round: median "
              f"{ratio['median_s']:.2f}x (range {ratio['min_s']:.2f}-{ratio['max_s']:.2f})")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


def report(label: str, row: dict[str, float]) -> None:
    """One line of the table, printed as soon as it is measured."""
    print(f"{label:<60} {row['median_s']:>8.3f}s {row['min_s']:>8.3f}s {row['max_s']:>8.3f}s",
          flush=True)


if __name__ == "__main__":
    main()
