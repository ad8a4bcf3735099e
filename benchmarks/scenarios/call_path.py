"""The call-path scenarios: what one driver pays per call when the work costs nothing.

On `Config.call_actors` no-op actors (`Echo`: `f(x)` returns x), shared by every contender:

- `map`: `f` over many items, results read in order (calls/s): a raw `.remote()` loop then one
  `ray.get`, `ray.util.ActorPool.map`, `mesh.methods.f.map` (the default) and `am.ActorPool.map`;
- `choose_burst`: N `choose` calls sent at once, then read (calls/s): against raw calls read one by
  one and with one `ray.get`;
- `sequential`: one call at a time, each read before the next is sent (latency):
  `choose(...).get()` against `ray.get(actor.f.remote(...))`.

The default contender routes through the mesh that made the actors, as a user writes it
(`balancer=` left out); its twin, the A/A control, is the same on a second mesh over the same
actors. Each turn checks its results, so a contender that drops or reorders one is an error,
not a figure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from ray.util import ActorPool as RayPool

import actormesh as am
from benchmarks.config import Config
from benchmarks.harness import section, trials
from benchmarks.harness.context import Context
from benchmarks.harness.workloads import Echo

AM_GET = "choose, am.get"  # the burst read in one wait: its own headline row

TIMEOUT_S = 120.0  # no turn waits longer for a result: a hang is an error, not a figure
DEFAULT, TWIN = "default", "default (A/A)"


@dataclasses.dataclass
class EchoActors:
    """The no-op actors, the default's mesh that made them, and its twin over the same ones."""

    mesh: am.ActorMesh[Echo]
    twin: am.ActorMesh[Any]

    @classmethod
    def start(cls, actors: int) -> EchoActors:
        mesh = am.ActorMesh(Echo, shape=actors, num_cpus=0.1)
        mesh.wait_ready(timeout=TIMEOUT_S)
        return cls(mesh, am.ActorMesh.from_actors(mesh.actors))

    @property
    def handles(self) -> list[Any]:
        return list(self.mesh.actors)

    def shutdown(self) -> None:
        self.twin.shutdown()
        self.mesh.shutdown()


def _check(name: str, got: Sequence[Any], items: Sequence[int]) -> None:
    if list(got) != list(items):
        wrong = next(i for i, (a, b) in enumerate(zip(got, items)) if a != b) \
            if len(got) == len(items) else len(got)
        raise AssertionError(f"{name}: results differ from the items (first at {wrong})")


