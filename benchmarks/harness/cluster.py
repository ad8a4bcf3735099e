"""The Ray side of a run: the cluster, the fleet of shared actors and the contenders on them.

Every contender of the balancing scenarios drives the same `Config.actors` actors, created once
and reused by every scenario (starting an actor costs about half a second here), so `choose`
and raw `.remote()` are compared on the same processes. The default policy routes through the
mesh that made the actors, built as a user builds one (`balancer=` left out, so whatever
`am.ActorMesh` defaults to); its twin, the A/A control, is a second mesh with the default over
the same actors (`ActorMesh.from_actors`), as is every other policy's mesh, each with its own
scheduler. The baselines call the actors' handles directly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

import actormesh as am
from benchmarks.config import Config
from benchmarks.harness import driver
from benchmarks.harness.contenders import (
    POLICIES,
    Contender,
    FreshMesh,
    MeshChoose,
    RayActorPool,
    RayRandom,
    RayRoundRobin,
    default_policy,
    twin_name,
)
from benchmarks.harness.workloads import BenchWorker

LOCAL_CPUS = 16  # logical CPUs of the local cluster: every actor of every scenario fits


def connect() -> tuple[bool, str]:
    """Join the cluster at RAY_ADDRESS, or start a local one. Returns (started here, address)."""
    if ray.is_initialized():
        return False, "already connected"
    quiet: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **quiet)
        return True, address
    ray.init(num_cpus=LOCAL_CPUS, include_dashboard=False, object_store_memory=200 * 1024**2,
             **quiet)
    return True, "local (started by the harness)"


@dataclasses.dataclass
class Fleet:
    """The shared actors, a mesh per contender over them, and the contenders."""

    owner: am.ActorMesh[BenchWorker]  # made the actors; the default policy's contender
    meshes: dict[str, am.ActorMesh[BenchWorker]]
    contenders: list[Contender]
    default: str  # the default policy's contender
    created_at: float  # perf_counter when the actors were requested
    # The default through a mesh made anew before each turn: played where a scenario asks
    # (`Scenario.fresh`), to show that what ran before does not weigh on the default.
    fresh: FreshMesh
    started_s: float = math.nan  # seconds until every actor answered
    overhead_s: float = 0.0  # per-call cost on top of the service time (see calibrate)

    @classmethod
    def start(cls, cfg: Config, only: Sequence[str] | None = None) -> Fleet:
        """The actors, one mesh per policy and the default's twin, and the baselines."""
        t = time.perf_counter()
        owner = am.ActorMesh(BenchWorker, shape=cfg.actors, num_cpus=cfg.actor_cpus,
                             max_restarts=-1)
        default = default_policy()
        meshes: dict[str, am.ActorMesh[BenchWorker]] = {}
        contenders: list[Contender] = []
        for i, policy in enumerate(dict.fromkeys((default, twin_name(default), *POLICIES))):
            name = policy
            if policy == default:
                meshes[name] = owner
            elif policy == twin_name(default):  # as a user gets it: no balancer=
                meshes[name] = am.ActorMesh.from_actors(owner.actors)
            else:
                meshes[name] = am.ActorMesh.from_actors(
                    owner.actors, balancer=am.Policy(policy, seed=1234 + i))
            twin = policy == twin_name(default)
            contenders.append(MeshChoose(
                meshes[name], name,
                f"actormesh {default}, a second mesh over the same actors: the A/A control"
                if twin else f"actormesh {policy}" + (" (the default)" if policy == default
                                                      else ""),
                family="aa" if twin else "actormesh"))
        contenders += [RayRandom(owner.actors, seed=99), RayRoundRobin(owner.actors),
                       RayActorPool(owner.actors)]
        fresh = FreshMesh(owner)
        if only:
            wanted = set(only) | ({twin_name(default)} if default in only else set())
            contenders = [c for c in contenders if c.name in wanted]
        return cls(owner, meshes, contenders, default, t, fresh)

    def wait_ready(self, timeout: float = 300.0) -> None:
        self.owner.wait_ready(timeout=timeout)
        self.started_s = time.perf_counter() - self.created_at

    def set_slowdowns(self, slowdowns: list[float]) -> None:
        ray.get([h.set_slowdown.remote(s) for h, s in zip(self.owner.actors, slowdowns)],
                timeout=60)

    def shutdown(self) -> None:
        self.fresh.shutdown()
        for mesh in self.meshes.values():  # the owner last: it kills the actors
            if mesh is not self.owner:
                mesh.shutdown()
        self.owner.shutdown()


def calibrate(fleet: Fleet, cfg: Config) -> dict[str, Any]:
    """Measure what a call costs an actor beyond its sleep, so that "70% load" means 70%.

    Each actor gets a backlog of calls of exactly `mean_s` (raw `.remote()`, no balancer); the
    interval between its consecutive results is then its time per call. The median over actors
    and rounds, minus `mean_s`, is the per-call overhead the scenarios add to their capacity.
    """
    contender = RayRoundRobin(fleet.owner.actors)
    per_actor = 20
    n = cfg.actors * per_actor
    intervals: list[float] = []
    for _ in range(cfg.calibration_rounds):
        barrier(contender)
        run = driver.play(contender, "work", np.zeros(n), np.full(n, cfg.mean_s),
                          drain_s=cfg.batch_drain_s)
        for rank in range(cfg.actors):
            ends = np.sort(run.ended[(run.rank == rank) & run.ok])
            if len(ends) > 2:
                intervals.append(float(ends[-1] - ends[0]) / (len(ends) - 1))
    per_call = float(np.median(intervals)) if intervals else cfg.mean_s
    fleet.overhead_s = max(0.0, per_call - cfg.mean_s)
    return {
        "service_s": cfg.mean_s,
        "per_call_s": per_call,
        "overhead_s": fleet.overhead_s,
        "capacity_per_s": cfg.actors / per_call,
        "nominal_capacity_per_s": cfg.actors / cfg.mean_s,
    }


def barrier(contender: Contender, timeout: float = 60.0) -> None:
    """Wait until every actor of `contender` has worked off earlier calls (or restarted)."""
    deadline = time.perf_counter() + timeout
    for handle in contender.handles:
        while True:
            left = deadline - time.perf_counter()
            try:
                ray.get(handle.ping.remote(), timeout=max(left, 0.1))
                break
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                if left <= 0:
                    raise
                time.sleep(0.05)  # restarting after a kill: ask again
