"""The asynchronous loop: admission, one task per rollout, and steps over permutation spans.

```
 rollout tasks ──resolved──▶ outcomes[pos] ──┐      (every change under ledger.cond, notify_all)
      ▲                                      ▼
 _admit() ◀── a rollout resolved,       _next_span(): walk the permutation from the committed
      │       or a step synced          cursor until batch_size groups are accepted (or the
      │                                 epoch ends), waiting on the condition
      │                                      ▼
      └──────── synced ◀── sync_weights ◀── train (thread or loop) ◀── groups sorted by uid
```
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Generic, TypeVar

from ._metrics import StepMetrics
from ._progress import Progress
from ._rollout import Outcome
from ._settings import Settings
from ._steps import Loop, StepCalls
from ._waits import CANCEL_GRACE_S, STALL_LOG_S, cancel_all

logger = logging.getLogger("actormesh.trainer")

G = TypeVar("G")


@dataclasses.dataclass
class Span(Generic[G]):
    """The permutation positions [start, end) of one step: its accepted and filtered rollouts."""

    end: int
    accepted: list[Outcome[G]]
    filtered: list[Outcome[G]]


class AsyncLoop(Loop[G]):
    """One run of the asynchronous loop (see the package docstring for its rules)."""

    def __init__(self, settings: Settings[G], progress: Progress, calls: StepCalls[G],
                 max_steps: int | None) -> None:
        super().__init__(settings, progress, calls, max_steps,
                         max_staleness=settings.max_staleness)
        self.next_pos = 0
        self.outcomes: dict[int, Outcome[G]] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def run(self) -> list[StepMetrics]:
        metrics: list[StepMetrics] = []
        start = mark = time.perf_counter()
        try:
            async with self.ledger.cond:
                self._open_epoch()
            while self.wants_more():
                span = await self._next_span()
                if span.accepted:
                    metrics.append(await self._step(span.accepted, span.filtered, mark, start))
                    mark = time.perf_counter()
                else:  # the epoch ends on filtered prompts: no step
                    self.progress.commit([], [o.uid for o in span.filtered], trained=False)
                if self.progress.epoch_done:
                    await self._end_epoch(buffered=len(self.outcomes) + len(self.tasks))
        finally:
            await self._stop()
        return metrics

    def _open_epoch(self) -> None:
        self.next_pos = self.progress.cursor
        super()._open_epoch()

    def _limit(self) -> int | None:
        """Accepted + running stays below the groups the run's remaining steps can train."""
        if self.max_steps is None:
            return None
        return self.ledger.trained + (self.max_steps - self.steps_done) * self.settings.batch_size

    def _admit(self) -> None:
        """Start rollouts in permutation order while the rule allows (with `ledger.cond` held)."""
        order = self.progress.order
        while self.next_pos < len(order) and self.ledger.room(self._limit()):
            pos, uid = self.next_pos, order[self.next_pos]
            self.next_pos += 1
            self.ledger.admitted()
            self.tasks[pos] = asyncio.create_task(self._rollout(pos, uid),
                                                  name=f"actormesh.trainer rollout uid {uid}")

    async def _rollout(self, pos: int, uid: int) -> None:
        ledger = self.ledger
        try:
            outcome = await self._attempt(uid)
        except Exception as exc:
            async with ledger.cond:
                self.tasks.pop(pos, None)
                logger.error("%s; stopping the run", exc)
                ledger.fail(exc)
            return
        async with ledger.cond:
            self.tasks.pop(pos, None)
            self.outcomes[pos] = outcome
            ledger.resolved(outcome.group is not None)
            self._admit()

    async def _next_span(self) -> Span[G]:
        """Wait until the next step's span is resolved: `batch_size` accepted groups from the
        committed cursor on, or every remaining prompt of the epoch."""
        batch_size, order = self.settings.batch_size, self.progress.order
        span: Span[G] = Span(self.progress.cursor, [], [])
        async with self.ledger.cond:
            while True:
                if self.ledger.failure is not None:
                    raise self.ledger.failure
                while (len(span.accepted) < batch_size and span.end < len(order)
                       and span.end in self.outcomes):
                    outcome = self.outcomes.pop(span.end)
                    (span.accepted if outcome.group is not None else span.filtered).append(outcome)
                    span.end += 1
                if len(span.accepted) == batch_size or span.end == len(order):
                    return span
                try:
                    await asyncio.wait_for(self.ledger.cond.wait(), STALL_LOG_S)
                except asyncio.TimeoutError:
                    logger.warning(
                        "step %d has waited %.0f s for its batch; rollouts running: uids %s",
                        self.progress.step, STALL_LOG_S,
                        sorted(order[pos] for pos in self.tasks))

    async def _stop(self) -> None:
        """Cancel the rollouts still running; their prompts, like buffered groups, are past the
        committed cursor and will be generated again by the next run."""
        await cancel_all(list(self.tasks.values()), "rollout tasks", CANCEL_GRACE_S + 1)
        self.tasks.clear()
        self.outcomes.clear()
