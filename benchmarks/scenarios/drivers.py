"""Several drivers sharing one mesh: does each driver's balancer see the load the others put on
the actors, or do they herd onto the same ones?

Eight actors of 20 ms calls, made by a mesh with a name; Poisson calls at 80% of their capacity
in total, split at random between driver processes (`workloads.DriverProcess`, each a Ray actor
of its own playing its share open-loop with the harness's driver, all starting at the same
moment). Measured per turn, over every driver's calls: the p99 latency, and each actor's peak
number of calls in flight (from the drivers' send and end times), the busiest actor's peak ÷
the mean of the peaks (1: no actor herded onto more than the others).

Contenders:
- `one driver`: one process sends the same total through one mesh: the target;
- `4 drivers, random.choice`: each picks an actor at random, raw `.remote()`;
- `4 drivers, a mesh each`: each wraps the actors in a mesh of its own (`ActorMesh.from_actors`,
  the default policy), which sees only its own calls: what several drivers can do today;
- `4 drivers, connect`: each joins the mesh by name (`am.ActorMesh.connect`, DESIGN.md
  "Several drivers"), the headline contender, which runs twice: the A/A control.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

import actormesh as am
from benchmarks.config import Config
from benchmarks.harness import section, trials
from benchmarks.harness.context import Context
from benchmarks.harness.workloads import BenchWorker, DriverProcess, poisson_arrivals
from benchmarks.report import provenance

ACTORS = 8
DRIVERS = 4
SERVICE_S = 0.020
LOAD = 0.8
WARMUP_S = 0.3
DRAIN_S = 0.5
TIMEOUT_S = 120.0
MESH_NAME = "actormesh-bench-drivers"

ONE, RANDOM, OWN = "one driver", f"{DRIVERS} drivers, random.choice", f"{DRIVERS} drivers, a mesh each"
CONNECTED = f"{DRIVERS} drivers, connect"


@dataclasses.dataclass
class Drivers:
    """The named mesh of actors and the driver processes."""

    mesh: am.ActorMesh[BenchWorker]
    processes: list[Any]

    @classmethod
    def start(cls) -> Drivers:
        mesh = am.ActorMesh(BenchWorker, shape=ACTORS, num_cpus=0.1, name=MESH_NAME)
        remote = ray.remote(num_cpus=0)(DriverProcess)
        processes = [remote.remote(provenance.REPOSITORY) for _ in range(DRIVERS)]
        mesh.wait_ready(timeout=TIMEOUT_S)
        ray.get([p.__ray_ready__.remote() for p in processes], timeout=TIMEOUT_S)
        return cls(mesh, processes)

    def shutdown(self) -> None:
        for process in self.processes:
            ray.kill(process)
        self.mesh.shutdown()


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str = "drivers"
    title: str = f"{DRIVERS} drivers sharing one mesh"
    needs_fleet = False

    pending = ""  # runs in every mode

    def describe(self, cfg: Config) -> str:
        return (f"Poisson calls of {SERVICE_S * 1e3:g} ms at {LOAD:.0%} of the capacity of "
                f"{ACTORS} actors in total, {cfg.drivers_measure_s:g} s measured, split at "
                f"random between {DRIVERS} driver processes (or sent by one)")

    def run(self, ctx: Context) -> dict[str, Any]:
        started = time.perf_counter()
        cfg = ctx.cfg
        drivers = ctx.shared("drivers", Drivers.start)
        contenders = make_trials(drivers, cfg)
        runs, samples = trials.play(contenders, cfg.drivers_repeats, self.name, ctx.progress)
        return section.build(
            name=self.name, title=self.title, kind="calls", description=self.describe(cfg),
            entrants=[t.entrant for t in contenders], default=CONNECTED, twin=twin(CONNECTED),
            runs=runs, samples=samples, judged_on=("p99_ms", "peak_over_mean"),
            rows=[section.Row("p99_ms", baseline=ONE), section.Row("p99_ms", baseline=RANDOM),
                  section.Row("peak_over_mean", baseline=RANDOM)],
            columns=(("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("p99 range", "~p99_ms"),
                     ("peak ÷ mean peak", "peak_over_mean"), ("peak in flight", "peak_max"),
                     ("failed", "failed"), ("unfinished at drain", "unfinished")),
            started=started, params={"actors": ACTORS, "drivers": DRIVERS, "load": LOAD,
                                     "service_s": SERVICE_S})


def twin(name: str) -> str:
    return f"{name} (A/A)"


def make_trials(drivers: Drivers, cfg: Config) -> list[trials.Trial]:
    rate = LOAD * ACTORS / SERVICE_S

    def turn(how: str, processes: int) -> Callable[[int], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            # The same calls at the same times for every contender of a repeat.
            rng = np.random.default_rng(section.seed(f"drivers/{repeat}"))
            planned = poisson_arrivals(rng, rate, WARMUP_S + cfg.drivers_measure_s)
            share = rng.integers(0, DRIVERS, len(planned)) % processes
            mine = [np.nonzero(share == d)[0] for d in range(processes)]
            start_at = time.time() + 0.5  # every driver starts at once
            cpu, wall = time.process_time(), time.perf_counter()
            parts = ray.get([
                drivers.processes[d].play.remote(how, MESH_NAME, ACTORS, planned[mine[d]],
                                                 np.full(len(mine[d]), SERVICE_S), start_at,
                                                 DRAIN_S)
                for d in range(processes)], timeout=TIMEOUT_S)
            turn_ = trials.Turn(len(planned), time.perf_counter() - wall,
                                time.process_time() - cpu)
            measured(turn_, parts, mine, planned)
            return turn_
        return one

    return [
        trials.Trial(section.Entrant(ONE, "one driver process, one mesh (the default policy)",
                                     "baseline", ONE), turn("mesh", 1)),
        trials.Trial(section.Entrant(RANDOM, "each driver: random.choice + raw .remote()",
                                     "baseline", RANDOM), turn("random", DRIVERS)),
        trials.Trial(section.Entrant(OWN, "each driver: ActorMesh.from_actors over the named "
                                          "actors, its own load view", "actormesh", OWN),
                     turn("mesh", DRIVERS)),
        trials.Trial(section.Entrant(CONNECTED, "each driver: am.ActorMesh.connect(name)",
                                     "actormesh", CONNECTED), turn("connect", DRIVERS)),
        trials.Trial(section.Entrant(twin(CONNECTED), f"{CONNECTED}, again: the A/A control",
                                     "aa", twin(CONNECTED)), turn("connect-again", DRIVERS)),
    ]


def measured(turn: trials.Turn, parts: list[dict[str, Any]], mine: list[np.ndarray],
             planned: np.ndarray) -> None:
    """The turn's latencies (calls planned after the warm-up, in the order of the plan, whichever
    driver sent them) and the actors' peaks in flight, from every driver's record."""
    def merged(key: str, fill: Any) -> np.ndarray:
        out = np.full(len(planned), fill, dtype=np.asarray(parts[0][key]).dtype)
        for part, index in zip(parts, mine):
            out[index] = part[key]
        return out

    sent, ended, ok, rank = (merged("sent", np.nan), merged("ended", np.nan),
                             merged("ok", False), merged("rank", -1))
    deadline = max(p["deadline"] for p in parts)
    keep = planned >= WARMUP_S
    latency = np.where(np.isnan(ended), deadline - sent, ended - sent) * 1e3
    latency[~ok & ~np.isnan(ended)] = np.nan  # failed: no latency
    peaks = peak_in_flight(sent, np.where(np.isnan(ended), deadline, ended), rank, ACTORS)
    turn.latencies_ms = latency[keep]
    turn.values = {"peak_over_mean": float(peaks.max() / peaks.mean()) if peaks.mean() else 1.0,
                   "peak_max": float(peaks.max()),
                   # A call that ended with an error, and one still out when the drain ended (the
                   # actors skip it: on a loaded machine the last calls of a turn can be late).
                   "failed": float((~ok[keep] & ~np.isnan(ended[keep])).sum()),
                   "unfinished": float(np.isnan(ended[keep]).sum())}


def peak_in_flight(sent: np.ndarray, ended: np.ndarray, rank: np.ndarray,
                   actors: int) -> np.ndarray:
    """Per actor, the most calls it had in flight at once (sent, not yet ended), from its calls'
    send and end times; a call whose actor is unknown counts nowhere."""
    peaks = np.zeros(actors)
    for a in range(actors):
        mine = rank == a
        times = np.concatenate([sent[mine], ended[mine]])
        steps = np.concatenate([np.ones(mine.sum()), -np.ones(mine.sum())])
        if len(times):
            order = np.lexsort((steps, times))  # at a tie, the end first
            peaks[a] = np.cumsum(steps[order]).max()
    return peaks


def build(cfg: Config) -> Scenario:
    return Scenario()

