"""Many futures at once, as Ray users read many refs: `am.get` and `am.wait`.

`get` waits for the futures, then reads every value still unread in ONE `ray.get` of the
ObjectRefs of the lone calls among them (a call that rode a task with others is read from what
its task returned, which is already here), instead of one
wait and one read per future. `wait` returns as soon as enough futures are done, with one
sleeping waiter woken by the calls' completions.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar, overload

import ray
from ray.exceptions import GetTimeoutError, RayError

from . import _ray
from ._calls import LONE, Task
from ._future import MeshFuture
from ._result import Result

R = TypeVar("R")


@overload
def get(futures: MeshFuture[R], timeout: float | None = None) -> R: ...
@overload
def get(futures: Sequence[MeshFuture[R]], timeout: float | None = None) -> list[R]: ...
@overload
def get(futures: Sequence[MeshFuture[Any]], timeout: float | None = None) -> list[Any]: ...
def get(futures: MeshFuture[Any] | Sequence[MeshFuture[Any]],
        timeout: float | None = None) -> Any:
    """The values of `futures` in order (of one future: its value), waiting for all of them
    once. The first error in order is raised (a future made with `return_exceptions=True`
    returns its error as its value); `TimeoutError` if they are not all done within `timeout`
    seconds (the calls go on)."""
    check_timeout(timeout)
    if isinstance(futures, MeshFuture):
        return futures.get(timeout)
    found = _futures(futures, "get")
    deadline = None if timeout is None else time.monotonic() + timeout
    if not _read_together(found, deadline):
        pending = sum(not f.done() for f in found)
        raise TimeoutError(f"am.get: {pending} of {len(found)} futures not done within "
                           f"timeout={timeout} s")
    return [f.get(_left(deadline)) for f in found]


def wait(futures: Sequence[MeshFuture[R]], num_returns: int = 1,
         timeout: float | None = None) -> tuple[list[MeshFuture[R]], list[MeshFuture[R]]]:
    """`(done, pending)` as `ray.wait` returns them: once `num_returns` of `futures` are done,
    or `timeout` seconds have passed, the first `num_returns` done futures in the order given,
    and the others in the order given."""
    check_timeout(timeout)
    found = _futures(futures, "wait")
    if not found:
        return [], []
    if len({id(f) for f in found}) != len(found):
        raise ValueError("am.wait: every future must be given once")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) \
            or not 1 <= num_returns <= len(found):
        raise ValueError(f"num_returns={num_returns!r}: must be an int from 1 to the number of "
                         f"futures ({len(found)})")
    if sum(f.done() for f in found) < num_returns and timeout != 0:
        _Waiter(found, num_returns).wait(timeout)
    done: list[MeshFuture[R]] = []
    pending: list[MeshFuture[R]] = []
    for future in found:
        (done if len(done) < num_returns and future.done() else pending).append(future)
    return done, pending


def _read_together(futures: list[MeshFuture[Any]], deadline: float | None) -> bool:
    """Wait for the single-call futures and read every lone call's value they still lack in
    one `ray.get`; False if the deadline passed first. On any error the futures are left to
    read themselves, in order."""
    lone: list[tuple[MeshFuture[Any], Task]] = []
    for future in futures:
        if future._combine is not None or not future._unread():
            continue
        call = future._calls[0]
        task = call.task
        # A lone call already sent is read as soon as its value exists (see `_calls.read_sent`);
        # any other waits for its end, which may be a failure, a retry, its own timeout or (a
        # hedged call) the end of its other copy.
        if task is None or task.wire != LONE or task.ref is None or call.fn is not None \
                or call.deadline is not None or call.hedge is not None:
            if not future._future.wait(_left(deadline)):
                return False
            continue
        lone.append((future, task))
    if not lone:
        return True
    if not _ray.connected():
        return True  # each future reads its own outcome, and is refused there
    try:
        values = ray.get([task.ref for _, task in lone], timeout=_left(deadline))
    except GetTimeoutError:
        return False
    except RayError:
        return True  # some call failed: each future reads (and raises) its own outcome
    for (future, task), value in zip(lone, values):
        task.router.read_ended(task, timed=False)  # read together: each end is unknown
        future._future.wait()  # ended: here, or by Ray's callback a moment from now
        if future._future.exception() is None and future._future.result()[0] is task:
            future._provide(value)
    return True


class _Waiter:
    """Sleeps until `needed` of some futures are done: each future's completion counts once, on
    the thread that completes it (O(1)), and the waiter stops listening when it returns."""

    def __init__(self, futures: list[MeshFuture[Any]], needed: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._done = sum(f.done() for f in futures)
        self._needed = needed
        self._results = [f._future for f in futures if not f.done()]

    def wait(self, timeout: float | None) -> None:
        for result in self._results:
            _watch(result, self)
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._done >= self._needed, timeout)
        finally:
            for result in self._results:
                _unwatch(result, self)

    def one_done(self) -> None:
        with self._cond:
            self._done += 1
            if self._done >= self._needed:
                self._cond.notify()


# The waiters of each pending Result. A Result gets one callback, however many waiters come and
# go, so that calling `wait` again and again on the same pending futures leaves nothing behind.
_watchers: dict[Result[Any], list[_Waiter]] = {}
_watchers_lock = threading.Lock()


def _watch(result: Result[Any], waiter: _Waiter) -> None:
    with _watchers_lock:
        waiters = _watchers.get(result)
        first = waiters is None
        if waiters is None:
            waiters = _watchers[result] = []
        waiters.append(waiter)
    if first:
        result.add_done_callback(_settled)


def _unwatch(result: Result[Any], waiter: _Waiter) -> None:
    with _watchers_lock:
        waiters = _watchers.get(result)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)


def _settled(result: Result[Any]) -> None:
    with _watchers_lock:
        waiters = _watchers.pop(result, [])
    for waiter in waiters:
        waiter.one_done()


def _futures(futures: Any, verb: str) -> list[MeshFuture[Any]]:
    if isinstance(futures, (str, bytes)) or not isinstance(futures, Sequence):
        raise TypeError(f"am.{verb} takes a list of am.MeshFuture, got {futures!r}")
    found = list(futures)
    for future in found:
        if not isinstance(future, MeshFuture):
            raise TypeError(f"am.{verb} takes am.MeshFuture objects, got {future!r}")
    return found


def check_timeout(timeout: float | None) -> None:
    """None, or a finite number of seconds >= 0 (0 polls, as `ray.wait` does)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout={timeout!r}: must be a finite number of seconds >= 0, or None")


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)

