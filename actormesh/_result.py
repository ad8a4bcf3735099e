"""`Result`: a value or an error that arrives once, from any thread.

The subset of `concurrent.futures.Future` the call path uses (`done`, `result`, `exception`,
`add_done_callback`, `remove_done_callback`, `set_result`, `set_exception`), with the same meaning, in one slotted object
and no lock of its own until somebody waits. A `concurrent.futures.Future` brings a `Condition`
(an RLock and two lists) per call: with thousands of calls in flight those are containers the
garbage collector walks again and again, which cost a `choose` about twice its Python time
(measured with the fake-handle harness of tests/test_call_path.py: submit 13.4 -> 6.9 us).

Setting a result twice is not an error here: the second outcome is dropped (`set_*` returns
False), which is what a call that times out and then ends needs. A callback that raises is
logged and does not stop the callbacks after it.
"""

from __future__ import annotations

import _thread
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("actormesh")

T = TypeVar("T")

_PENDING, _VALUE, _ERROR = 0, 1, 2
_settling = threading.Lock()  # one for every result: held for a few bytecodes, never to wait


class Result(Generic[T]):
    """A value or an error that arrives once, from any thread."""

    __slots__ = ("_state", "_value", "_callbacks", "_gate")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None  # the value or the error; written before `_state`
        self._callbacks: list[Callable[[Result[T]], object]] | None = None
        # Locked while somebody waits; released once settled. Each waiter passes it on, so
        # every waiter wakes.
        self._gate: _thread.LockType | None = None

    def done(self) -> bool:
        return self._state != _PENDING

    def set_result(self, value: T) -> bool:
        """Settle with `value`; False (and nothing changes) if already settled."""
        return self._settle(_VALUE, value)

    def set_exception(self, error: BaseException) -> bool:
        """Settle with `error`; False (and nothing changes) if already settled."""
        return self._settle(_ERROR, error)

    def _settle(self, state: int, value: Any) -> bool:
        with _settling:
            if self._state != _PENDING:
                return False
            self._value = value
            self._state = state
            callbacks, self._callbacks = self._callbacks, None
            gate = self._gate
        if gate is not None:
            gate.release()
        for callback in callbacks or ():
            _run(callback, self)
        return True

    def add_done_callback(self, callback: Callable[[Result[T]], object]) -> None:
        """Call `callback(self)` once settled, on the thread that settles it (at once if it
        is): keep it short and never wait in it."""
        with _settling:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        _run(callback, self)

    def remove_done_callback(self, callback: Callable[[Result[T]], object]) -> bool:
        """Forget a callback not yet run (its waiter gave up), so that nothing of it stays
        behind; False if it was not pending."""
        with _settling:
            if self._callbacks is None:
                return False
            for i, pending in enumerate(self._callbacks):
                if pending is callback:
                    del self._callbacks[i]
                    return True
        return False

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until settled; False if `timeout` seconds passed first."""
        if self._state != _PENDING:
            return True
        with _settling:
            if self._state != _PENDING:
                return True
            if self._gate is None:
                self._gate = _thread.allocate_lock()
                self._gate.acquire()
            gate = self._gate
        if not gate.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        gate.release()  # for the next waiter
        return True

    def result(self, timeout: float | None = None) -> T:
        """The value, or raise the error; `TimeoutError` if not settled within `timeout` s."""
        if not self.wait(timeout):
            raise TimeoutError(f"not settled within {timeout} s")
        if self._state == _ERROR:
            raise self._value
        value: T = self._value
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error, or None if it settled with a value."""
        if not self.wait(timeout):
            raise TimeoutError(f"not settled within {timeout} s")
        return self._value if self._state == _ERROR else None


def _run(callback: Callable[[Any], object], result: Result[Any]) -> None:
    try:
        callback(result)
    except Exception:
        log.exception("actormesh: a callback of a call's result raised")
