"""The library's own threads: one event loop for its bookkeeping, one thread for user code.

Ray completes calls on one thread of its core worker, which also delivers every reply and death
notice of the process: whatever runs there must be short and must never wait. So a completion
frees the call's slot and settles its future, and everything else is handed over here:

- `post` / `call_later` run library code on the loop thread (`actormesh-loop`, an asyncio loop):
  sending calls that waited for a slot, combining the results of `all` and `shard`, timeouts,
  and following the actors' states. It never runs user code, so it never waits on the mesh.
- `run_user` runs user code that may call the mesh and wait (done-callbacks, `on_restart`
  hooks) on the user thread (`actormesh-user`), in the order it was handed over. A failure is
  logged through `logging.getLogger("actormesh")` and stops nothing else.

Both threads are daemons: a hook stuck on a call that never ends cannot keep the process alive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("actormesh")

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_user_queue: queue.SimpleQueue[tuple[str, Callable[..., object], tuple[Any, ...]]] = (
    queue.SimpleQueue()
)
_user_thread: threading.Thread | None = None


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


def run_user(what: str, fn: Callable[..., object], *args: Any) -> None:
    """Run user code `fn(*args)` on the user thread, after what was handed over before it.
    `what` names it in the log if it raises."""
    global _user_thread
    if _user_thread is None:
        with _lock:
            if _user_thread is None:
                _user_thread = threading.Thread(target=_run_user, name="actormesh-user",
                                                daemon=True)
                _user_thread.start()
    _user_queue.put((what, fn, args))


def _run_user() -> None:
    while True:
        what, fn, args = _user_queue.get()
        try:
            fn(*args)
        except Exception:
            log.exception("actormesh: %s raised", what)
