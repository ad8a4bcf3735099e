"""Many futures at once, as Ray users read many refs: `am.get` and `am.wait`.

Both take mesh futures and Ray ObjectRefs mixed, as one list.
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
from collections.abc import Collection, Sequence
from typing import Any, TypeAlias, TypeVar, overload

from ray import ObjectRef
from ray.exceptions import GetTimeoutError, RayError

from . import _ray
from ._calls import Result, Task
from ._errors import ray_failure
from ._future import MeshFuture

R = TypeVar("R")
W = TypeVar("W", bound="MeshFuture[Any] | ObjectRef[Any]")  # what `wait` is given, it returns


Item: TypeAlias = "MeshFuture[Any] | ObjectRef[Any]"
"""What `am.get` and `am.wait` take: mesh futures and Ray ObjectRefs, mixed."""


@overload
def get(futures: MeshFuture[R], timeout: float | None = None) -> R: ...
@overload
def get(futures: ObjectRef[R], timeout: float | None = None) -> R: ...
@overload
def get(futures: Sequence[MeshFuture[R]], timeout: float | None = None) -> list[R]: ...
@overload
def get(futures: Sequence[Item], timeout: float | None = None) -> list[Any]: ...
def get(futures: Item | Sequence[Item], timeout: float | None = None) -> Any:
    """The values of `futures` (mesh futures and Ray ObjectRefs, mixed) in order (of one: its
    value), waiting for all of them once. The first error in order is raised (a future made
    with `return_exceptions=True` returns its error as its value; an ObjectRef's error is
    Ray's, as `ray.get` raises it); `TimeoutError` if they are not all done within `timeout`
    seconds (the calls go on)."""
    check_timeout(timeout)
    try:
        if isinstance(futures, MeshFuture):
            return futures.get(timeout)
        if isinstance(futures, ObjectRef):
            return _ray.get(futures, timeout)
        found = _items(futures, "get")
        deadline = None if timeout is None else time.monotonic() + timeout
        refs = list(dict.fromkeys(x for x in found if isinstance(x, ObjectRef)))
        mesh_futures = [x for x in found if isinstance(x, MeshFuture)]
        if refs and len(_ray.wait(refs, len(refs), _left(deadline))[0]) < len(refs) \
                or not _read_together(mesh_futures, deadline):
            pending = sum(not _done(x, refs) for x in found)
            raise TimeoutError(f"am.get: {pending} of {len(found)} futures not done within "
                               f"timeout={timeout} s")
        values = _read_refs(refs)
        return [values[x] if isinstance(x, ObjectRef) and values is not None
                else _ray.get(x) if isinstance(x, ObjectRef)
                else x.get(_left(deadline)) for x in found]
    except SystemExit as err:  # Ray's, in a thread that waited while ray.shutdown() ran
        raise ray_failure("am.get", err) from err


def wait(futures: Sequence[W], num_returns: int = 1,
         timeout: float | None = None) -> tuple[list[W], list[W]]:
    """`(done, pending)` as `ray.wait` returns them, over mesh futures and Ray ObjectRefs mixed:
    once `num_returns` of `futures` are done, or `timeout` seconds have passed, the first
    `num_returns` done ones in the order given, and the others in the order given."""
    check_timeout(timeout)
    found = _items(futures, "wait")
    if not found:
        return [], []
    refs = [x for x in found if isinstance(x, ObjectRef)]
    if len({id(x) for x in found}) != len(found) or len(set(refs)) != len(refs):
        raise ValueError("am.wait: every future must be given once (every ObjectRef too)")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) \
            or not 1 <= num_returns <= len(found):
        raise ValueError(f"num_returns={num_returns!r}: must be an int from 1 to the number of "
                         f"futures ({len(found)})")
    ready = set(_ray.wait(refs, len(refs), 0)[0]) if refs else set()
    if sum(_done(x, ready) for x in found) < num_returns and timeout != 0:
        _Waiter(found, ready, num_returns).wait(timeout)
        ready = set(_ray.wait(refs, len(refs), 0)[0]) if refs else set()
    done: list[W] = []
    pending: list[W] = []
    for item in futures:
        (done if len(done) < num_returns and _done(item, ready) else pending).append(item)
    return done, pending


def _done(item: Item, ready: Collection[ObjectRef[Any]]) -> bool:
    return item in ready if isinstance(item, ObjectRef) else item.done()


def _read_refs(refs: list[ObjectRef[Any]]) -> dict[ObjectRef[Any], Any] | None:
    """The values of these ObjectRefs (all ready) in one read; None if one of them holds an
    error (each is then read, and raises, in its turn)."""
    if not refs:
        return {}
    try:
        return dict(zip(refs, _ray.get(refs)))
    except RayError:
        return None


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
        if task is None or not task.value_in_ref() or call.fn is not None \
                or call.deadline is not None or call.hedge is not None:
            if not future._future.wait(_left(deadline)):
                return False
            continue
        lone.append((future, task))
    if not lone:
        return True
    if not _ray.connected():
        return True  # each future reads its own outcome, and is refused there

    def failed() -> bool:  # cancelled or timed out meanwhile: its ref may not end for long
        return any(f._future.failed() for f, _ in lone)

    def ended() -> bool:
        return all(f._future.done() for f, _ in lone)

    try:
        read = _ray.get_until([task.ref for _, task in lone], _left(deadline), failed, ended)
    except GetTimeoutError:
        return False
    except RayError:
        return True  # some call failed: each future reads (and raises) its own outcome
    if read is None:
        return True  # each future reads its own outcome (a cancelled one raises at once)
    values, _ = read
    for (future, task), value in zip(lone, values):
        task.router.read_ended(task, timed=False)  # read together: each end is unknown
        future._future.wait()  # ended: here, or by Ray's callback a moment from now
        if future._future.exception() is None and future._future.result()[0] is task:
            future._provide(value)
    return True


class _Waiter:
    """Sleeps until `needed` of some futures and ObjectRefs are done: each one's completion
    counts once, on the thread that completes it (O(1)), and the waiter stops listening to the
    futures when it returns."""

    def __init__(self, items: list[Item], ready: Collection[ObjectRef[Any]],
                 needed: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._done = sum(_done(x, ready) for x in items)
        self._needed = needed
        self._results = [x._future for x in items if isinstance(x, MeshFuture) and not x.done()]
        self._refs = [x for x in items if isinstance(x, ObjectRef) and x not in ready]

    def wait(self, timeout: float | None) -> None:
        for result in self._results:
            _watch(result, self)
        for ref in self._refs:
            _ray.on_ready(ref, self.one_done)
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._done >= self._needed, timeout)
        finally:
            for result in self._results:
                _unwatch(result, self)

    def one_done(self, *_: object) -> None:
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


def _items(futures: Any, verb: str) -> list[Item]:
    if isinstance(futures, (str, bytes)) or not isinstance(futures, Sequence):
        raise TypeError(f"am.{verb} takes a list of am.MeshFuture and ray.ObjectRef, "
                        f"got {futures!r}")
    found = list(futures)
    for future in found:
        if not isinstance(future, (MeshFuture, ObjectRef)):
            raise TypeError(f"am.{verb} takes am.MeshFuture and ray.ObjectRef objects, got "
                            f"{future!r}")
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

