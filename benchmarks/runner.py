"""Runs the Ray scenarios: the cluster, one mesh per policy, and every contender on every plan.

Every contender drives the same `Config.actors` actors, created once and reused by every scenario
(starting an actor costs about half a second here): each native policy routes through its own
mesh (own scheduler) over those actors, and the baselines call their handles directly. So
`choose` and raw `.remote()` are compared on the same processes. The other meshes come from
`ActorMesh.from_actors` over the first mesh's actors (if that fails, each policy gets its own
actors and the harness says so on the terminal; results.json records why.) Within a repeat every contender plays the same
plan (same send times, same service times); the order of contenders rotates between repeats so
that a slow drift of the machine does not favour whoever runs first. After the repeats, every
ratio of the scenario gets its bootstrap interval and the A/A control (`benchmarks.stats`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import ray

import actormesh as am

from . import driver, metrics, stats
from .contenders import POLICIES, Contender, MeshChoose, RayActorPool, RayRandom, RayRoundRobin
from .scenarios import Config, Scenario
from .workloads import BenchWorker

Progress = Callable[[str], None]
T = TypeVar("T")


def connect(cfg: Config) -> tuple[bool, str]:
    """Join the cluster at RAY_ADDRESS, or start a local one. Returns (started here, address)."""
    if ray.is_initialized():
        return False, "already connected"
    quiet: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **quiet)
        return True, address
    meshes = len(POLICIES) * cfg.actors * cfg.actor_cpus
    ray.init(num_cpus=max(8, math.ceil(meshes) + 2), include_dashboard=False,
             object_store_memory=200 * 1024**2, **quiet)
    return True, "local (started by the harness)"


@dataclasses.dataclass
class Fleet:
    """The meshes and the contenders built on them."""

    meshes: dict[str, am.ActorMesh[BenchWorker]]
    contenders: list[Contender]
    created_at: float  # perf_counter when the actors were requested
    shared: bool  # True: one set of actors for every contender
    not_shared_because: str = ""  # why not, when `shared` is False
    started_s: float = math.nan  # seconds until every actor answered
    overhead_s: float = 0.0  # per-call cost on top of the service time (see calibrate)

    @classmethod
    def start(cls, cfg: Config, share: bool = True,
              only: Sequence[str] | None = None) -> Fleet:
        """One mesh per policy; all over one set of actors when `share` and the library allows."""
        t = time.perf_counter()
        policies = {p: am.Policy(p, seed=1234 + i) for i, p in enumerate(POLICIES)}

        def new_mesh(policy: am.Policy) -> am.ActorMesh[BenchWorker]:
            return am.ActorMesh(BenchWorker, shape=cfg.actors, num_cpus=cfg.actor_cpus,
                                balancer=policy, max_restarts=-1)

        meshes: dict[str, am.ActorMesh[BenchWorker]] = {}
        shared = False
        why = "not asked to share"
        if share:
            base = new_mesh(policies["pow2"])
            try:
                meshes = {p: base if p == "pow2" else
                          am.ActorMesh.from_actors(base.actors, balancer=policy)
                          for p, policy in policies.items()}
                shared = True
                why = ""
            except Exception as error:  # could not share: one actor set per policy
                meshes = {"pow2": base}
                why = f"{type(error).__name__}: {error}"
        for p, policy in policies.items():
            if p not in meshes:
                meshes[p] = new_mesh(policy)
        meshes = {p: meshes[p] for p in POLICIES}
        contenders: list[Contender] = [MeshChoose(meshes[p], p) for p in POLICIES]
        contenders += [
            RayRandom(meshes["random"].actors, seed=99),
            RayRoundRobin(meshes["pow2"].actors),  # the same actors as the default `choose`
            RayActorPool(meshes["round_robin"].actors),
        ]
        if only:
            contenders = [c for c in contenders if c.name in only]
        return cls(meshes, contenders, t, shared, why)

    @property
    def actor_count(self) -> int:
        return len({id(h) for m in self.meshes.values() for h in m.actors})

    def distinct(self) -> list[am.ActorMesh[BenchWorker]]:
        """One mesh per distinct set of actors."""
        seen: dict[int, am.ActorMesh[BenchWorker]] = {}
        for mesh in self.meshes.values():
            seen.setdefault(id(mesh.actors[0]), mesh)
        return list(seen.values())

    def wait_ready(self, timeout: float = 300.0) -> None:
        for mesh in self.distinct():
            mesh.wait_ready(timeout=timeout)
        self.started_s = time.perf_counter() - self.created_at

    def set_slowdowns(self, slowdowns: list[float]) -> None:
        refs = [h.set_slowdown.remote(s) for mesh in self.distinct()
                for h, s in zip(mesh.actors, slowdowns)]
        ray.get(refs, timeout=60)

    def shutdown(self) -> None:
        for mesh in self.meshes.values():  # shared actors: the first kills them, the rest close
            mesh.shutdown()


def calibrate(fleet: Fleet, cfg: Config) -> dict[str, Any]:
    """Measure what a call costs an actor beyond its sleep, so that "70% load" means 70%.

    Each actor gets a backlog of calls of exactly `mean_s` (raw `.remote()`, no balancer); the
    interval between its consecutive results is then its time per call. The median over actors
    and rounds, minus `mean_s`, is the per-call overhead the scenarios add to their capacity.
    """
    contender = RayRoundRobin(fleet.meshes["pow2"].actors)
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


def run_scenario(fleet: Fleet, cfg: Config, scenario: Scenario,
                 progress: Progress) -> dict[str, Any]:
    """Every contender on every repeat of `scenario`; returns its results section."""
    t_start = time.perf_counter()
    repeats = scenario.repeats or cfg.repeats
    slowdowns = scenario.slowdowns(cfg.actors)
    contenders = fleet.contenders
    per: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    lat: dict[str, list[np.ndarray]] = {c.name: [] for c in contenders}
    warmup = cfg.warmup_s if scenario.kind in ("open", "fault") else -1.0
    drain = cfg.drain_s if scenario.kind in ("open", "fault") else cfg.batch_drain_s
    samples: dict[str, list[stats.RunSample]] = {c.name: [] for c in contenders}
    judged_on = scenario.judged_on()
    if scenario.slow_rank >= 0:
        fleet.set_slowdowns(slowdowns)
    try:
        for r in range(repeats):
            planned, durations = scenario.plan(cfg, r, fleet.overhead_s)
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for contender in order:
                progress(f"{scenario.name} · repeat {r + 1}/{repeats} · {contender.name}")
                barrier(contender)
                events = []
                if scenario.kill_rank >= 0:
                    handle = contender.handles[scenario.kill_rank]
                    events.append((scenario.kill_at_s, "kill",
                                   lambda h=handle: ray.kill(h, no_restart=False)))
                run = driver.play(contender, scenario.method, planned, durations,
                                  drain_s=drain, events=events,
                                  retries=1 if scenario.kind == "fault" else 0)
                m = metrics.run_metrics(run, warmup_s=warmup, slowdowns=slowdowns,
                                        killed_rank=scenario.kill_rank if scenario.kill_rank >= 0
                                        else None, slow_ms=scenario.slow_ms())
                per[contender.name].append(m)
                sample = metrics.sample(run, m, warmup)
                samples[contender.name].append(sample)
                lat[contender.name].append(sample.latencies_ms)
    finally:
        if scenario.slow_rank >= 0:
            fleet.set_slowdowns([1.0] * cfg.actors)
    progress(f"{scenario.name} · bootstrap intervals")
    comparisons = stats.compare(
        samples, judged_on,
        contenders=[c.name for c in contenders if c.family == "actormesh"],
        baselines=[c.name for c in contenders if c.family != "actormesh"],
        control=None if scenario.control_note else ("random", "ray-random"),
        seed=_seed(scenario.name))
    return {
        "name": scenario.name,
        "title": scenario.title,
        "kind": scenario.kind,
        "description": scenario.describe(cfg.actors),
        "repeats": repeats,
        "params": {k: v for k, v in dataclasses.asdict(scenario).items() if k != "service"}
        | {"service": dataclasses.asdict(scenario.service)},
        "contenders": [
            {
                "name": c.name,
                "label": c.label,
                "family": c.family,
                "summary": metrics.summarise(per[c.name]),
                "runs": per[c.name],
                "cdf": metrics.cdf(np.concatenate(lat[c.name])) if scenario.kind != "throughput"
                else {"q": [], "ms": []},
            }
            for c in contenders
        ],
        "metrics": list(judged_on),
        "slow_ms": scenario.slow_ms(),
        "comparisons": comparisons,
        "control_note": scenario.control_note,
        "duration_s": time.perf_counter() - t_start,
    }


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
