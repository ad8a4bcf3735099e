"""Timing a few contenders in turn, for the side scripts that measure seconds per run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from rich.progress import Progress


def timed(fns: Sequence[Callable[[], object]], repeats: int, warmup: int = 1,
          what: str = "") -> list[list[float]]:
    """Seconds per run of each of `fns`, run in turn (so drift in the machine hits all alike),
    after `warmup` untimed rounds; a progress bar shows how far it is."""
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
            for fn, runs in zip(fns, times):
                start = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - start)
                bar.advance(task)
    return times


def summary(times: Sequence[float]) -> dict[str, float]:
    """Median, min and max seconds."""
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
