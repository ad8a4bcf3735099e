"""How long the trainer waits before it speaks up, and its waits that speak up when they last."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

logger = logging.getLogger("actormesh.trainer")

T = TypeVar("T")

STALL_LOG_S = 60.0
"""A wait that lasts this long without progress logs a warning naming what it waits for, then
goes on waiting: a rollout or a step with no timeout of its own is never silent."""

CANCEL_GRACE_S = 10.0
"""How long a cancelled rollout may take to stop before the trainer gives up on it."""


class _Watch:
    """Warns every `STALL_LOG_S` that `what` is still running, until cancelled."""

    def __init__(self, what: str) -> None:
        self.what, self.start = what, time.perf_counter()
        self.loop = asyncio.get_running_loop()
        self.handle = self.loop.call_later(STALL_LOG_S, self._warn)

    def _warn(self) -> None:
        logger.warning("%s: still running after %.0f s", self.what,
                       time.perf_counter() - self.start)
        self.handle = self.loop.call_later(STALL_LOG_S, self._warn)

    def cancel(self) -> None:
        self.handle.cancel()


async def watched(awaitable: Awaitable[T], what: str) -> T:
    """`await awaitable`, warning every `STALL_LOG_S` while it runs. Awaited directly, not as a
    task, so what follows its return runs in the same step of the event loop."""
    watch = _Watch(what)
    try:
        return await awaitable
    finally:
        watch.cancel()


async def wait_all(tasks: list[asyncio.Task[T]], what: str) -> list[T]:
    """The results of `tasks` in their order. The first to raise cancels the others (each
    given `CANCEL_GRACE_S` to stop) and its error is raised; so does cancelling the caller."""
    start = time.perf_counter()
    try:
        pending: set[asyncio.Task[T]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=STALL_LOG_S, return_when=asyncio.FIRST_EXCEPTION)
            # Read every finished task's error (asyncio logs those never read); raise the first.
            errors = [task.exception() for task in done if not task.cancelled()]
            for error in errors:
                if error is not None:
                    raise error
            if not done:
                logger.warning("%s: %d still running after %.0f s", what, len(pending),
                               time.perf_counter() - start)
        return [task.result() for task in tasks]
    finally:
        await cancel_all([task for task in tasks if not task.done()], what)


async def cancel_all(tasks: list[asyncio.Task[Any]], what: str,
                     grace_s: float = CANCEL_GRACE_S) -> None:
    """Cancel `tasks` and give them `grace_s` to stop; log those that do not."""
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        if pending:
            logger.error("%s: %d did not stop within %s s of being cancelled", what,
                         len(pending), grace_s)
