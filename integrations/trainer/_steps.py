"""Calling the user's `train` and `sync_weights` so that rollouts go on while a step runs.

A coroutine function runs on the event loop. A plain function runs on the run's one worker
thread (the same thread for every step of a run, so thread-local state such as a CUDA device
holds), and if it returns an awaitable, that is awaited on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar, cast

from ._ledger import Ledger
from ._metrics import StepMetrics
from ._progress import Progress
from ._rollout import Outcome, run_rollout
from ._settings import Settings
from ._waits import watched

logger = logging.getLogger("actormesh.trainer")

G = TypeVar("G")


def _is_async(fn: Callable[..., object]) -> bool:
    """A coroutine function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class StepCalls(Generic[G]):
    """The user's `train(groups, step)` and `sync_weights(version)`, and the version the
    generator is known to hold (`None` after a state was loaded: unknown until synced)."""

    def __init__(self, train: Callable[[list[G], int], object],
                 sync_weights: Callable[[int], object] | None) -> None:
        self._train = train
        self._sync = sync_weights
        self.engine_version: int | None = 0
        self._executor: ThreadPoolExecutor | None = None
        self._in_thread: concurrent.futures.Future[object] | None = None

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncGenerator[None, None]:
        """The worker thread for one run; gone when the run returns (unless a step is still
        running in it when the run is cancelled: it cannot be stopped, and ends on its own)."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actormesh-train")
        self._executor = executor
        try:
            yield
        finally:
            self._executor = None
            busy = self._in_thread is not None and not self._in_thread.done()
            if busy:
                logger.warning("the run stopped while train or sync_weights still runs in its "
                               "thread; the thread ends when that call returns")
            executor.shutdown(wait=not busy, cancel_futures=True)

    async def train(self, groups: list[G], step: int) -> None:
        await self._call(self._train, (groups, step), f"train step {step}")

    async def sync(self, version: int) -> None:
        """`sync_weights(version)`, if given; the generator then holds `version`."""
        if self._sync is not None:
            await self._call(self._sync, (version,), f"sync_weights({version})")
        self.engine_version = version

    def needs_sync(self, version: int) -> bool:
        """Whether a run must first bring the generator to `version` (after a loaded state)."""
        return self._sync is not None and self.engine_version != version

    async def _call(self, fn: Callable[..., object], args: tuple[object, ...], what: str) -> None:
        if _is_async(fn):
            result = await watched(cast("Awaitable[object]", fn(*args)), what)
        else:
            if self._executor is None:
                raise RuntimeError(f"{what} called outside a run")
            # The concurrent future, unlike its asyncio wrapper, stays running while the
            # thread does, even after the run is cancelled: session() needs to know.
            self._in_thread = self._executor.submit(functools.partial(fn, *args))
            result = await watched(asyncio.wrap_future(self._in_thread), what)
        if inspect.isawaitable(result):
            await watched(result, what)


class Loop(Generic[G]):
    """What one run of either loop holds: the settings, the committed progress, the user's calls,
    the step limit, and the ledger that admits rollouts (`max_staleness` 0 for the sync loop)."""

    def __init__(self, settings: Settings[G], progress: Progress, calls: StepCalls[G],
                 max_steps: int | None, *, max_staleness: int) -> None:
        self.settings = settings
        self.progress = progress
        self.calls = calls
        self.max_steps = max_steps
        self.first_step = progress.step
        self.ledger = Ledger(
            batch_size=settings.batch_size, max_staleness=max_staleness,
            max_concurrency=settings.max_concurrency, on_transition=settings.on_transition,
            version=progress.step)

    @property
    def steps_done(self) -> int:
        return self.progress.step - self.first_step

    def wants_more(self) -> bool:
        return self.progress.epoch < self.settings.epochs and (
            self.max_steps is None or self.steps_done < self.max_steps)

    def _admit(self) -> None:
        """Start what the admission rule allows (with `ledger.cond` held); the sync loop starts
        its rollouts itself."""

    def _open_epoch(self) -> None:
        """With `ledger.cond` held: count the epoch from its committed progress, and admit."""
        progress = self.progress
        self.ledger.open_epoch(progress.epoch, epoch_version=progress.epoch_step,
                               accepted=len(progress.consumed), filtered=len(progress.filtered))
        self._admit()

    async def _end_epoch(self, buffered: int) -> None:
        async with self.ledger.cond:
            self.ledger.check_epoch_end(buffered=buffered)
            self.progress.next_epoch()
            if self.wants_more():
                self._open_epoch()

    async def _attempt(self, uid: int) -> Outcome[G]:
        settings, ledger = self.settings, self.ledger
        return await run_rollout(
            lambda: settings.start(uid), uid, version=lambda: ledger.version,
            timeout_s=settings.rollout_timeout_s, retries=settings.rollout_retries)

    async def _step(self, accepted: list[Outcome[G]], filtered: list[Outcome[G]], mark: float,
                    start: float) -> StepMetrics:
        progress, ledger = self.progress, self.ledger
        step, epoch = progress.step, progress.epoch
        ready = sorted(accepted, key=lambda o: o.uid)
        groups = [o.group for o in ready if o.group is not None]
        t_ready = time.perf_counter()
        await self.calls.train(groups, step)
        t_trained = time.perf_counter()
        progress.commit([o.uid for o in accepted], [o.uid for o in filtered], trained=True)
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
            filtered=sorted(o.uid for o in filtered),
            retries=sum(o.attempts - 1 for o in accepted + filtered),
            wait_s=t_ready - mark, train_s=t_trained - t_ready, sync_s=t_synced - t_trained,
            elapsed_s=t_synced - start)
