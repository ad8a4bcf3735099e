"""The library's own threads: one event loop that sends and times, and lanes for user code.

Ray completes calls on one thread of its core worker, which also delivers every reply and death
notice of the process: whatever runs there must be short and must never wait. So a completion
frees the call's slot and settles its future, and everything else is handed over here:

- `post` / `call_later` run library code on the loop thread (`actormesh-loop`, an asyncio loop):
  sending calls that waited for a slot, timeouts, and following the actors' states. It never
  runs user code and never reads a value (a reader reads on its own thread), so nothing there
  waits on the mesh and a slow `collect` of one mesh never delays another's timeout.
- A `Lane` runs user code that may call the mesh and wait (done-callbacks, `on_restart` hooks)
  on a thread of its own (`actormesh-user`), in the order it was handed over; each mesh has its
  own lanes.

Every thread is a daemon: a hook stuck on a call that never ends cannot keep the process alive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("actormesh")

T = TypeVar("T")

_LANE_IDLE_S = 1.0  # a lane's thread waits this long for more work before it ends

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The library's event loop, started on first use."""
    global _loop
    if _loop is not None:
        return _loop
    with _lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            threading.Thread(
                target=_run_loop, args=(new,), name="actormesh-loop", daemon=True
            ).start()
            _loop = new
    return _loop


def _run_loop(new: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(new)
    new.set_exception_handler(_loop_exception)
    new.run_forever()


def _loop_exception(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.error("actormesh loop: %s", context.get("message"), exc_info=context.get("exception"))


def post(fn: Callable[..., object], *args: Any) -> None:
    """Run `fn(*args)` on the loop thread soon; from any thread, without waiting."""
    loop().call_soon_threadsafe(_guarded, fn, args)


def _guarded(fn: Callable[..., object], args: tuple[Any, ...]) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("actormesh: %s failed", getattr(fn, "__qualname__", fn))


def submit(coro: Coroutine[Any, Any, T]) -> cf.Future[T]:
    """Run a coroutine on the loop thread; its outcome as a concurrent future."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


class Timer:
    """A callback on the loop thread after a delay. `cancel()` may be called from any thread and
    drops the callback and its arguments at once, so a cancelled timer keeps nothing alive."""

    __slots__ = ("_fn", "_args", "_handle")

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self._fn: Callable[..., object] | None = fn
        self._args = args
        self._handle: asyncio.TimerHandle | None = None

    def _arm(self, delay_s: float) -> None:
        if self._fn is not None:
            self._handle = loop().call_later(delay_s, self._fire)

    def _fire(self) -> None:
        fn, args = self._fn, self._args
        self._fn, self._args, self._handle = None, (), None
        if fn is not None:
            _guarded(fn, args)

    def cancel(self) -> None:
        self._fn, self._args = None, ()
        handle = self._handle
        if handle is not None:
            loop().call_soon_threadsafe(handle.cancel)


def call_later(delay_s: float, fn: Callable[..., object], *args: Any) -> Timer:
    """Run `fn(*args)` on the loop thread after `delay_s` seconds, unless cancelled first."""
    timer = Timer(fn, args)
    loop().call_soon_threadsafe(timer._arm, delay_s)
    return timer


class Lane:
    """User code (done-callbacks, `on_restart` hooks) run in the order it was handed over, on a
    thread of its own that may wait on the mesh. Each mesh has its own lanes, so one mesh's slow
    hook never holds up another mesh. The thread starts when work arrives and ends after a
    while without any. A failure is logged through `logging.getLogger("actormesh")` and stops
    nothing else."""

    __slots__ = ("_lock", "_wake", "_jobs", "_worker")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[tuple[str, Callable[..., object], tuple[Any, ...]]] = deque()
        self._worker: object | None = None  # the token of the thread serving the lane

    def run(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)` after what was handed over before it; `what` names it in the log if
        it raises."""
        with self._lock:
            self._jobs.append((what, fn, args))
            if self._worker is not None:
                self._wake.notify()
                return
            token = self._worker = object()
        self._start(token)

    def abandon(self) -> None:
        """The job running now overran its limit: leave it its thread, and run the jobs after it
        on a new one."""
        with self._lock:
            self._worker = None
            if not self._jobs:
                return
            token = self._worker = object()
        self._start(token)

    def _start(self, token: object) -> None:
        threading.Thread(target=self._serve, args=(token,), name="actormesh-user",
                         daemon=True).start()

    def _serve(self, token: object) -> None:
        while True:
            with self._lock:
                if self._worker is token and not self._jobs:
                    self._wake.wait(_LANE_IDLE_S)
                if self._worker is not token:
                    return  # abandoned while a job overran: a new thread serves the lane
                if not self._jobs:
                    self._worker = None
                    return
                what, fn, args = self._jobs.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("actormesh: %s raised", what)
            del fn, args  # hold nothing of a job that ran while waiting for the next
