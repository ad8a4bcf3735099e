"""`AsyncTrainer[G]`: settings checked up front, committed progress, and the two ways to run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from ._async_loop import AsyncLoop
from ._ledger import Counters
from ._metrics import StepMetrics
from ._progress import Progress, TrainerState
from ._settings import (
    Settings,
    check_callable,
    check_int,
    check_optional_int,
    check_timeout,
)
from ._steps import StepCalls
from ._sync_loop import SyncLoop

logger = logging.getLogger("actormesh.trainer")

G = TypeVar("G")
P = TypeVar("P")


class AsyncTrainer(Generic[G]):
    """The fully asynchronous RL loop (AReaL, SkyRL) over any async generator.

    `rollout(prompt, uid)` makes one prompt's group, or `None` to filter it out; `train(groups,
    step)` (sync or async) trains one step on groups sorted by uid; `sync_weights(version)` (sync
    or async) brings the generator to the weights of `version` steps. See the package docstring
    for the exact rules: admission, versions and staleness, batches, failures and resume.
    """

    def __init__(
        self,
        prompts: Sequence[P],
        rollout: Callable[[P, int], Awaitable[G | None]],
        train: Callable[[list[G], int], object],
        *,
        batch_size: int,
        max_staleness: int = 1,
        max_concurrency: int | None = None,
        sync_weights: Callable[[int], object] | None = None,
        epochs: int = 1,
        seed: int = 0,
        rollout_timeout_s: float | None = None,
        rollout_retries: int = 2,
        sync: bool = False,
        on_transition: Callable[[Counters], None] | None = None,
    ) -> None:
        """Check every setting (a `ValueError` or `TypeError` naming the bad one) and start at
        epoch 0, step 0; nothing runs before `run()` / `run_async()`.

        `max_concurrency` caps the rollouts running at once (None: only the admission rule);
        `rollout_retries` is the number of extra attempts after a failure or a timeout;
        `sync=True` runs the plain synchronous loop (generate, train, sync) and ignores
        `max_staleness`; `on_transition(counters)` is called on the event loop after every
        change of the admission counters (for metrics or checks; an exception stops the run).
        """
        # Anything indexable with a length will do (a list, an array, a datasets.Dataset).
        if (isinstance(prompts, (str, bytes, Mapping)) or not hasattr(prompts, "__len__")
                or not hasattr(prompts, "__getitem__")):
            raise TypeError(f"prompts must be a sequence (indexed by uid), got "
                            f"{type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError("prompts is empty: nothing to train on")
        check_callable("rollout", rollout)
        check_callable("train", train)
        check_callable("sync_weights", sync_weights, optional=True)
        check_callable("on_transition", on_transition, optional=True)
        if not isinstance(sync, bool):
            raise TypeError(f"sync={sync!r}: must be a bool")
        if type(seed) is not int:
            raise ValueError(f"seed={seed!r}: must be an int")

        def start(uid: int) -> Awaitable[G | None]:
            return rollout(prompts[uid], uid)

        self._settings: Settings[G] = Settings(
            start=start,
            num_prompts=len(prompts),
            batch_size=check_int("batch_size", batch_size, 1),
            max_staleness=check_int("max_staleness", max_staleness, 0),
            max_concurrency=check_optional_int("max_concurrency", max_concurrency, 1),
            epochs=check_int("epochs", epochs, 1),
            seed=seed,
            rollout_timeout_s=check_timeout("rollout_timeout_s", rollout_timeout_s),
            rollout_retries=check_int("rollout_retries", rollout_retries, 0),
            on_transition=on_transition,
        )
        self._sync = sync
        self._calls = StepCalls(train, sync_weights)
        self._progress = Progress(len(prompts), seed)
        self._running = False

    @property
    def step(self) -> int:
        """Steps trained so far (committed), over every run and epoch."""
        return self._progress.step

    @property
    def epoch(self) -> int:
        """The epoch the next step belongs to (`epochs` once training is complete)."""
        return self._progress.epoch + self._progress.epoch_done

    def run(self, max_steps: int | None = None) -> list[StepMetrics]:
        """Train until every epoch is done, or for at most `max_steps` more steps, and return
        the metrics of the steps trained. Owns an event loop: from async code (a running loop),
        use `await trainer.run_async()`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async(max_steps))
        raise RuntimeError("AsyncTrainer.run() was called inside a running event loop; "
                           "use `await trainer.run_async()` there")

    async def run_async(self, max_steps: int | None = None) -> list[StepMetrics]:
        """`run()` on the caller's event loop; rollouts are tasks of that loop."""
        max_steps = check_optional_int("max_steps", max_steps, 0)
        if self._running:
            raise RuntimeError("this AsyncTrainer is already running; one run at a time")
        progress, settings = self._progress, self._settings
        if progress.epoch >= settings.epochs or max_steps == 0:
            return []
        self._running = True
        try:
            async with self._calls.session():
                if self._calls.needs_sync(progress.step):
                    logger.info("syncing the generator to version %d before the run",
                                progress.step)
                    await self._calls.sync(progress.step)
                loop = (SyncLoop if self._sync else AsyncLoop)(
                    settings, progress, self._calls, max_steps)
                return await loop.run()
        finally:
            self._running = False

    def state_dict(self) -> TrainerState:
        """The committed progress: epoch, step, the epoch's consumed and filtered uids, its
        counters. Groups generated past it (buffered, or running at a stop) are not in it: the
        next run generates them again, so no prompt is lost or trained twice."""
        return self._progress.state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict()` of a trainer with the same prompts and seed (a
        `ValueError` names what does not fit). The next run first calls `sync_weights(step)`,
        since the generator's weights are unknown."""
        if self._running:
            raise RuntimeError("load_state_dict() while the trainer is running")
        self._progress = Progress.from_state(
            state, num_prompts=self._settings.num_prompts, seed=self._settings.seed)
        self._calls.engine_version = None
