"""A batch with one slow actor: hedged calls against `ray.util.ActorPool`.

`Config.hedge_calls` calls of 20 ms, all sent at once, on the fleet's actors, one of them 10×
slower. A central queue (`ray.util.ActorPool`) hands a call only to a free actor, so at most one
call waits behind the slow actor; a hedged call that has not ended after the hedge delay is
sent once more to another actor, and the first copy to end wins (DESIGN.md, "Hedged calls").
Measured per turn: the makespan (first send to last result), the makespan ÷ the lower bound
(the batch spread perfectly over the actors' speeds) and the executions per call, counted in
the actors (a hedge that ran is a second execution; one cancelled before it started is not).

Contenders: `ray.util.ActorPool.map_unordered` (its strongest form), the default policy with
every call sent through `choose` and read, and the same with `.options(hedge=True)`, the
headline contender, which runs twice: the A/A control.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
from ray.util import ActorPool as RayPool

from benchmarks.config import Config
from benchmarks.harness import section, trials
from benchmarks.harness.cluster import Fleet, barrier
from benchmarks.harness.contenders import RayRoundRobin, twin_name
from benchmarks.harness.context import Context
from benchmarks.harness.metrics import batch_lower_bound

SERVICE_S = 0.020
SLOWDOWN = 10.0
TIMEOUT_S = 120.0
POOL, PLAIN, HEDGED = "ray.util.ActorPool", "default, no hedge", "default, hedge=True"


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str = "hedged"
    title: str = f"Batch with one actor {SLOWDOWN:g}× slower, hedged"
    needs_fleet = True

    pending = ""  # runs in every mode

    def describe(self, cfg: Config) -> str:
        return (f"{cfg.hedge_calls} calls of {SERVICE_S * 1e3:g} ms sent at once over "
                f"{cfg.actors} actors, rank {cfg.actors // 2} {SLOWDOWN:g}× slower")

    def run(self, ctx: Context) -> dict[str, Any]:
        started = time.perf_counter()
        fleet, cfg = ctx.fleet, ctx.cfg
        assert fleet is not None, "the hedged batch is played on the fleet"
        slowdowns = [1.0] * cfg.actors
        slowdowns[cfg.actors // 2] = SLOWDOWN
        bound = batch_lower_bound(np.full(cfg.hedge_calls, SERVICE_S), slowdowns)
        fleet.set_slowdowns(slowdowns)
        try:
            contenders = make_trials(fleet, cfg.hedge_calls, bound)
            runs, samples = trials.play(contenders, cfg.hedge_repeats, self.name, ctx.progress)
        finally:
            fleet.set_slowdowns([1.0] * cfg.actors)
        return section.build(
            name=self.name, title=self.title, kind="calls", description=self.describe(cfg),
            entrants=[t.entrant for t in contenders], default=HEDGED,
            twin=twin_name(HEDGED), runs=runs, samples=samples,
            judged_on=("makespan_s", "executions_per_call"),
            rows=[section.Row("makespan_s", also=("makespan_over_bound",
                                                  "executions_per_call"))],
            columns=(("makespan s", "makespan_s"), ("range", "~makespan_s"),
                     ("× bound", "makespan_over_bound"),
                     ("executions per call", "executions_per_call")),
            started=started, params={"calls": cfg.hedge_calls, "service_s": SERVICE_S,
                                     "slowdown": SLOWDOWN, "lower_bound_s": bound})


def make_trials(fleet: Fleet, calls: int, bound: float) -> list[trials.Trial]:
    actors = list(fleet.owner.actors)
    tokens = list(range(calls))
    ray_pool = RayPool(actors)

    def turn(name: str, batch: Callable[[], list[Any]]) -> Callable[[], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            executions(actors)  # start the count from zero
            got: list[Any] = []
            t = trials.timed(calls, lambda: got.extend(batch()))
            if sorted(v[0] for v in got) != tokens:
                raise AssertionError(f"{name}: a call's result is missing or doubled")
            barrier(RayRoundRobin(actors))  # a losing copy still running has ended
            t.values = {"makespan_s": t.seconds, "makespan_over_bound": t.seconds / bound,
                        "executions_per_call": executions(actors) / calls}
            return t
        return one

    def pool() -> list[Any]:
        return list(ray_pool.map_unordered(lambda a, v: a.work.remote(v, SERVICE_S), tokens))

    def choose(mesh: Any, hedge: bool) -> Callable[[], list[Any]]:
        method = mesh.methods.work.options(hedge=True) if hedge else mesh.methods.work

        def batch() -> list[Any]:
            futures = [method.choose(v, SERVICE_S) for v in tokens]
            return [f.get(timeout=TIMEOUT_S) for f in futures]
        return batch

    default = fleet.meshes[fleet.default]
    twin = fleet.meshes[twin_name(fleet.default)]
    return [
        trials.Trial(section.Entrant(POOL, "ray.util.ActorPool.map_unordered over the same "
                                           "actors", "baseline", POOL), turn(POOL, pool)),
        trials.Trial(section.Entrant(PLAIN, f"actormesh {fleet.default}: every call through "
                                            "choose", "actormesh", PLAIN),
                     turn(PLAIN, choose(default, hedge=False))),
        trials.Trial(section.Entrant(HEDGED, f"actormesh {fleet.default}, .options(hedge=True)",
                                     "actormesh", HEDGED), turn(HEDGED, choose(default, hedge=True))),
        trials.Trial(section.Entrant(twin_name(HEDGED), f"{HEDGED} on a second mesh: the A/A "
                                     "control", "aa", twin_name(HEDGED)),
                     turn(twin_name(HEDGED), choose(twin, hedge=True))),
    ]


def executions(actors: list[Any]) -> int:
    """Calls of `work` the actors ran since the last count (and start a new count)."""
    return sum(ray.get([a.take_executions.remote() for a in actors], timeout=TIMEOUT_S))


def build(cfg: Config) -> Scenario:
    return Scenario()