def _entrant(name: str, family: str, display: str) -> section.Entrant:
    labels = {DEFAULT: "actormesh, the default balancer",
              TWIN: "actormesh, the default balancer, a second mesh: the A/A control"}
    return section.Entrant(name, labels.get(name, display), family, display)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A call-path scenario: its contenders, what it is judged on and its headline rows."""

    name: str
    title: str
    judged_on: tuple[str, ...]
    make: Callable[[EchoActors, Config], list[trials.Trial]]
    rows: tuple[section.Row, ...]
    what: Callable[[Config], str]  # the workload, in words
    columns: tuple[tuple[str, str], ...]
    needs_fleet = False
    pending = ""  # runs in every mode

    def run(self, ctx: Context) -> dict[str, Any]:
        started = time.perf_counter()
        cfg = ctx.cfg
        echo = ctx.shared("echo", lambda: EchoActors.start(cfg.call_actors))
        contenders = self.make(echo, cfg)
        runs, samples = trials.play(contenders, cfg.call_repeats, self.name, ctx.progress)
        return section.build(
            name=self.name, title=self.title, kind="calls", description=self.what(cfg),
            entrants=[t.entrant for t in contenders], default=DEFAULT, twin=TWIN, runs=runs,
            samples=samples, judged_on=self.judged_on, rows=self.rows, columns=self.columns,
            started=started, params={"actors": cfg.call_actors})


# -- map -----------------------------------------------------------------------------------------
def map_trials(echo: EchoActors, cfg: Config) -> list[trials.Trial]:
    items = list(range(cfg.map_items))
    actors = echo.handles
    ray_pool, pool = RayPool(actors), am.ActorPool(actors)

    def f(actor: Any, v: int) -> Any:
        return actor.f.remote(v)

    def turn(name: str, run: Callable[[], Sequence[Any]]) -> Callable[[], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            out: list[Sequence[Any]] = []
            t = trials.timed(len(items), lambda: out.append(run()))
            _check(name, out[0], items)
            return t
        return one

    def raw() -> list[Any]:
        n = len(actors)
        return list(ray.get([actors[i % n].f.remote(x) for i, x in enumerate(items)],
                            timeout=TIMEOUT_S))

    def mesh_map(mesh: am.ActorMesh[Any]) -> Callable[[], list[Any]]:
        return lambda: list(mesh.methods.f.map(items))

    return [
        trials.Trial(_entrant("raw loop", "baseline", "raw .remote() loop + ray.get"),
                     turn("raw loop", raw)),
        trials.Trial(_entrant("ray.util.ActorPool.map", "baseline", "ray.util.ActorPool.map"),
                     turn("ray.util.ActorPool.map", lambda: list(ray_pool.map(f, items)))),
        trials.Trial(_entrant(DEFAULT, "actormesh", "mesh.methods.f.map"),
                     turn(DEFAULT, mesh_map(echo.mesh))),
        trials.Trial(_entrant(TWIN, "aa", "mesh.methods.f.map (A/A)"),
                     turn(TWIN, mesh_map(echo.twin))),
        trials.Trial(_entrant("am.ActorPool.map", "actormesh", "am.ActorPool.map"),
                     turn("am.ActorPool.map", lambda: list(pool.map(f, items)))),
    ]


# -- burst ---------------------------------------------------------------------------------------
def burst_trials(echo: EchoActors, cfg: Config) -> list[trials.Trial]:
    calls = cfg.burst_calls
    items = list(range(calls))
    actors = echo.handles
    n = len(actors)

    def raw(one_by_one: bool) -> Callable[[], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            got: list[Any] = []

            def work() -> None:
                refs = [actors[i % n].f.remote(i) for i in items]
                got.extend([ray.get(r, timeout=TIMEOUT_S) for r in refs] if one_by_one
                           else ray.get(refs, timeout=TIMEOUT_S))
            t = trials.timed(calls, work)
            _check("raw burst", got, items)
            return t
        return one

    def choose(mesh: am.ActorMesh[Any], read: Callable[[list[am.MeshFuture[Any]]], list[Any]],
               ) -> Callable[[], trials.Turn]:
        method = mesh.methods.f

        def one(repeat: int) -> trials.Turn:
            got: list[Any] = []
            t = trials.timed(calls, lambda: got.extend(read([method.choose(i) for i in items])))
            _check("choose burst", got, items)
            return t
        return one

    def one_by_one(futures: list[am.MeshFuture[Any]]) -> list[Any]:
        return [f.get(timeout=TIMEOUT_S) for f in futures]

    out = [
        trials.Trial(_entrant("raw, ray.get per ref", "baseline",
                              "raw .remote() burst, ray.get per ref"), raw(True)),
        trials.Trial(_entrant("raw, one ray.get", "baseline",
                              "raw .remote() burst, one ray.get"), raw(False)),
        trials.Trial(_entrant(DEFAULT, "actormesh", "choose burst, .get() per future"),
                     choose(echo.mesh, one_by_one)),
        trials.Trial(_entrant(TWIN, "aa", "choose burst, .get() per future (A/A)"),
                     choose(echo.twin, one_by_one)),
        trials.Trial(_entrant(AM_GET, "actormesh", "choose burst, one am.get"),
                     choose(echo.mesh, read_with_am_get)),
    ]
    return out



def read_with_am_get(futures: list[am.MeshFuture[Any]]) -> list[Any]:
    """Every result of the burst in one wait (`am.get`)."""
    got: list[Any] = am.get(futures, timeout=TIMEOUT_S)
    return got


# -- one call at a time --------------------------------------------------------------------------
def sequential_trials(echo: EchoActors, cfg: Config) -> list[trials.Trial]:
    calls = cfg.sequential_calls
    actors = echo.handles
    n = len(actors)
    clock = time.perf_counter

    def timed(call: Callable[[int], Any]) -> Callable[[], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            lat = np.empty(calls)
            cpu, wall = time.process_time(), clock()
            for i in range(calls):
                t = clock()
                if call(i) != i:
                    raise AssertionError(f"call {i} returned another value")
                lat[i] = clock() - t
            return trials.Turn(calls, clock() - wall, time.process_time() - cpu, lat * 1e3)
        return one

    def choose(mesh: am.ActorMesh[Any]) -> Callable[[int], Any]:
        method = mesh.methods.f
        return lambda i: method.choose(i).get(timeout=TIMEOUT_S)

    return [
        trials.Trial(_entrant("raw", "baseline", "ray.get(actor.f.remote(x))"),
                     timed(lambda i: ray.get(actors[i % n].f.remote(i), timeout=TIMEOUT_S))),
        trials.Trial(_entrant(DEFAULT, "actormesh", "choose(x).get()"), timed(choose(echo.mesh))),
        trials.Trial(_entrant(TWIN, "aa", "choose(x).get() (A/A)"), timed(choose(echo.twin))),
    ]


THROUGHPUT_COLUMNS = (("calls/s", "throughput_per_s"), ("range", "~throughput_per_s"),
                      ("CPU µs/call", "cpu_us_per_call"))


def build(cfg: Config) -> list[Scenario]:
    n = cfg.call_actors
    burst_rows = [section.Row("throughput_per_s"),
                  section.Row("throughput_per_s", contender=AM_GET)]
    return [
        Scenario("map", "map over no-op items", ("throughput_per_s", "cpu_us_per_call"),
                 map_trials,
                 (section.Row("throughput_per_s"),
                  section.Row("throughput_per_s", contender="am.ActorPool.map",
                              baseline="ray.util.ActorPool.map")),
                 lambda c: f"{c.map_items:,} items mapped over {n} no-op actors, results read "
                           "in order",
                 THROUGHPUT_COLUMNS),
        Scenario("choose_burst", "A burst of choose calls", ("throughput_per_s", "cpu_us_per_call"),
                 burst_trials, tuple(burst_rows),
                 lambda c: f"{c.burst_calls:,} no-op calls sent at once over {n} actors, then "
                           "read",
                 THROUGHPUT_COLUMNS),
        Scenario("sequential", "One call at a time", ("p50_ms", "p99_ms"), sequential_trials,
                 (section.Row("p50_ms"),),
                 lambda c: f"{c.sequential_calls:,} no-op calls over {n} actors, each read "
                           "before the next is sent",
                 (("p50 ms", "p50_ms"), ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"),
                  ("p50 range", "~p50_ms"), ("calls/s", "throughput_per_s"),
                  ("CPU µs/call", "cpu_us_per_call"))),
    ]
