"""SIMULATED against queueing theory: does the queue model of `benchmarks.without_ray.sim` get known answers?

With Poisson arrivals at load λ and exponential service (mean 1), random choice splits the
arrivals into independent M/M/1 queues, whose mean time in system is 1/(1−λ); the power of two
choices has, as the number of actors grows, Σ_{i≥1} λ^(2^i−2) (Mitzenmacher, "The power of two
choices in randomized load balancing", IEEE TPDS 2001). The simulation, with the native scheduler
making every decision, should land on both; if it did not, none of its other figures would count.

Each run starts with every queue empty and discards the calls that arrive during a warm-up of
12·T² mean service times (T the predicted mean: about three relaxation times of an M/M/1 queue,
whose relaxation time is 1/(1−√λ)² ≈ 4T²). The standard error comes from independent replications
(own seed, own warm-up). The formula for pow2 is a limit for many actors; a few hundred actors sit
within a percent or two above it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.without_ray.sim import native_factory, simulate

REPLICATIONS = 4


def mm1(load: float) -> float:
    """Mean time in system of an M/M/1 queue (service mean 1): what random choice gives."""
    return 1.0 / (1.0 - load)


def pow2_limit(load: float) -> float:
    """Σ_{i≥1} λ^(2^i − 2): the power of two choices as the number of actors grows."""
    total, i = 0.0, 1
    while True:
        term = load ** (2**i - 2)
        total += term
        if term < 1e-12:
            return total
        i += 1


FORMULAS: dict[str, tuple[str, Callable[[float], float]]] = {
    "random": ("1/(1−λ)", mm1),
    "pow2": ("Σ λ^(2^i−2)", pow2_limit),
}


def replicate(policy: str, load: float, actors: int, span: float, seed: int) -> float:
    """Mean time in system of the calls arriving after the warm-up, in one simulated run."""
    predicted = FORMULAS[policy][1](load)
    warmup = 12 * predicted**2
    rng = np.random.default_rng(seed)
    rate = load * actors  # calls per unit time: `actors` servers of rate 1
    calls = int(rate * (warmup + span))
    arrivals = np.cumsum(rng.exponential(1.0 / rate, calls))
    service = rng.exponential(1.0, calls)
    end = simulate(native_factory(actors, policy, seed), arrivals, service, [1.0] * actors)
    measured = arrivals >= warmup
    return float((end[measured] - arrivals[measured]).mean())


def check(loads: Sequence[float], sizes: dict[str, tuple[int, float]], *, seed: int = 11,
          progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """One row per policy and load: measured mean ± standard error against the formula.

    `sizes` maps a policy to (actors, measured span in mean service times per replication).
    """
    rows = []
    for policy, (actors, span) in sizes.items():
        words, formula = FORMULAS[policy]
        for load in loads:
            progress(f"simulation · queueing theory · {policy} at λ={load:g}")
            t = time.perf_counter()
            means = [replicate(policy, load, actors, span, seed + 1000 * k)
                     for k in range(REPLICATIONS)]
            measured = float(np.mean(means))
            se = float(np.std(means, ddof=1) / math.sqrt(len(means)))
            predicted = formula(load)
            deviation = measured / predicted - 1.0
            # Three standard errors, and for pow2 the few percent its finite size adds.
            allowed = 3 * se + (0.03 * predicted if policy == "pow2" else 0.0)
            rows.append({
                "policy": policy, "load": load, "actors": actors, "span": span,
                "replications": REPLICATIONS, "formula": words, "predicted": predicted,
                "measured": measured, "se": se, "deviation": deviation,
                "agrees": abs(measured - predicted) <= allowed,
                "wall_s": time.perf_counter() - t,
            })
    return {"rows": rows, "note": NOTE}


NOTE = (
    "**Simulated, checked against theory.** Mean time in system (units of the mean service "
    "time) in the queue model of the simulation, exponential service, Poisson arrivals at load "
    "λ, the native scheduler deciding: `random` against the M/M/1 result 1/(1−λ), `pow2` against "
    "Mitzenmacher's limit Σ_{i≥1} λ^(2^i−2). Each figure is the mean of "
    f"{REPLICATIONS} independent replications (± one standard error), each started empty with a "
    "warm-up of 12·T² discarded (about three M/M/1 relaxation times). `agrees`: within three "
    "standard errors (for pow2, plus 3% for its finite number of actors; the formula is the "
    "limit)."
)
