"""What the benchmark actors do, and the service times the driver draws for them.

`BenchWorker` serves the balancing, hedged and several-driver scenarios; `Echo` (its one
method returns its argument) the call-path scenarios and side scripts, where Ray's own cost per
call is the whole bill; `DriverProcess` is a driver of its own for the several-driver scenario.

Service times are controlled: the driver draws every call's duration from a named distribution
(the same draws, by seed, for every contender) and the actor sleeps or spins for it, multiplied by
its own slowdown factor (a straggler is an actor with a factor of 10-20). Each call returns its
token, the rank that ran it and the time it actually took, so the driver can attribute work to
actors whatever API delivered the result.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Any

import numpy as np
import ray
from ray import cloudpickle

import actormesh as am

# Actor processes may not have this repository on their path (an existing cluster, pytest's own
# runtime_env): ship this module's code with the actor class instead of importing it by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class BenchWorker:
    """A single-slot (synchronous) actor whose calls take a duration chosen by the driver."""

    def __init__(self) -> None:
        self.slowdown = 1.0
        self.executions = 0  # calls of `work` that ran (not skipped past their deadline)

    @am.method
    def work(self, token: int, duration_s: float,
             deadline: float = math.inf) -> tuple[int, int, float]:
        """Sleep `duration_s` times this actor's slowdown; return (token, rank, seconds taken).

        Past `deadline` (a `time.time()` value) the driver has stopped listening: the call returns
        at once (taken -1), so a backlog left by a slow contender drains in milliseconds.
        """
        start = time.perf_counter()
        left = deadline - time.time()
        if left <= 0:
            return token, am.current_rank().rank, -1.0
        self.executions += 1
        if duration_s > 0:
            time.sleep(min(duration_s * self.slowdown, left))
        return token, am.current_rank().rank, time.perf_counter() - start

    @am.method
    def spin(self, token: int, duration_s: float,
             deadline: float = math.inf) -> tuple[int, int, float]:
        """Busy-loop the CPU for `duration_s` times the slowdown (no sleep); see `work`."""
        start = time.perf_counter()
        if time.time() >= deadline:
            return token, am.current_rank().rank, -1.0
        end = start + duration_s * self.slowdown
        while time.perf_counter() < end:
            pass
        return token, am.current_rank().rank, time.perf_counter() - start

    @am.method
    def noop(self, token: int) -> tuple[int, int, float]:
        return token, am.current_rank().rank, 0.0

    @am.method
    def set_slowdown(self, factor: float) -> int:
        self.slowdown = factor
        return os.getpid()

    @am.method
    def ping(self) -> int:
        return os.getpid()

    @am.method
    def take_executions(self) -> int:
        """How many calls of `work` ran since the last time this was asked."""
        count, self.executions = self.executions, 0
        return count


class Echo:
    """A no-op actor: what a call costs when the work costs nothing."""

    @am.method
    def f(self, x: int) -> int:
        return x


class DriverProcess:
    """A driver process of its own (a Ray actor) for the several-driver scenario: it plays its
    share of a plan through its own router, with the harness's open-loop driver.

    Its code travels by value with this module, but the harness it runs is imported from the
    repository the run started in (`repository`), as an actor process may not have it on its
    path (an existing cluster, the test suite's runtime_env).
    """

    def __init__(self, repository: str) -> None:
        if repository not in sys.path:
            sys.path.insert(0, repository)
        self.routers: dict[str, Any] = {}

    def play(self, how: str, name: str, actors: int, planned_s: np.ndarray,
             duration_s: np.ndarray, start_at: float, drain_s: float) -> dict[str, Any]:
        """Wait until `start_at` (a `time.time()` value), play the plan through the router
        `how` names over the mesh `name` of `actors` actors, and return each call's send and
        end (on the wall clock, to merge with other drivers), outcome and actor."""
        from benchmarks.harness import driver

        contender = self._router(how, name, actors)
        time.sleep(max(0.0, start_at - time.time()))
        run = driver.play(contender, "work", planned_s, duration_s, drain_s=drain_s)
        to_wall = time.time() - time.perf_counter()
        return {"sent": run.sent + to_wall, "ended": run.ended + to_wall, "ok": run.ok,
                "rank": run.rank, "deadline": run.deadline + to_wall, "errors": run.errors}

    def _router(self, how: str, name: str, actors: int) -> Any:
        """`mesh`, `mesh-again` (a second, independent one: the A/A twin): a mesh of this
        driver's own over the named actors; `connect`: `am.ActorMesh.connect(name)`;
        `random`: `random.choice` over their handles."""
        from benchmarks.harness.contenders import MeshChoose, RayRandom

        if how not in self.routers:
            handles = [ray.get_actor(f"{name}.{rank}") for rank in range(actors)]
            if how in ("mesh", "mesh-again"):
                self.routers[how] = MeshChoose(am.ActorMesh.from_actors(handles), how, how)
            elif how in ("connect", "connect-again"):
                self.routers[how] = MeshChoose(am.ActorMesh.connect(name), how, how)
            elif how == "random":
                self.routers[how] = RayRandom(handles, seed=os.getpid())
            else:
                raise ValueError(f"how={how!r}: expected mesh, mesh-again, connect, "
                                 "connect-again or random")
        return self.routers[how]


@dataclasses.dataclass(frozen=True)
class Service:
    """A service-time distribution with a given mean, in seconds.

    `kind` is "exp", "lognormal" (shape `sigma`), "pareto" (tail index `alpha`) or "const".
    Draws above `cap` × mean are clipped so that one draw cannot outlast the run; the clip touches
    about 0.15 % of lognormal σ=2 draws and 0.05 % of Pareto α=1.5 draws at the default cap.
    """

    kind: str
    mean_s: float
    sigma: float = 2.0
    alpha: float = 1.5
    cap: float = 50.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        m = self.mean_s
        if self.kind == "exp":
            d = rng.exponential(m, n)
        elif self.kind == "lognormal":
            mu = np.log(m) - self.sigma**2 / 2  # so that the mean is m
            d = rng.lognormal(mu, self.sigma, n)
        elif self.kind == "pareto":
            xm = m * (self.alpha - 1) / self.alpha  # so that the mean is m
            d = xm * (1.0 + rng.pareto(self.alpha, n))
        elif self.kind == "const":
            d = np.full(n, m)
        else:
            raise ValueError(f"service kind {self.kind!r}: expected exp, lognormal, pareto or const")
        return np.minimum(d, self.cap * m)

    def describe(self) -> str:
        ms = f"{self.mean_s * 1e3:g} ms"
        return {
            "exp": f"exponential, mean {ms}",
            "lognormal": f"lognormal σ={self.sigma:g}, mean {ms}",
            "pareto": f"Pareto α={self.alpha:g}, mean {ms}",
            "const": f"constant {ms}",
        }[self.kind]


def poisson_arrivals(rng: np.random.Generator, rate_per_s: float, duration_s: float) -> np.ndarray:
    """Arrival offsets (seconds from the start) of a Poisson process over `duration_s`."""
    n = max(1, int(rate_per_s * duration_s * 1.3) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    while times[-1] < duration_s:
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, n))
        times = np.concatenate([times, more])
    return times[times < duration_s]


def burst_arrivals(rng: np.random.Generator, burst: int, period_s: float,
                   duration_s: float) -> np.ndarray:
    """`burst` calls at once every `period_s` (the first burst at a random phase)."""
    phase = rng.uniform(0, period_s)
    starts = np.arange(phase, duration_s, period_s)
    return np.repeat(starts, burst)
