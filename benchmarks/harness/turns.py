"""Taking turns: the order in which contenders play within each repeat.

Every repeat plays each contender once (A C B, then B A C, ...), so a slow drift of a shared
machine hits all of them alike instead of whoever ran in the same block. The order is a fresh
seeded shuffle per repeat, not a rotation: a rotation keeps who follows whom fixed, and the
A/A twin would always run next to the same contender, sharing its machine state.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from rich.progress import Progress

T = TypeVar("T")


def order(contenders: Sequence[T], repeat: int, salt: str) -> list[T]:
    """The order of `contenders` in repeat `repeat` of the scenario named `salt`."""
    return random.Random(f"{salt}/{repeat}").sample(list(contenders), len(contenders))


def timed(fns: Sequence[Callable[[], object]], repeats: int, warmup: int = 1,
          what: str = "") -> list[list[float]]:
    """Seconds per run of each of `fns`, taking turns (see `order`), after `warmup` untimed
    rounds; a progress bar shows how far it is. For the side scripts."""
    with Progress(transient=True) as bar:
        task = bar.add_task(what, total=(warmup + repeats) * len(fns))
        for w in range(warmup):
            for fn in fns:
                bar.update(task, description=f"{what}: warm-up {w + 1}/{warmup}")
                fn()
                bar.advance(task)
        times: list[list[float]] = [[] for _ in fns]
        for r in range(repeats):
            bar.update(task, description=f"{what}: {r + 1}/{repeats}")
            for i in order(range(len(fns)), r, what):
                start = time.perf_counter()
                fns[i]()
                times[i].append(time.perf_counter() - start)
                bar.advance(task)
    return times


def summary(times: Sequence[float]) -> dict[str, float]:
    """Median, min and max seconds."""
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
