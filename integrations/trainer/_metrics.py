"""`StepMetrics`: what `run()` reports for each step it trained."""

from __future__ import annotations

from typing import TypedDict


class StepMetrics(TypedDict):
    """One trained step. `uids`, `versions` and `staleness` are aligned, sorted by uid (the
    order the groups were handed to `train`)."""

    step: int
    """The step's index over the whole training (0, 1, ...), as passed to `train`."""
    epoch: int
    uids: list[int]
    versions: list[int]
    """Per group: the version its rollout started with (steps whose weights it could see)."""
    staleness: list[int]
    """Per group: `step - version`, never above `max_staleness`."""
    filtered: list[int]
    """Uids whose rollout returned `None` within this step's span of the permutation."""
    retries: int
    """Rollout attempts that failed and were retried, within this step's span."""
    wait_s: float
    """Time from the end of the previous step (or the run's start) until the batch was ready."""
    train_s: float
    sync_s: float
    elapsed_s: float
    """Time from the run's start to the end of this step (its sync included)."""
