"""One prompt's rollout with its timeout and retries, the same for the async and the sync loop.

Each attempt runs as a task of its own, so a timeout cancels only the attempt, and a rollout that
ignores its cancellation is found out (after `CANCEL_GRACE_S`) instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ._errors import RolloutError
from ._waits import CANCEL_GRACE_S

logger = logging.getLogger("actormesh.trainer")

G = TypeVar("G")

@dataclasses.dataclass(frozen=True)
class Outcome(Generic[G]):
    """A finished rollout: its group (`None`: filtered), the version its last attempt started
    with, and how many attempts it took."""

    uid: int
    group: G | None
    version: int
    attempts: int


async def run_rollout(start: Callable[[], Awaitable[G | None]], uid: int, *,
                      version: Callable[[], int], timeout_s: float | None,
                      retries: int) -> Outcome[G]:
    """Run `start()` until an attempt returns, at most `retries + 1` times.

    An attempt that raises or runs past `timeout_s` is cancelled and tried again; the last
    failure raises `RolloutError` naming `uid`. `version()` is read as each attempt starts.
    Cancelling this coroutine cancels the attempt in flight and waits for it to stop.
    """
    attempts = retries + 1
    error: BaseException | None = None
    for attempt in range(1, attempts + 1):
        started_with = version()
        try:
            task = asyncio.ensure_future(start())
        except Exception as exc:  # a rollout that raises before returning its awaitable
            error = exc
        else:
            try:
                done, _ = await asyncio.wait({task}, timeout=timeout_s)
            except asyncio.CancelledError:
                await _stop(task, uid, attempt)
                raise
            if not done:
                await _stop(task, uid, attempt)
                error = TimeoutError(f"ran past rollout_timeout_s={timeout_s}")
            elif task.cancelled():
                error = asyncio.CancelledError("the rollout was cancelled by someone else")
            elif (raised := task.exception()) is not None:
                error = raised
            else:
                return Outcome(uid, task.result(), started_with, attempt)
        if attempt < attempts:
            logger.warning("rollout of uid %d: attempt %d of %d failed (%r); retrying",
                           uid, attempt, attempts, error)
    raise RolloutError(uid, attempts, f"last error: {error!r}") from error


async def _stop(task: asyncio.Future[Any], uid: int, attempt: int) -> None:
    """Cancel an attempt and wait for it to end; one that will not end fails the run."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    if not done:
        raise RolloutError(uid, attempt, f"the rollout did not stop within {CANCEL_GRACE_S} s "
                                         "of being cancelled (does it swallow CancelledError?)")
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
