"""The admission counters of one epoch, the condition that guards them, and the admission rule.

Every change of a counter is a transition: it happens with `Ledger.cond` held, wakes every waiter
(`notify_all`) and is shown to the user's `on_transition` hook as a `Counters` snapshot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Literal

from ._errors import TrainerError

logger = logging.getLogger("actormesh.trainer")

Transition = Literal["epoch", "admitted", "accepted", "filtered", "trained", "synced"]
"""What changed: `"epoch"` (counters set for an epoch: at a run's start and at each new epoch),
`"admitted"` (a rollout started), `"accepted"` / `"filtered"` (a rollout returned a group /
`None`), `"trained"` (a step's `train` returned), `"synced"` (its `sync_weights` returned)."""


@dataclasses.dataclass(frozen=True)
class Counters:
    """The counters right after a transition. All but `version` count within `epoch`.

    The admission rule holds at every transition:
    `accepted + running <= (max_staleness + epoch_version + 1) * batch_size`, and
    `submitted == running + accepted + filtered`.
    """

    event: Transition
    epoch: int
    version: int
    """Steps trained over the whole run whose weights reached the generator (sync returned)."""
    epoch_version: int
    """The same, counting this epoch's steps only: the `version` of the admission rule."""
    submitted: int
    running: int
    accepted: int
    filtered: int
    trained: int
    """Accepted groups that a step has trained (the rest are buffered)."""


class Ledger:
    """One epoch's counters under one `asyncio.Condition`; `room()` is the admission rule.

    The rule is AReaL's, `accepted + running < (max_staleness + v + 1) * batch_size`, written as
    `accepted + running < synced + (max_staleness + 1) * batch_size` with `synced` the groups of
    this epoch's synced steps: the same while every step of an epoch but its last is full, and
    exact for a run resumed mid-epoch (its counters start from the committed uids, so capacity is
    neither inflated nor lost).
    """

    def __init__(self, *, batch_size: int, max_staleness: int, max_concurrency: int | None,
                 on_transition: Callable[[Counters], None] | None, version: int) -> None:
        self.cond = asyncio.Condition()
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.max_concurrency = max_concurrency
        self.on_transition = on_transition
        self.version = version
        self.epoch = 0
        self.epoch_version = 0
        self.running = self.accepted = self.filtered = 0
        self.trained = self.synced = 0
        self.failure: BaseException | None = None
        """The first error that must stop the run (a rollout's, or the hook's)."""

    def room(self, limit: int | None) -> bool:
        """Whether one more rollout may start now; `limit` caps accepted + running further (the
        groups the run's remaining steps can still train)."""
        window = self.accepted + self.running
        return (
            self.failure is None
            and (self.max_concurrency is None or self.running < self.max_concurrency)
            and window < self.synced + (self.max_staleness + 1) * self.batch_size
            and (limit is None or window < limit)
        )

    # Transitions: call with `cond` held.
    def open_epoch(self, epoch: int, *, epoch_version: int, accepted: int, filtered: int) -> None:
        """Start counting `epoch` from its committed progress (nothing running or buffered)."""
        self.epoch, self.epoch_version = epoch, epoch_version
        self.running = 0
        self.accepted = self.trained = self.synced = accepted
        self.filtered = filtered
        self._changed("epoch")

    def admitted(self) -> None:
        self.running += 1
        self._changed("admitted")

    def resolved(self, accepted: bool) -> None:
        self.running -= 1
        if accepted:
            self.accepted += 1
        else:
            self.filtered += 1
        self._changed("accepted" if accepted else "filtered")

    def trained_step(self, groups: int) -> None:
        self.trained += groups
        self._changed("trained")

    def synced_step(self, groups: int) -> None:
        self.synced += groups
        self.version += 1
        self.epoch_version += 1
        self._changed("synced")

    def fail(self, error: BaseException) -> None:
        """Record why the run must stop (the first reason wins) and wake every waiter."""
        if self.failure is None:
            self.failure = error
        self.cond.notify_all()

    def check_epoch_end(self, buffered: int) -> None:
        """The invariants of an epoch boundary: nothing running, every submitted rollout accepted
        or filtered, and every accepted group trained (nothing buffered)."""
        if self.running or self.accepted != self.trained or buffered:
            raise TrainerError(
                f"epoch {self.epoch} ended with running={self.running}, "
                f"submitted={self.submitted}, accepted={self.accepted}, filtered={self.filtered}, "
                f"trained={self.trained}, buffered={buffered}: an actormesh bug, please report")

    @property
    def submitted(self) -> int:
        return self.running + self.accepted + self.filtered

    def snapshot(self, event: Transition) -> Counters:
        return Counters(event, self.epoch, self.version, self.epoch_version, self.submitted,
                        self.running, self.accepted, self.filtered, self.trained)

    def _changed(self, event: Transition) -> None:
        if self.on_transition is not None:
            try:
                self.on_transition(self.snapshot(event))
            except Exception as exc:  # the hook's error stops the run, raised as it is
                logger.error("on_transition raised %r at %r; stopping the run", exc, event)
                self.fail(exc)
        self.cond.notify_all()
