"""The plain synchronous loop (`sync=True`): generate a batch, train on it, sync the weights.

It is the reference that `max_staleness=0` must equal bit for bit, so it is written as directly
as the loop users write by hand, sharing with the async loop only the permutation, the rollout
attempts (timeout and retries), the calls of `train` / `sync_weights` and the counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

from ._metrics import StepMetrics
from ._progress import Progress
from ._rollout import Outcome
from ._settings import Settings
from ._steps import Loop, StepCalls
from ._waits import wait_all

logger = logging.getLogger("actormesh.trainer")

G = TypeVar("G")


class SyncLoop(Loop[G]):
    """One run of the synchronous loop."""

    def __init__(self, settings: Settings[G], progress: Progress, calls: StepCalls[G],
                 max_steps: int | None) -> None:
        super().__init__(settings, progress, calls, max_steps, max_staleness=0)

    async def run(self) -> list[StepMetrics]:
        settings, progress, ledger = self.settings, self.progress, self.ledger
        metrics: list[StepMetrics] = []
        start = time.perf_counter()
        async with ledger.cond:
            self._open_epoch()
        while self.wants_more():
            t0 = time.perf_counter()
            # Generate the next batch_size prompts; replace the filtered ones by the next ones.
            pos, accepted, filtered = progress.cursor, list[Outcome[G]](), list[Outcome[G]]()
            while len(accepted) < settings.batch_size and pos < settings.num_prompts:
                uids = progress.order[pos: pos + settings.batch_size - len(accepted)]
                pos += len(uids)
                for outcome in await self._generate(uids):
                    (accepted if outcome.group is not None else filtered).append(outcome)
            if accepted:
                metrics.append(await self._step(accepted, filtered, t0, start))
            else:
                progress.commit([], [o.uid for o in filtered], trained=False)
            if progress.epoch_done:
                await self._end_epoch(buffered=0)
        return metrics

    async def _generate(self, uids: list[int]) -> list[Outcome[G]]:
        """The rollouts of `uids`, at most `max_concurrency` at a time, in the order of `uids`."""
        ledger = self.ledger
        slots = asyncio.Semaphore(self.settings.max_concurrency or len(uids))

        async def one(uid: int) -> Outcome[G]:
            async with slots:
                async with ledger.cond:
                    ledger.admitted()
                outcome = await self._attempt(uid)
                async with ledger.cond:
                    ledger.resolved(outcome.group is not None)
                if ledger.failure is not None:  # the on_transition hook raised
                    raise ledger.failure
                return outcome

        tasks = [asyncio.create_task(one(uid), name=f"actormesh.trainer rollout uid {uid}")
                 for uid in uids]
        return await wait_all(tasks, f"step {self.progress.step}: rollouts")
