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
from ._rollout import Outcome, run_rollout
from ._settings import Settings
from ._steps import Loop, StepCalls
from ._waits import CANCEL_GRACE_S, STALL_LOG_S

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
        self.steps_done = 0
        self.next_pos = 0
        self.outcomes: dict[int, Outcome[G]] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def wants_more(self) -> bool:
        return self.progress.epoch < self.settings.epochs and (
            self.max_steps is None or self.steps_done < self.max_steps)

    async def run(self) -> list[StepMetrics]:
        metrics: list[StepMetrics] = []
        start = mark = time.perf_counter()
        try:
            async with self.ledger.cond:
                self._open_epoch()
            while self.wants_more():
                span = await self._next_span()
                if span.accepted:
                    metrics.append(await self._step(span, mark, start))
                    mark = time.perf_counter()
                else:  # the epoch ends on filtered prompts: no step
                    self.progress.commit([], [o.uid for o in span.filtered], trained=False)
                    self._forget(span.end)
                if self.progress.epoch_done:
                    await self._end_epoch()
        finally:
            await self._stop()
        return metrics

    def _open_epoch(self) -> None:
        progress = self.progress
        self.ledger.open_epoch(progress.epoch, epoch_version=progress.epoch_step,
                               accepted=len(progress.consumed), filtered=len(progress.filtered))
        self.next_pos = progress.cursor
        self._admit()

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
        settings, ledger = self.settings, self.ledger
        try:
            outcome = await run_rollout(
                lambda: settings.start(uid), uid, version=lambda: ledger.version,
                timeout_s=settings.rollout_timeout_s, retries=settings.rollout_retries)
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
                    outcome = self.outcomes[span.end]
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

    async def _step(self, span: Span[G], mark: float, start: float) -> StepMetrics:
        progress, ledger = self.progress, self.ledger
        step, epoch = progress.step, progress.epoch
        ready = sorted(span.accepted, key=lambda o: o.uid)
        groups = [o.group for o in ready if o.group is not None]
        t_ready = time.perf_counter()
        await self.calls.train(groups, step)
        t_trained = time.perf_counter()
        progress.commit([o.uid for o in span.accepted], [o.uid for o in span.filtered],
                        trained=True)
        self._forget(span.end)
        self.steps_done += 1
        async with ledger.cond:
            ledger.trained_step(len(groups))
        if ledger.failure is not None:
            raise ledger.failure  # the step is committed; the next run syncs its weights first
        await self.calls.sync(step + 1)
        t_synced = time.perf_counter()
        async with ledger.cond:
            ledger.synced_step(len(groups))
            self._admit()
        logger.debug("step %d trained %d groups (uids %s)", step, len(groups),
                     [o.uid for o in ready])
        return StepMetrics(
            step=step, epoch=epoch, uids=[o.uid for o in ready],
            versions=[o.version for o in ready], staleness=[step - o.version for o in ready],
            filtered=sorted(o.uid for o in span.filtered),
            retries=sum(o.attempts - 1 for o in span.accepted + span.filtered),
            wait_s=t_ready - mark, train_s=t_trained - t_ready, sync_s=t_synced - t_trained,
            elapsed_s=t_synced - start)

    def _forget(self, end: int) -> None:
        for pos in [pos for pos in self.outcomes if pos < end]:
            del self.outcomes[pos]

    async def _end_epoch(self) -> None:
        async with self.ledger.cond:
            self.ledger.check_epoch_end(buffered=len(self.outcomes) + len(self.tasks))
            self.progress.next_epoch()
            if self.wants_more():
                self._open_epoch()

    async def _stop(self) -> None:
        """Cancel the rollouts still running; their prompts, like buffered groups, are past the
        committed cursor and will be generated again by the next run."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CANCEL_GRACE_S + 1)
            if pending:
                logger.error("%d rollout tasks did not stop after being cancelled", len(pending))
        self.tasks.clear()
        self.outcomes.clear()
