"""The call path without Ray: fake actor handles whose calls the test ends by hand, in the order
it chooses, on a thread that stands for Ray's completion thread.

What is checked: a queued call is sent when a slot frees (from the library's loop thread, never
from the completion thread), cancels and timeouts in every order against that send, shutdown,
deaths and incarnations, restarts with hooks, callbacks that raise, outlier ejection, and that
every call ends exactly once with every slot given back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import itertools
import logging
import queue
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import ray
from ray.exceptions import ActorDiedError as RayActorDiedError
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayTaskError, TaskCancelledError

import actormesh as am
from actormesh import _calls, _future, _hedge, _loop, _native, _ray, _runner
from actormesh._balancer import make_scheduler
from actormesh._calls import Router
from actormesh._method import CallOptions, MeshMethod, Target
from actormesh._metrics import MeshMetrics
from actormesh._shape import Point, Shape

# -- the harness ----------------------------------------------------------------------------


_sent_order = itertools.count()


class FakeRef:
    """What `handle.f.remote(...)` returns: the test ends it with `finish`."""

    def __init__(self, handle: FakeHandle, method: str, args: tuple[Any, ...]) -> None:
        self.handle, self.method, self.args = handle, method, args
        self.callback: Callable[[BaseException | None], None] | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.kind = _ray.OK
        self.cancelled = False  # `ray.cancel` was called on it
        self.finished = threading.Event()  # its value (or error) exists
        self.order = next(_sent_order)  # when it was sent, among every harness's calls
        handle.harness.on_sent(self)

    def _on_ready(self, callback: Callable[[BaseException | None], None]) -> None:
        self.harness.on_ready(self)
        self.callback = callback

    def _on_completed(self, callback: Callable[[Any], None]) -> None:
        """A task of several calls is ended with its value (the actor's busy time and its calls'
        packed outcomes)."""
        self.harness.on_ready(self)
        self.callback = callback

    @property
    def harness(self) -> Harness:
        return self.handle.harness


class FakeHandle:
    def __init__(self, actor: int, harness: Harness, *, in_order: bool) -> None:
        self.actor = actor
        self.harness = harness
        self.sent: list[FakeRef] = []
        # What Ray's handle says of an async actor (False: a synchronous one).
        self._ray_allow_out_of_order_execution = not in_order
        self.unsendable = object()  # an argument its calls cannot send, as Ray cannot pickle one
        # A mesh actor's class: it has the library's runner of tasks of several calls.
        self._ray_method_signatures = {_runner.BATCH: None}

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Remote:
            @staticmethod
            def _remote(args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                        **options: Any) -> FakeRef:
                return Remote.remote(*args, **(kwargs or {}))

            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> FakeRef:
                items = args[0] if method == _runner.BATCH else [(method, args, kwargs)]
                if any(handle.unsendable in item_args for _, item_args, _ in items):
                    raise TypeError(f"cannot pickle {handle.unsendable!r}")
                ref = FakeRef(handle, method, args)
                handle.sent.append(ref)
                handle.harness.sent_from.append(threading.current_thread().name)
                return ref

        return Remote()


class Harness:
    """A router over fake handles, a `MeshMethod` to call through, and a "Ray" thread."""

    def __init__(self, actors: int, *, balancer: Any = "least_loaded",
                 max_in_flight: int | None = None, restart_timeout_s: float = 60.0,
                 in_order: bool = False, coalesce: int = 1) -> None:
        self.sent_from: list[str] = []
        self.handles = [FakeHandle(a, self, in_order=in_order) for a in range(actors)]
        shape = Shape({"rank": actors})
        scheduler = make_scheduler(actors, balancer, max_in_flight, coalesce)
        self.router = Router(self.handles, [Point(r, shape) for r in range(actors)], scheduler,
                             defer_drain=isinstance(balancer, am.Balancer),
                             restart_timeout_s=restart_timeout_s)
        self.target = Target(shape, tuple(range(actors)), self.router, "Fake", "Fake")
        self.ray_thread = _RayThread()
        # What a test does as a call is sent (`ref` made) and as its end is watched.
        self.on_sent: Callable[[FakeRef], None] = lambda ref: None
        self.on_ready: Callable[[FakeRef], None] = lambda ref: None

    def method(self, name: str = "f", **options: Any) -> MeshMethod[..., Any]:
        return MeshMethod(self.target, name, CallOptions(**options))

    def view(self, *actors: int) -> MeshMethod[..., Any]:
        target = Target(Shape({"rank": len(actors)}), actors, self.router, "Fake", "Fake")
        return MeshMethod(target, "f", CallOptions())

    @property
    def scheduler(self) -> _native.Scheduler:
        return self.router.scheduler

    def pending(self, actor: int) -> list[FakeRef]:
        return [r for r in self.handles[actor].sent if r.callback is not None]

    def measured(self, *actors: int) -> None:
        """Each of `actors`' speed known, as after its start-up and one more call (an actor of
        unknown speed takes its calls one per task)."""
        for actor in actors:
            for started, ended in ((-2.0, -1.9), (-1.0, -0.99999)):
                self.scheduler.acquire(actor)
                self.scheduler.complete(actor, started, ended, 0)

    def finish(self, ref: FakeRef, value: Any = None, *, kind: int = _ray.OK,
               error: BaseException | None = None, lost: BaseException | None = None) -> None:
        """End the call behind `ref` on the "Ray" thread: a value, an error of `kind`, or
        (`lost`) a value that will never exist; then let the loop thread catch up."""
        self.end(ref, value, kind=kind, error=error, lost=lost)
        settle()

    def end(self, ref: FakeRef, value: Any = None, *, kind: int = _ray.OK,
            error: BaseException | None = None, lost: BaseException | None = None) -> None:
        """`finish` without waiting for the loop thread (a test may be holding it)."""
        ref.value, ref.kind, ref.error = value, kind, error if lost is None else lost
        ref.finished.set()
        callback, ref.callback = ref.callback, None
        assert callback is not None, "a call ended twice"
        if ref.method != _runner.BATCH:
            self.ray_thread.run(lambda: callback(lost))
            return
        ended = lost or error or (0.0, [v if isinstance(v, _runner.Raised) else _runner._dumps(v)
                                        for v in value])
        self.ray_thread.run(lambda: callback(ended))

    def finish_all(self, actor: int, value: Any = None) -> None:
        for ref in self.pending(actor):
            self.finish(ref, value)


class _RayThread:
    """One thread that runs completions, as Ray's core worker does."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="fake-ray", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            work()
            del work  # hold nothing of a finished call, as Ray does not

    def run(self, work: Callable[[], None]) -> None:
        done = threading.Event()

        def step() -> None:
            try:
                work()
            finally:
                done.set()

        self._work.put(step)
        assert done.wait(10), "the completion thread is stuck"


def settle() -> None:
    """Let the loop thread run what was posted to it, and what that posted in turn."""
    for _ in range(5):
        _loop.submit(asyncio.sleep(0)).result(10)


def _fake_cancel(ref: FakeRef, **_: Any) -> None:
    ref.cancelled = True


def _fake_get(ref: Any, timeout: float | None = None) -> Any:
    if isinstance(ref, list):
        return [_fake_get(r, timeout) for r in ref]
    if not ref.finished.wait(10 if timeout is None else timeout):
        raise GetTimeoutError(f"{ref.method} not finished within {timeout} s")
    if ref.error is not None:
        raise ref.error
    return ref.value


@pytest.fixture(autouse=True)
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Reads go to the fake refs; the outcome of a call is the one the test gave it."""
    fake = types.SimpleNamespace(get=_fake_get, cancel=_fake_cancel)
    for module in (_calls, _future):
        monkeypatch.setattr(module, "ray", fake)
    monkeypatch.setattr(_ray, "outcome", lambda ref: ref.kind)
    monkeypatch.setattr(_ray, "get", _fake_get)
    monkeypatch.setattr(_ray, "connected", lambda: True)  # no Ray here, and none to start
    yield


def raised(message: str) -> RayTaskError:
    return RayTaskError("f", "Traceback: ...", ValueError(message))


def assert_idle(h: Harness) -> None:
    settle()
    assert h.scheduler.in_flight() == [0] * len(h.handles)
    assert h.scheduler.queued() == 0


# -- sending and queueing -------------------------------------------------------------------
def test_a_call_is_sent_at_once_when_a_slot_is_free_and_its_value_read_on_get() -> None:
    h = Harness(2)
    future = h.method().choose(7)
    [ref] = h.pending(0)
    assert ref.args == (7,)
    h.finish(ref, 14)
    assert future.get(timeout=5) == 14
    assert_idle(h)


def test_a_queued_call_is_sent_from_the_loop_thread_when_a_slot_frees() -> None:
    h = Harness(1, max_in_flight=1)
    first = h.method().choose(1)
    second = h.method().choose(2)
    assert len(h.handles[0].sent) == 1 and h.scheduler.queued() == 1
    h.finish(h.pending(0)[0], "one")
    [ref] = h.pending(0)
    assert ref.args == (2,)
    assert h.sent_from == ["MainThread", "actormesh-loop"]
    h.finish(ref, "two")
    assert (first.get(timeout=5), second.get(timeout=5)) == ("one", "two")
    assert_idle(h)


def test_a_cancelled_queued_call_is_never_sent() -> None:
    h = Harness(1, max_in_flight=1)
    running = h.method().choose(1)
    queued = h.method().choose(2)
    queued.cancel()
    with pytest.raises(cf.CancelledError):
        queued.get(timeout=5)
    h.finish_all(0, "done")
    assert running.get(timeout=5) == "done"
    assert [r.args for r in h.handles[0].sent] == [(1,)]
    assert_idle(h)


def test_a_call_cancelled_after_its_slot_was_given_but_before_it_was_sent_gives_it_back() -> None:
    h = Harness(1, max_in_flight=1)
    h.router.metrics = metrics = MeshMetrics("counted")
    h.method().choose(1)
    queued = h.method().choose(2)
    # The slot goes to the queued call on the "Ray" thread; the send waits for the loop thread,
    # which the test holds while it cancels.
    held = threading.Event()
    release = threading.Event()
    _loop.post(lambda: (held.set(), release.wait(10)))
    assert held.wait(10)
    ref = h.pending(0)[0]
    callback, ref.callback = ref.callback, None
    assert callback is not None
    h.ray_thread.run(lambda: callback(None))
    queued.cancel()
    release.set()
    settle()
    assert [r.args for r in h.handles[0].sent] == [(1,)]
    assert_idle(h)
    calls = metrics.stats()["calls"]["f"]
    assert (calls["ok"], calls["cancelled"]) == (1, 1)  # each call counted once
    metrics.close()


def test_close_fails_the_queued_calls_and_refuses_new_ones() -> None:
    h = Harness(1, max_in_flight=1)
    running = h.method().choose(1)
    queued = h.method().choose(2)
    h.router.close("the mesh is gone")
    with pytest.raises(am.MeshError, match="the mesh is gone"):
        queued.get(timeout=5)
    with pytest.raises(am.MeshError, match="shut down"):
        h.method().choose(3)
    h.finish_all(0, "late")
    assert running.get(timeout=5) == "late"


def test_a_call_whose_value_is_lost_fails_and_frees_its_slot() -> None:
    h = Harness(1)
    future = h.method().choose(1)
    h.finish(h.pending(0)[0], lost=RayActorDiedError())
    with pytest.raises(am.ActorDiedError, match="rank 0"):
        future.get(timeout=5)
    assert_idle(h)


# -- timeouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, -1.0, True, "1"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_refused(bad: Any) -> None:
    h = Harness(1)
    with pytest.raises(ValueError, match="timeout="):
        h.method().options(timeout=bad)


def test_a_timeout_cancels_a_call_in_flight_in_its_actor_and_its_late_end_frees_the_slot(
) -> None:
    h = Harness(1)
    future = h.method(timeout=0.05).choose(1)
    with pytest.raises(am.MeshTimeoutError, match="timeout=0.05"):
        future.get(timeout=5)
    assert h.scheduler.in_flight() == [1]
    assert h.pending(0)[0].cancelled
    h.finish_all(0, "late")
    with pytest.raises(am.MeshTimeoutError):
        future.get(timeout=5)
    assert_idle(h)


def test_a_timeout_keeps_nothing_alive_once_its_call_has_ended() -> None:
    h = Harness(1)
    future = h.method(timeout=600).choose(1)

    class Value:
        pass

    value = Value()
    h.finish(h.pending(0)[0], value)
    assert future.get(timeout=5) is value
    alive = weakref.ref(value)
    del future, value
    h.handles[0].sent.clear()  # the harness's own record of the call
    settle()
    gc.collect()
    assert alive() is None


# -- callbacks --------------------------------------------------------------------------------
def test_a_done_callback_that_raises_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(1)
    future = h.method().choose(1)
    ran: list[str] = []
    all_ran = threading.Event()

    def bad(_: am.MeshFuture[Any]) -> None:
        ran.append("bad")
        raise KeyError("callback bug")

    def good(f: am.MeshFuture[Any]) -> None:
        ran.append(f"good {f.get(timeout=5)} on {threading.current_thread().name}")
        all_ran.set()

    future.add_done_callback(bad)
    future.add_done_callback(good)
    with caplog.at_level(logging.ERROR, logger="actormesh"):
        h.finish(h.pending(0)[0], 2)
        assert all_ran.wait(10)
    assert ran == ["bad", "good 2 on actormesh-user"]
    assert "callback bug" in caplog.text

    async def awaited() -> Any:
        return await future

    assert asyncio.run(awaited()) == 2


def test_callbacks_never_run_on_the_completion_thread() -> None:
    h = Harness(1)
    future = h.method().choose(1)
    seen: list[str] = []
    done = threading.Event()
    future.add_done_callback(lambda _: (seen.append(threading.current_thread().name), done.set()))
    h.finish(h.pending(0)[0], 1)
    assert done.wait(10)
    assert seen == ["actormesh-user"]


def test_a_call_failed_before_it_was_sent_is_counted_an_error_or_cancelled_by_shutdown() -> None:
    h = Harness(1, max_in_flight=1)
    h.router.metrics = metrics = MeshMetrics("counted")
    running = h.method().choose(1)
    queued = h.method().choose(2)
    h.router.close("the mesh is shut down")
    with pytest.raises(am.MeshError, match="shut down"):
        queued.get(timeout=5)
    h.finish_all(0, "done")
    assert running.get(timeout=5) == "done"
    dead = Harness(1)
    dead.router.metrics = metrics
    dead.scheduler.mark_dead(0)
    with pytest.raises(am.NoLiveActorsError):
        dead.method().choose(3).get(timeout=5)
    calls = metrics.stats()["calls"]["f"]
    assert (calls["ok"], calls["cancelled"], calls["error"]) == (1, 1, 1)
    metrics.close()


# -- as_completed and all ---------------------------------------------------------------------
def test_as_completed_on_a_call_that_failed_before_it_was_sent_raises_its_error() -> None:
    h = Harness(1)
    h.scheduler.mark_dead(0)
    future = h.method().choose(1)
    with pytest.raises(am.NoLiveActorsError):
        list(future.as_completed(timeout=5))


def test_all_fails_at_the_first_error_and_later_ends_free_their_slots() -> None:
    h = Harness(3)
    future = h.method().all(1)
    h.finish(h.pending(1)[0], kind=_ray.RAISED, error=raised("rank one"))
    with pytest.raises(am.ActorError, match="rank 1 .* rank one"):
        future.get(timeout=5)
    h.finish_all(0, 0)
    h.finish_all(2, 2)
    assert_idle(h)


def test_all_combines_in_rank_order() -> None:
    h = Harness(3)
    future = h.method().all(1)
    for actor in (2, 0, 1):
        h.finish_all(actor, actor * 10)
    assert list(future.get(timeout=5)) == [0, 10, 20]


# -- deaths, incarnations, restarts ---------------------------------------------------------
def test_a_death_stops_routing_before_its_slot_is_freed() -> None:
    h = Harness(2, balancer="pull", max_in_flight=1)
    doomed = h.method().choose(1)
    other = h.method().choose(2)
    queued = h.method().choose(3)
    victim = doomed_actor = next(a for a in (0, 1) if h.pending(a)[0].args == (1,))
    h.finish(h.pending(doomed_actor)[0], kind=_ray.DIED, error=RayActorDiedError())
    with pytest.raises(am.ActorDiedError):
        doomed.get(timeout=5)
    assert h.pending(victim) == []  # the queued call did not follow it there
    h.finish_all(1 - victim, "survivor")
    assert other.get(timeout=5) == "survivor"
    h.finish_all(1 - victim, "queued")
    assert queued.get(timeout=5) == "queued"


def test_a_late_failure_from_an_earlier_incarnation_is_ignored() -> None:
    h = Harness(1)
    old = h.method().choose(1)
    failures = h.router.failures
    _loop.post(failures.on_state, 0, _ray.RESTARTING, 1, "")
    _loop.post(failures.on_state, 0, _ray.ALIVE, 1, "")
    settle()
    assert h.scheduler.status() == ["alive"]
    h.finish(h.pending(0)[0], kind=_ray.DIED, error=RayActorDiedError())
    with pytest.raises(am.ActorDiedError):
        old.get(timeout=5)
    assert h.scheduler.status() == ["alive"]
    fresh = h.method().choose(2)
    h.finish_all(0, "fresh")
    assert fresh.get(timeout=5) == "fresh"


def test_calls_lost_by_an_earlier_incarnation_never_eject_the_restarted_actor() -> None:
    """Ray fails the calls sent to an actor before it restarted as unavailable, some of them
    after the restart is known: five or more of those must not take it out again."""
    h = Harness(1)
    old = [h.method().choose(x) for x in range(6)]
    failures = h.router.failures
    _loop.post(failures.on_state, 0, _ray.RESTARTING, 1, "")
    _loop.post(failures.on_state, 0, _ray.ALIVE, 1, "")
    settle()
    for ref in h.pending(0):
        h.finish(ref, kind=_ray.UNAVAILABLE, error=RayActorDiedError())
    for call in old:
        with pytest.raises(am.ActorDiedError):
            call.get(timeout=5)
    assert h.scheduler.ejected() == [False]
    assert h.scheduler.status() == ["alive"]


def test_calls_only_a_restarting_actor_can_serve_wait_for_it() -> None:
    h = Harness(2)
    only_one = h.view(1)
    _loop.post(h.router.failures.on_state, 1, _ray.RESTARTING, 1, "")
    settle()
    waiting = only_one.choose(5)
    assert h.pending(1) == [] and not waiting.done()
    _loop.post(h.router.failures.on_state, 1, _ray.ALIVE, 1, "")
    settle()
    h.finish_all(1, "back")
    assert waiting.get(timeout=5) == "back"


def test_a_restart_that_takes_too_long_fails_the_waiting_calls_clearly() -> None:
    h = Harness(1, restart_timeout_s=0.05)
    _loop.post(h.router.failures.on_state, 0, _ray.RESTARTING, 1, "")
    settle()
    waiting = h.method().choose(5)
    with pytest.raises(am.NoLiveActorsError, match="restart_timeout_s=0.05"):
        waiting.get(timeout=10)


def test_a_dead_notice_fails_the_calls_waiting_for_the_actor() -> None:
    h = Harness(1)
    _loop.post(h.router.failures.on_state, 0, _ray.RESTARTING, 1, "")
    settle()
    waiting = h.method().choose(5)
    _loop.post(h.router.failures.on_state, 0, _ray.DEAD, 1, "killed by ray.kill")
    with pytest.raises(am.NoLiveActorsError, match="killed by ray.kill"):
        waiting.get(timeout=10)


def test_a_restart_hook_runs_on_the_user_thread_before_routing_and_may_wait_on_the_mesh() -> None:
    h = Harness(1)
    events: list[str] = []

    def hook(actor: int) -> None:
        events.append(f"hook on {threading.current_thread().name}")
        call = h.view(actor).all(0)  # a direct call reaches the actor while choose does not
        threading.Thread(target=lambda: (settle(), h.finish_all(actor, "warm"))).start()
        events.append(f"hook saw {list(call.get(timeout=10))}")

    h.router.failures.on_restart = hook
    _loop.post(h.router.failures.on_state, 0, _ray.RESTARTING, 1, "")
    settle()
    waiting = h.method().choose(1)
    _loop.post(h.router.failures.on_state, 0, _ray.ALIVE, 1, "")
    for _ in range(200):  # the hook runs, then the waiting call is sent
        settle()
        if [r.args for r in h.pending(0)] == [(1,)]:
            break
    h.finish_all(0, "routed")
    assert waiting.get(timeout=10) == "routed"
    assert events == ["hook on actormesh-user", "hook saw ['warm']"]


def test_a_restart_hook_that_raises_is_logged_and_the_actor_is_used_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(1)

    def hook(actor: int) -> None:
        raise OSError("could not rejoin")

    h.router.failures.on_restart = hook
    with caplog.at_level(logging.ERROR, logger="actormesh"):
        _loop.post(h.router.failures.on_state, 0, _ray.RESTARTING, 1, "")
        _loop.post(h.router.failures.on_state, 0, _ray.ALIVE, 1, "")
        for _ in range(100):
            settle()
            if h.scheduler.status() == ["alive"] and "could not rejoin" in caplog.text:
                break
    assert h.scheduler.status() == ["alive"]
    assert "on_restart of rank 0" in caplog.text


def test_retries_resend_a_call_whose_actor_died_once_and_only_once() -> None:
    h = Harness(2, balancer="least_loaded")
    future = h.method(retries=1).choose(4)
    first = next(a for a in (0, 1) if h.pending(a))
    h.finish(h.pending(first)[0], kind=_ray.DIED, error=RayActorDiedError())
    [resent] = h.pending(1 - first)
    assert resent.args == (4,)
    h.finish(resent, "answered")
    assert future.get(timeout=5) == "answered"
    assert sum(len(handle.sent) for handle in h.handles) == 2


# -- the balancer sees failures ---------------------------------------------------------------
def test_an_actor_that_fails_fast_is_ejected_and_draws_little_traffic() -> None:
    h = Harness(3, balancer="least_loaded")
    sent_to = [0, 0, 0]
    futures = []
    for i in range(60):
        futures.append(h.method().choose(i))
        for actor in range(3):
            for ref in h.pending(actor):
                sent_to[actor] += 1
                if actor == 0:  # answers at once, always with an error
                    h.finish(ref, kind=_ray.RAISED, error=raised("bad actor"))
        if i % 2:  # the others answer every other round
            for actor in (1, 2):
                h.finish_all(actor, actor)
    h.finish_all(1, 1)
    h.finish_all(2, 2)
    assert sent_to[0] <= 6, sent_to  # ejected after 5 failures in a row
    assert h.scheduler.ejected()[0]


def test_a_python_balancer_never_runs_on_the_completion_thread() -> None:
    threads: list[str] = []

    class First(am.Balancer):
        def pick(self, loads: Sequence[am.ActorLoad], affinity: object) -> int:
            threads.append(threading.current_thread().name)
            return 0

    h = Harness(1, balancer=First(), max_in_flight=1)
    h.method().choose(1)
    queued = h.method().choose(2)
    h.finish_all(0, "one")
    h.finish_all(0, "two")
    assert queued.get(timeout=5) == "two"
    assert "fake-ray" not in threads and "actormesh-loop" in threads


# -- every call ends once ---------------------------------------------------------------------
def test_a_failure_inside_the_completion_path_still_settles_the_call(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(1)
    future = h.method().choose(1)

    def broken(ref: Any) -> int:
        raise RuntimeError("bug while reading the outcome")

    monkeypatch.setattr(_ray, "outcome", broken)
    with caplog.at_level(logging.ERROR, logger="actormesh"):
        h.finish(h.pending(0)[0], 1)
    with pytest.raises(RuntimeError, match="bug while reading"):
        future.get(timeout=5)
    assert "ending f failed" in caplog.text


def test_many_calls_with_cancels_and_timeouts_in_every_order_end_once_and_free_every_slot() -> None:
    import random

    rng = random.Random(3)
    h = Harness(3, balancer="pull", max_in_flight=1)
    futures = []
    for i in range(300):
        timeout = rng.choice([None, None, 0.001])
        method = h.method(timeout=timeout) if timeout else h.method()
        futures.append(method.choose(i))
        if rng.random() < 0.2:
            rng.choice(futures).cancel()
        if rng.random() < 0.6:
            busy = [a for a in range(3) if h.pending(a)]
            if busy:
                actor = rng.choice(busy)
                h.finish(h.pending(actor)[0], ("ok", actor))
    while any(h.pending(a) for a in range(3)):
        for actor in range(3):
            h.finish_all(actor, ("ok", actor))
    for future in futures:
        try:
            future.get(timeout=5)
        except (cf.CancelledError, am.MeshTimeoutError):
            pass
    sends = [r.args[0] for handle in h.handles for r in handle.sent]
    assert len(sends) == len(set(sends))  # no call sent twice
    assert_idle(h)


# -- the Balancer contract, and views that cost nothing once gone ---------------------------
class Recorder(am.Balancer):
    def __init__(self) -> None:
        self.seen: list[tuple[list[int], object]] = []

    def pick(self, loads: Sequence[am.ActorLoad], affinity: object) -> int:
        self.seen.append(([load.rank for load in loads], affinity))
        return 0


class RoutesByKey(Recorder):
    routes_by_key = True


def test_a_balancer_sees_ranks_in_the_view_called_and_keys_exactly_as_given() -> None:
    recorder = RoutesByKey()
    h = Harness(4, balancer=recorder)
    view = MeshMethod(Target(Shape({"rank": 2}), (2, 3), h.router, "Fake", "Fake"), "f",
                      CallOptions())
    view.options(affinity=-1).choose(1)
    view.options(affinity=-2).choose(2)  # hash(-1) == hash(-2): the key still arrives as given
    assert hash(-1) == hash(-2)
    assert recorder.seen == [([0, 1], -1), ([0, 1], -2)]
    h.finish_all(2, "a")
    h.finish_all(3, "b")


def test_a_balancer_that_routes_by_key_sees_every_keyed_call() -> None:
    sticky, by_key = Recorder(), RoutesByKey()
    for balancer in (sticky, by_key):
        h = Harness(2, balancer=balancer)
        for i in range(3):
            h.method(affinity="session").choose(i)
    assert len(sticky.seen) == 1  # then the native stickiness keeps the key on its actor
    assert by_key.seen == [([0, 1], "session")] * 3


def test_views_that_are_gone_leave_no_group_behind() -> None:
    h = Harness(8)
    views = [Target(Shape({"rank": 2}), (i % 8, (i * 3 + 1) % 8), h.router, "Fake", "Fake")
             for i in range(1000)]
    for target in views:
        if target.actors[0] != target.actors[1]:
            MeshMethod(target, "f", CallOptions()).choose(0)
    for actor in range(8):
        h.finish_all(actor, 0)
    assert h.scheduler.num_groups() > 1
    del views, target
    gc.collect()
    settle()
    assert h.scheduler.num_groups() == 1  # only the whole mesh: decisions cost what they did


# -- cancellation reaches the actor -----------------------------------------------------------
def test_cancelling_a_sent_call_cancels_it_in_its_actor_and_frees_its_slot_when_it_ends() -> None:
    h = Harness(1)
    future = h.method().choose(1)
    [ref] = h.pending(0)
    future.cancel()
    assert ref.cancelled
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert h.scheduler.in_flight() == [1]  # until Ray says it ended
    h.finish(ref, kind=_ray.CANCELLED, error=TaskCancelledError())
    assert_idle(h)


def test_a_cancel_ray_drops_goes_again_while_the_task_runs_and_never_after_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray 2.60 may drop the cancel of a streamed task sent a moment before (the actor then
    runs it): a task not ended after its cancel is cancelled again, with a back-off and a
    bound, and not once it has ended."""
    monkeypatch.setattr(_calls, "_CANCEL_AGAIN_S", (0.01, 0.02, 0.04))
    cancels: list[FakeRef] = []
    monkeypatch.setattr(_calls, "ray", types.SimpleNamespace(
        get=_fake_get, cancel=lambda ref, **_: cancels.append(ref)))
    h = Harness(1)
    dropped = h.method().choose(1)
    [ref] = h.pending(0)
    dropped.cancel()
    loop_passed(0.2)
    assert cancels == [ref] * 4  # the cancel, then three more: Ray dropped every one
    h.finish(ref, kind=_ray.CANCELLED, error=TaskCancelledError())
    assert_idle(h)

    cancels.clear()
    monkeypatch.setattr(_calls, "_CANCEL_AGAIN_S", (0.3,))  # the test ends it first
    ended = h.method().choose(2)
    [ref] = h.pending(0)
    ended.cancel()
    h.finish(ref, kind=_ray.CANCELLED, error=TaskCancelledError())
    loop_passed(0.5)
    assert cancels == [ref]  # it ended: never cancelled again
    assert_idle(h)


def test_a_call_sent_to_a_synchronous_actor_is_not_cancelled_there_but_its_result_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(1, in_order=True)  # Ray 2.60 stalls such an actor when one of its calls is cancelled
    future = h.method().choose(1)
    future.cancel()
    [ref] = h.pending(0)
    assert not ref.cancelled
    reads: list[Any] = []
    monkeypatch.setattr(_ray, "get", lambda ref, timeout=None: reads.append(ref) or _fake_get(ref))
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert reads == []  # raised at once: no read waits for the call's end
    h.finish(ref, "dropped")
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert_idle(h)


def reading_started(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a read of a call's value (a Ray `get`) has begun."""
    started = threading.Event()

    def get(ref: Any, timeout: float | None = None) -> Any:
        started.set()
        return _fake_get(ref, timeout)

    monkeypatch.setattr(_ray, "get", get)
    return started


def outcome_of(read: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException | Any]]:
    """`read()` on a thread of its own; what it returned or raised, once it has."""
    out: list[BaseException | Any] = []

    def run() -> None:
        try:
            out.append(read())
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            out.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_reader_waiting_for_a_call_gets_its_cancel_while_a_synchronous_actor_runs_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(1, in_order=True)
    future = h.method().choose(1)
    [ref] = h.pending(0)
    started = reading_started(monkeypatch)
    reader, out = outcome_of(future.get)  # no timeout: only the cancel can end its wait
    assert started.wait(10)
    future.cancel()
    reader.join(timeout=5)  # a read the cancel does not wake waits 10 s (the fake Ray's get)
    assert not reader.is_alive() and isinstance(out[0], cf.CancelledError)
    assert not ref.finished.is_set()  # the actor runs the call on; its end is dropped
    h.finish(ref, "dropped")
    assert_idle(h)


def test_am_get_reads_calls_that_ended_to_the_end_not_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ray get that times out drops what it was pulling from another node, so values longer to
    pull than a slice would never arrive: once every call ended, am.get reads them with one get
    without a time limit."""
    h = Harness(2)
    futures = [h.method().choose(1), h.method().choose(2)]
    refs = h.pending(0) + h.pending(1)
    sliced = threading.Event()

    def get(r: Any, timeout: float | None = None) -> Any:
        if timeout is not None:  # a pull that no slice lets finish
            sliced.set()
            threading.Event().wait(timeout)
            raise GetTimeoutError("the pull was dropped")
        return _fake_get(r)

    monkeypatch.setattr(_ray, "get", get)
    reader, out = outcome_of(lambda: am.get(futures))
    assert sliced.wait(10)
    for ref, value in zip(refs, ["one", "two"]):
        h.end(ref, value)
    reader.join(timeout=10)
    assert out == [["one", "two"]]


def test_am_get_waiting_for_calls_raises_a_cancel_without_waiting_for_the_cancelled_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(2, in_order=True)
    first, second = h.method().choose(1), h.method().choose(2)
    refs = h.pending(0) + h.pending(1)
    started = reading_started(monkeypatch)
    reader, out = outcome_of(lambda: am.get([first, second]))
    assert started.wait(10)
    second.cancel()
    h.finish(refs[0], "one")
    reader.join(timeout=5)
    assert not reader.is_alive() and isinstance(out[0], cf.CancelledError)
    assert first.get(timeout=5) == "one"
    h.finish(refs[1], "dropped")
    assert_idle(h)


def test_calls_cancelled_in_their_actor_do_not_count_as_its_failures() -> None:
    h = Harness(1)
    for i in range(8):
        future = h.method().choose(i)
        future.cancel()
        h.finish(h.pending(0)[0], kind=_ray.CANCELLED, error=TaskCancelledError())
    assert h.scheduler.ejected() == [False]  # 5 failures in a row would eject it
    assert_idle(h)


def test_a_call_cancelled_while_its_retry_waits_is_never_sent_again() -> None:
    """Issue 25, finding 7: the retry of a lost call skipped the check that it was cancelled."""
    h = Harness(2)
    future = h.method(retries=1).choose(4)
    first = next(a for a in (0, 1) if h.pending(a))
    held, release = threading.Event(), threading.Event()
    _loop.post(lambda: (held.set(), release.wait(10)))  # the retry waits behind this
    assert held.wait(10)
    h.end(h.pending(first)[0], kind=_ray.DIED, error=RayActorDiedError())
    future.cancel()
    release.set()
    settle()
    assert sum(len(handle.sent) for handle in h.handles) == 1
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert_idle(h)


def test_a_call_cancelled_while_it_is_being_sent_is_cancelled_in_its_actor() -> None:
    h = Harness(2)
    future = h.method(retries=1).choose(4)
    first = next(a for a in (0, 1) if h.pending(a))
    h.on_sent = lambda ref: future.cancel()  # the resend races with a cancel
    h.finish(h.pending(first)[0], kind=_ray.DIED, error=RayActorDiedError())
    [resent] = h.pending(1 - first)
    assert resent.cancelled
    h.finish(resent, kind=_ray.CANCELLED, error=TaskCancelledError())
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert_idle(h)


def test_a_call_whose_end_cannot_be_watched_fails_and_gives_its_slot_back() -> None:
    h = Harness(1)

    def refuse(ref: FakeRef) -> None:
        raise RuntimeError("cannot watch this ref")

    h.on_ready = refuse
    future = h.method().choose(1)
    with pytest.raises(RuntimeError, match="cannot watch"):
        future.get(timeout=5)
    assert_idle(h)


def test_calls_given_a_slot_just_before_shutdown_are_never_sent() -> None:
    h = Harness(1, max_in_flight=1)
    running = h.method().choose(1)
    queued = h.method().choose(2)
    held, release = threading.Event(), threading.Event()
    _loop.post(lambda: (held.set(), release.wait(10)))  # the send of the queued call waits
    assert held.wait(10)
    h.end(h.pending(0)[0], "one")  # frees the slot: the queued call is handed over to send
    h.router.close("the mesh is gone")
    release.set()
    settle()
    assert [r.args for r in h.handles[0].sent] == [(1,)]
    assert running.get(timeout=5) == "one"
    with pytest.raises(am.MeshError, match="shut down"):
        queued.get(timeout=5)
    assert h.scheduler.in_flight() == [0]


def test_an_await_that_times_out_cancels_the_call_and_leaves_nothing_behind() -> None:
    """Issue 33: as for an asyncio future, cancelling the task that awaits a call (here
    `asyncio.wait_for` timing out) cancels the call; issue 25, finding 10: nothing of the
    waiter stays on the call."""
    h = Harness(1)
    future = h.method().choose(1)

    async def impatient() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(future, 0.0001)

    asyncio.run(impatient())
    assert not future._calls[0].future._callbacks
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    settle()
    assert h.pending(0)[0].cancelled, "the call was cancelled where it runs"


def test_a_shielded_await_that_times_out_leaves_the_call_running() -> None:
    h = Harness(1)
    future = h.method().choose(1)

    async def patient() -> str:
        for _ in range(200):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), 0.0001)
        h.finish_all(0, "late")
        value: str = await future
        return value

    assert asyncio.run(patient()) == "late"
    assert not future._calls[0].future._callbacks


# -- values are read and combined by their readers, never on the loop thread --------------------
class Held(am.Dispatch):
    """Each actor gets the argument; `collect` runs `during` first (which may wait)."""

    def __init__(self, during: Callable[[], object]) -> None:
        self.during = during
        self.collected: list[str] = []

    def split(self, shape: am.Shape, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> dict[int, tuple[tuple[Any, ...], dict[str, Any]]]:
        return {p: (args, kwargs) for p in range(shape.size)}

    def collect(self, results: Any) -> Any:
        self.collected.append(threading.current_thread().name)
        self.during()
        return sorted(results.values())


def test_a_slow_collect_delays_no_timeout_of_another_mesh() -> None:
    """Issue 25, finding 2: the collect ran on the loop thread, which times every call."""
    slow_mesh, other = Harness(2), Harness(1)
    release = threading.Event()
    dispatch = Held(lambda: release.wait(10))
    slow = slow_mesh.method(dispatch=dispatch).shard(1)
    slow_mesh.finish_all(0, "a")
    slow_mesh.finish_all(1, "b")
    reader = cf.ThreadPoolExecutor(1).submit(slow.get, 20)
    try:
        with pytest.raises(am.MeshTimeoutError):
            other.method(timeout=0.05).choose(1).get(timeout=5)
    finally:
        release.set()
    assert reader.result(10) == ["a", "b"]
    assert dispatch.collected and "actormesh-loop" not in dispatch.collected
    other.finish_all(0, "late")


def test_a_collect_may_call_the_mesh_and_wait() -> None:
    """A collect that waits for a call whose send needs the loop thread (it waited for a slot)
    deadlocked until its own timeout when collects ran on that thread."""
    h = Harness(1, max_in_flight=1)
    occupying = h.method().choose(0)  # holds the one slot

    def call_the_mesh() -> None:
        inner = h.method().choose(3)  # waits for the slot `occupying` holds
        h.finish(next(r for r in h.pending(0) if r.args == (0,)), "freed")  # the send: loop
        h.finish(next(r for r in h.pending(0) if r.args == (3,)), "inner")
        assert inner.get(timeout=5) == "inner"

    future = h.method(dispatch=Held(call_the_mesh)).shard(1)
    h.finish(next(r for r in h.pending(0) if r.args == (1,)), "a")
    assert future.get(timeout=20) == ["a"]
    assert occupying.get(timeout=5) == "freed"
    assert_idle(h)


def test_all_is_read_and_combined_once_for_every_reader() -> None:
    h = Harness(2)
    dispatch = Held(lambda: None)
    future = h.method(dispatch=dispatch).shard(1)
    h.finish_all(0, "a")
    h.finish_all(1, "b")
    readers = cf.ThreadPoolExecutor(4)
    results = list(readers.map(lambda _: future.get(timeout=5), range(8)))

    async def awaited() -> Any:
        return await future

    assert results == [["a", "b"]] * 8 and asyncio.run(awaited()) == ["a", "b"]
    assert len(dispatch.collected) == 1 and "actormesh-loop" not in dispatch.collected


def test_awaiting_all_combines_off_the_event_loop_thread() -> None:
    h = Harness(2)
    dispatch = Held(lambda: None)
    future = h.method(dispatch=dispatch).shard(1)
    h.finish_all(0, "a")
    h.finish_all(1, "b")

    async def awaited() -> tuple[Any, str]:
        return await future, threading.current_thread().name

    value, loop_thread = asyncio.run(awaited())
    assert value == ["a", "b"] and dispatch.collected[0] not in (loop_thread, "actormesh-loop")


# -- liveness: the interleavings of issue 25 through the real scheduler -------------------------
def restart(h: Harness, actor: int, epoch: int) -> None:
    """Ray's notices of a restart: the actor goes, then incarnation `epoch` answers."""
    _loop.post(h.router.failures.on_state, actor, _ray.RESTARTING, epoch, "")
    _loop.post(h.router.failures.on_state, actor, _ray.ALIVE, epoch, "")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the loop thread catch up until `condition` holds (what other threads do lands
    there)."""
    deadline = time.monotonic() + timeout
    while True:
        settle()
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.001)


def test_an_actor_that_dies_for_good_during_its_hook_stays_out_of_rotation() -> None:
    """Issue 25, finding 3: the end of the hook re-admitted a dead actor."""
    h = Harness(2)
    release, started = threading.Event(), threading.Event()
    ran: list[int] = []

    def hook(actor: int) -> None:
        if actor == 1:
            started.set()
            assert release.wait(10)
        ran.append(actor)

    h.router.failures.on_restart = hook
    restart(h, 1, 1)
    assert started.wait(10)
    _loop.post(h.router.failures.on_state, 1, _ray.DEAD, 1, "killed")
    wait_for(lambda: h.scheduler.status() == ["alive", "dead"])
    release.set()
    restart(h, 0, 1)  # hooks of one mesh run in order: this one runs after actor 1's ended
    wait_for(lambda: ran == [1, 0] and h.scheduler.status()[0] == "alive")
    assert h.scheduler.status() == ["alive", "dead"]
    with pytest.raises(am.NoLiveActorsError):
        h.view(1).choose(1).get(timeout=5)


def test_the_restart_timer_stops_when_the_actor_is_back_not_when_its_hook_returns() -> None:
    """Issue 25, finding 4: a hook longer than restart_timeout_s failed the waiting calls."""
    h = Harness(1, restart_timeout_s=0.05)
    release, started = threading.Event(), threading.Event()
    h.router.failures.on_restart = lambda actor: (started.set(), release.wait(10))
    _loop.post(h.router.failures.on_state, 0, _ray.RESTARTING, 1, "")
    settle()
    waiting = h.method().choose(5)
    _loop.post(h.router.failures.on_state, 0, _ray.ALIVE, 1, "")
    assert started.wait(10)
    began = time.monotonic()
    wait_for(lambda: time.monotonic() - began > 0.25)  # five restart timeouts into the hook
    assert not waiting.done()
    release.set()
    wait_for(lambda: bool(h.pending(0)))
    h.finish_all(0, "served")
    assert waiting.get(timeout=5) == "served"


def test_a_transient_loss_is_settled_by_a_state_read_retried_until_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25, finding 8: one failed state read after a transient loss left the actor out."""
    h = Harness(1)
    h.router.failures._actor_ids = [b"actor-0"]
    reads: list[bytes] = []

    async def state(actor_id: bytes) -> tuple[int, int, str]:
        reads.append(actor_id)
        if len(reads) == 1:
            raise ConnectionError("the GCS is busy")
        return _ray.ALIVE, 0, ""

    monkeypatch.setattr(_ray, "actor_state", state)
    lost = h.method().choose(1)
    h.finish(h.pending(0)[0], kind=_ray.UNAVAILABLE, error=ActorUnavailableError("unreachable", None))
    with pytest.raises(am.ActorDiedError):
        lost.get(timeout=5)
    wait_for(lambda: len(reads) == 2 and h.scheduler.status() == ["alive"])
    again = h.method().choose(2)
    [ref] = h.pending(0)
    h.finish(ref, "fine")
    assert again.get(timeout=5) == "fine"


class _HeldMark:
    """The scheduler, except that a mark made on the completion thread waits for the test."""

    def __init__(self, scheduler: _native.Scheduler) -> None:
        self._scheduler = scheduler
        self.reached, self.go = threading.Event(), threading.Event()

    def mark_dead(self, actor: int, restarting: bool = False) -> Any:
        if threading.current_thread().name == "fake-ray":
            self.reached.set()
            assert self.go.wait(10)
        return self._scheduler.mark_dead(actor, restarting)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)


def test_a_loss_marked_after_a_new_incarnation_was_admitted_does_not_strand_it() -> None:
    """Issue 25, finding 9: the completion thread checked incarnation 0 alive, the loop admitted
    incarnation 1, then the mark landed on it: it stayed "restarting" and took no call again."""
    h = Harness(1)
    doomed = h.method().choose(1)
    held = _HeldMark(h.scheduler)
    h.router.failures._scheduler = held  # type: ignore[assignment]
    ref = h.pending(0)[0]
    ender = threading.Thread(target=h.finish, args=(ref,),
                             kwargs={"kind": _ray.DIED, "error": RayActorDiedError()})
    ender.start()
    assert held.reached.wait(10)
    restart(h, 0, 1)
    wait_for(lambda: h.scheduler.status() == ["alive"])
    held.go.set()
    ender.join(10)
    with pytest.raises(am.ActorDiedError):
        doomed.get(timeout=5)
    wait_for(lambda: h.scheduler.status() == ["alive"])
    fresh = h.method().choose(2)
    [sent] = h.pending(0)
    assert sent.args == (2,)
    h.finish(sent, "served")
    assert fresh.get(timeout=5) == "served"


def test_one_mesh_s_slow_hook_holds_up_neither_another_mesh_s_restart_nor_its_callbacks() -> None:
    """Issue 25, finding 5: one user thread ran every mesh's hooks and callbacks in turn."""
    slow, quick = Harness(1), Harness(1)
    release, slow_started, quick_hooked = threading.Event(), threading.Event(), threading.Event()
    slow.router.failures.on_restart = lambda actor: (slow_started.set(), release.wait(20))
    quick.router.failures.on_restart = lambda actor: quick_hooked.set()
    try:
        restart(slow, 0, 1)
        assert slow_started.wait(10)
        restart(quick, 0, 1)
        assert quick_hooked.wait(5)
        wait_for(lambda: quick.scheduler.status() == ["alive"])
        called = threading.Event()
        future = quick.method().choose(1)
        future.add_done_callback(lambda _: called.set())
        quick.finish_all(0, 1)
        assert called.wait(5)
    finally:
        release.set()


def test_a_hook_that_overruns_its_limit_is_logged_and_its_actor_used_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(2)
    failures = h.router.failures
    failures.on_restart_timeout_s = 0.05
    release = threading.Event()
    ran: list[int] = []

    def hook(actor: int) -> None:
        ran.append(actor)
        if actor == 0:
            assert release.wait(10)

    failures.on_restart = hook
    try:
        with caplog.at_level(logging.ERROR, logger="actormesh"):
            restart(h, 0, 1)
            wait_for(lambda: h.scheduler.status()[0] == "alive")
            restart(h, 1, 1)  # the next hook runs although the first still waits
            wait_for(lambda: ran == [0, 1] and h.scheduler.status() == ["alive", "alive"])
        assert "did not return within on_restart_timeout_s=0.05" in caplog.text
    finally:
        release.set()


# -- batches: calls that waited for one actor ride one Ray task --------------------------------
# One task per actor, so that calls wait behind it; a budget of service time large enough that
# how long the test takes to end a call never splits a batch.
ONE_TASK = am.Policy("adaptive", max_tasks=1, batch_budget_s=60.0)

def packed_error(message: str) -> _runner.Raised:
    """What the runner packs for a call of a task that raised."""
    return _runner.Raised(_runner._dumps(raised(message)))


def queue_behind_one(h: Harness, *args: Any, method: str = "f") -> list[am.MeshFuture[Any]]:
    """Occupy the one task slot of actor 0 (of known speed), then queue a call per argument
    behind it."""
    h.measured(0)
    h.method().choose("first")
    return [h.method(method).choose(a) for a in args]


def test_calls_that_waited_ride_one_task_sent_from_the_loop_thread() -> None:
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    futures = queue_behind_one(h, 1, 2, 3)
    h.finish(h.pending(0)[0], "first")
    [batch] = h.pending(0)
    assert batch.method == _runner.BATCH
    assert batch.args == ([("f", (1,), {}), ("f", (2,), {}), ("f", (3,), {})],)
    assert h.sent_from == ["MainThread", "actormesh-loop"]
    assert h.scheduler.in_flight() == [3] and h.scheduler.tasks() == [1]
    h.finish(batch, [10, 20, 30])
    assert [f.get(timeout=5) for f in futures] == [10, 20, 30]
    assert_idle(h)


def test_a_call_that_raised_in_a_batch_fails_alone() -> None:
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    futures = queue_behind_one(h, 1, 2, 3)
    h.finish(h.pending(0)[0], "first")
    h.finish(h.pending(0)[0], [10, packed_error("only two"), 30])
    assert futures[0].get(timeout=5) == 10 and futures[2].get(timeout=5) == 30
    with pytest.raises(am.ActorError, match="rank 0 .* only two"):
        futures[1].get(timeout=5)
    assert_idle(h)


def test_a_task_of_several_calls_brings_their_values_with_its_end_and_none_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    futures = queue_behind_one(h, 1, 2, 3, 4)
    h.finish(h.pending(0)[0], "first")
    reads: list[Any] = []
    monkeypatch.setattr(_ray, "get", lambda ref, timeout=None: reads.append(ref) or _fake_get(ref))
    h.finish(h.pending(0)[0], [1, 2, 3, 4])
    assert [f.get(timeout=5) for f in futures] == [1, 2, 3, 4]
    assert reads == []


def test_a_call_cancelled_after_its_batch_was_formed_gives_its_slot_back() -> None:
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    futures = queue_behind_one(h, 1, 2, 3)
    held, release = threading.Event(), threading.Event()
    _loop.post(lambda: (held.set(), release.wait(10)))  # the batch waits for the loop thread
    assert held.wait(10)
    first = h.pending(0)[0]
    callback, first.callback = first.callback, None
    assert callback is not None
    first.finished.set()
    h.ray_thread.run(lambda: callback(None))
    futures[1].cancel()
    release.set()
    settle()
    [batch] = h.pending(0)
    assert batch.args == ([("f", (1,), {}), ("f", (3,), {})],)
    assert h.scheduler.in_flight() == [2]
    h.finish(batch, ["one", "three"])
    assert (futures[0].get(timeout=5), futures[2].get(timeout=5)) == ("one", "three")
    assert_idle(h)


def test_a_batch_whose_actor_died_reroutes_the_calls_with_retries_and_fails_the_others() -> None:
    h = Harness(2, balancer=ONE_TASK, coalesce=8)
    h.measured(0)
    view = h.view(0)
    view.choose("first")
    h.method().choose("other")
    kept = h.method(retries=1).choose(1)
    lost = h.method().choose(2)
    h.finish(h.pending(0)[0], "first")  # actor 0 takes both queued calls as one batch
    [batch] = h.pending(0)
    h.finish(batch, kind=_ray.DIED, error=RayActorDiedError())
    with pytest.raises(am.ActorDiedError, match="rank 0"):
        lost.get(timeout=5)
    h.finish_all(1, "other")
    [resent] = h.pending(1)
    assert resent.args == (1,)
    h.finish(resent, "again")
    assert kept.get(timeout=5) == "again"
    assert_idle(h)


def test_a_method_declared_alone_and_an_object_ref_argument_never_ride() -> None:
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    alone = MeshMethod(h.target, "solo", CallOptions(), alone=True)
    h.method().choose("first")
    alone.choose(1)
    alone.choose(2)
    h.method().choose(ray.ObjectRef.nil())  # Ray resolves it only for a call of its own
    h.method().choose(3)
    h.method().choose(4)
    h.finish(h.pending(0)[0], "first")
    sizes = []
    while h.pending(0):
        ref = h.pending(0)[0]
        sizes.append(len(ref.args[0]) if ref.method == _runner.BATCH else 1)
        h.finish(ref, [None] * sizes[-1] if ref.method == _runner.BATCH else None)
    assert sizes == [1, 1, 1, 2]
    assert_idle(h)


def test_a_value_read_before_its_end_is_reported_ends_the_call_once_on_the_readers_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(1)
    future = h.method().choose(1)
    [ref] = h.pending(0)
    ref.value = "early"
    ref.finished.set()  # the value exists; Ray's callback has not run yet
    assert future.get(timeout=5) == "early"
    assert h.scheduler.in_flight() == [0] and future.done()
    callback, ref.callback = ref.callback, None
    assert callback is not None
    with caplog.at_level(logging.ERROR, logger="actormesh"):
        h.ray_thread.run(lambda: callback(None))  # the late report ends nothing twice
    assert caplog.text == ""
    assert_idle(h)


def test_a_call_cancelled_while_its_value_is_read_raises_its_cancellation() -> None:
    h = Harness(1)
    future = h.method().choose(1)
    future.cancel()
    [ref] = h.pending(0)
    ref.value = "late"
    ref.finished.set()
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    h.finish(ref, "late")
    assert_idle(h)


def test_tasks_that_fail_before_running_send_their_calls_alone_and_after_three_the_method(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task that failed before running a call (its arguments could not be loaded in the
    actor) sends each call again alone, once; a cause that stays would do it to every task:
    after three, the method's calls go alone, and the log says why."""
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    for _ in range(3):
        futures = queue_behind_one(h, 1, 2)
        h.finish(h.pending(0)[0], "first")
        [batch] = h.pending(0)
        assert batch.method == _runner.BATCH
        h.finish(batch, error=raised("cannot be loaded"))
        for value in (1, 2):  # each again alone, one task at a time
            [ref] = h.pending(0)
            assert ref.method == "f" and ref.args == (value,)
            h.finish(ref, value)
        assert [f.get(timeout=5) for f in futures] == [1, 2]
    assert "three tasks of f calls failed before running them" in caplog.text
    futures = queue_behind_one(h, 3, 4)
    h.finish(h.pending(0)[0], "first")
    assert [r.method for r in h.pending(0)] == ["f"]  # alone from now on
    h.finish_all(0, 3)
    h.finish_all(0, 4)
    assert [f.get(timeout=5) for f in futures] == [3, 4]
    assert_idle(h)


def test_an_argument_that_cannot_be_sent_fails_its_call_only_even_in_a_batch() -> None:
    """Each call of a task that cannot be sent goes again alone, within the mesh's limits:
    the one at fault fails with its own error (not one naming the others' arguments), the
    others run."""
    h = Harness(1, balancer=ONE_TASK, coalesce=8)
    h.handles[0].unsendable = bad = threading.Lock()  # what pickle refuses
    futures = queue_behind_one(h, 1, bad, 3)
    h.finish(h.pending(0)[0], "first")
    settle()
    for value in (1, 3):  # one task at a time (max_tasks=1), each call its own Ray call
        [task] = h.pending(0)
        assert task.args == (value,)
        assert h.scheduler.in_flight() == [1] and h.scheduler.tasks() == [1]
        h.finish(task, "sent")
    with pytest.raises(TypeError, match="cannot pickle"):
        futures[1].get(timeout=5)
    assert (futures[0].get(timeout=5), futures[2].get(timeout=5)) == ("sent", "sent")
    assert_idle(h)


# -- hedged calls ---------------------------------------------------------------------------
def sent(h: Harness) -> list[FakeRef]:
    """Every Ray call the harness's handles were sent, in order."""
    return sorted((r for handle in h.handles for r in handle.sent), key=lambda r: r.order)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for what the loop thread's timers do (a hedge delay) to have happened."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def loop_passed(delay_s: float) -> None:
    """Return once the loop thread has run every timer due within `delay_s` from now."""
    passed = threading.Event()
    _loop.call_later(delay_s, passed.set)
    assert passed.wait(10)


def hedged_pair(h: Harness, **options: Any) -> tuple[am.MeshFuture[Any], FakeRef, FakeRef]:
    """A hedged call that did not end: its future, its first copy and its second."""
    future = h.method(hedge=0.01, **options).choose(5)
    eventually(lambda: len(sent(h)) == 2)
    first, copy = sent(h)
    return future, first, copy


def test_a_late_call_is_sent_once_more_to_another_actor_and_the_first_copy_to_end_wins() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    assert copy.handle is not first.handle and copy.args == (5,)
    h.finish(copy, "copy")
    assert future.get(timeout=5) == "copy"
    assert first.cancelled  # the loser, on an actor that runs calls at once
    assert h.scheduler.in_flight()[first.handle.actor] == 1  # each copy holds its own slot
    h.finish(first, kind=_ray.CANCELLED, error=TaskCancelledError())
    assert future.get(timeout=5) == "copy"
    loop_passed(0.05)
    assert len(sent(h)) == 2  # at most one extra copy
    assert_idle(h)


def test_when_the_first_copy_ends_first_the_second_is_cancelled_and_its_result_dropped() -> None:
    h = Harness(2)
    future, first, copy = hedged_pair(h)
    h.finish(first, "first")
    assert copy.cancelled
    h.finish(copy, "late")
    assert future.get(timeout=5) == "first"
    assert_idle(h)


def test_a_copy_that_raises_does_not_win_while_the_other_copy_runs() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    h.finish(copy, kind=_ray.RAISED, error=raised("from the copy"))
    assert not future.done()  # a value from the other copy may still come
    h.finish(first, "value")
    assert future.get(timeout=5) == "value"
    assert_idle(h)


def test_a_hedged_call_is_counted_once_in_the_metrics_by_what_its_caller_got() -> None:
    metrics = MeshMetrics("counted")
    harnesses = [Harness(3) for _ in range(3)]
    for h in harnesses:
        h.router.metrics = metrics
    h = harnesses[0]
    future, first, copy = hedged_pair(h)  # the copy raises, the first copy's value wins
    h.finish(copy, kind=_ray.RAISED, error=raised("from the copy"))
    h.finish(first, "value")
    assert future.get(timeout=5) == "value"
    h = harnesses[1]
    future, first, copy = hedged_pair(h)  # the copy wins; the first copy is cancelled
    h.finish(copy, "copy")
    h.finish(first, kind=_ray.CANCELLED, error=TaskCancelledError())
    h = harnesses[2]
    future, first, copy = hedged_pair(h)  # the call is cancelled: both copies end cancelled
    future.cancel()
    h.finish(first, kind=_ray.CANCELLED, error=TaskCancelledError())
    h.finish(copy, kind=_ray.CANCELLED, error=TaskCancelledError())
    for h in harnesses:
        assert_idle(h)
    calls = metrics.stats()["calls"]["f"]
    assert calls == {"ok": 2, "error": 0, "cancelled": 1, "timeout": 0, "lost": 0}
    metrics.close()


def test_when_both_copies_raise_the_error_names_the_actor_of_the_last_to_end() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    h.finish(first, kind=_ray.RAISED, error=raised("from the first"))
    h.finish(copy, kind=_ray.RAISED, error=raised("from the copy"))
    with pytest.raises(am.ActorError, match=f"rank {copy.handle.actor}"):
        future.get(timeout=5)
    assert_idle(h)


def test_over_actors_that_run_calls_in_order_copies_go_to_idle_actors_and_the_loser_runs_on(
) -> None:
    h = Harness(3, in_order=True)
    h.method().choose(0)  # actor 0 busy
    future = h.method(hedge=0.01).choose(5)
    eventually(lambda: len(sent(h)) == 3)
    _, first, copy = sent(h)
    assert {first.handle.actor, copy.handle.actor} == {1, 2}
    h.finish(copy, "copy")
    assert not first.cancelled  # Ray cannot skip a call a synchronous actor holds
    h.finish(first, "dropped")
    assert future.get(timeout=5) == "copy"
    h.finish_all(0, "busy")
    assert_idle(h)


class First(am.Balancer):
    def pick(self, loads: Sequence[am.ActorLoad], affinity: object) -> int:
        return 0


def test_over_actors_that_run_calls_in_order_a_call_waiting_behind_another_is_not_hedged(
) -> None:
    h = Harness(2, in_order=True, balancer=First())
    ahead = h.method().choose(0)
    future = h.method(hedge=0.01).choose(5)  # behind it, in actor 0
    eventually(lambda: bool(h.router.hedges.due))
    loop_passed(0.05)
    assert len(sent(h)) == 2  # actor 1 is idle, but a copy could win while this one waits
    h.finish(sent(h)[0], "ahead")
    eventually(lambda: len(sent(h)) == 3)  # once it runs and is late, counted from then
    copy = sent(h)[-1]
    assert copy.handle.actor == 1 and copy.args == (5,)
    h.finish(copy, "copy")
    h.finish(sent(h)[1], "dropped")
    assert (ahead.get(timeout=5), future.get(timeout=5)) == ("ahead", "copy")
    assert_idle(h)


def test_a_hedge_never_goes_to_the_first_copy_s_actor() -> None:
    h = Harness(1)
    future = h.method(hedge=0.01).choose(5)
    eventually(lambda: bool(h.router.hedges.due))  # late, and no other actor to take a copy
    loop_passed(0.05)
    assert len(sent(h)) == 1
    h.finish_all(0, "only")
    assert future.get(timeout=5) == "only"
    assert not h.router.hedges.due
    assert_idle(h)


def test_a_late_call_with_no_actor_free_is_hedged_when_a_slot_frees() -> None:
    h = Harness(2, in_order=True)
    h.method().choose(0)  # actor 0
    future = h.method(hedge=0.01).choose(1)  # actor 1
    eventually(lambda: bool(h.router.hedges.due))
    assert len(sent(h)) == 2
    h.finish(h.pending(0)[0], "freed")
    eventually(lambda: len(sent(h)) == 3)
    copy = sent(h)[-1]
    assert copy.handle.actor == 0 and copy.args == (1,)
    h.finish(copy, "copy")
    assert future.get(timeout=5) == "copy"
    h.finish_all(1, "dropped")
    assert_idle(h)


def test_the_budget_caps_hedges() -> None:
    h = Harness(60)
    futures = [h.method(hedge=0.001).choose(i) for i in range(30)]
    loop_passed(0.05)  # every call is late by now
    # A full bucket of BURST tokens, and each of the 30 calls earned BUDGET of one.
    copies = len(sent(h)) - 30
    assert _hedge.BURST <= copies <= _hedge.BURST + 30 * _hedge.BUDGET
    for actor in range(60):
        h.finish_all(actor, actor)
    assert all(isinstance(f.get(timeout=5), int) for f in futures)
    assert_idle(h)


def test_a_copy_lost_to_a_dead_actor_is_just_lost_while_the_other_copy_runs() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    h.finish(copy, kind=_ray.DIED, error=RayActorDiedError())
    assert not future.done()
    h.finish(first, "first")
    assert future.get(timeout=5) == "first"
    assert_idle(h)


def test_when_the_first_copy_s_actor_dies_the_second_copy_gives_the_result() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    h.finish(first, kind=_ray.DIED, error=RayActorDiedError())
    assert not future.done()
    h.finish(copy, "copy")
    assert future.get(timeout=5) == "copy"
    assert_idle(h)


def test_a_hedged_call_whose_copies_are_both_lost_fails_or_is_retried_once_without_a_copy(
) -> None:
    h = Harness(4)
    failed, first, copy = hedged_pair(h)
    h.finish(first, kind=_ray.DIED, error=RayActorDiedError())
    h.finish(copy, kind=_ray.DIED, error=RayActorDiedError())
    with pytest.raises(am.ActorDiedError, match=f"rank {copy.handle.actor}"):
        failed.get(timeout=5)
    h = Harness(4)
    retried, first, copy = hedged_pair(h, retries=1)
    h.finish(first, kind=_ray.DIED, error=RayActorDiedError())
    h.finish(copy, kind=_ray.DIED, error=RayActorDiedError())
    eventually(lambda: len(sent(h)) == 3)
    again = sent(h)[-1]
    loop_passed(0.05)
    assert len(sent(h)) == 3  # the call was hedged once: no copy of the retry
    h.finish(again, "again")
    assert retried.get(timeout=5) == "again"
    assert_idle(h)


def test_cancelling_a_hedged_call_cancels_both_copies() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    future.cancel()
    assert first.cancelled and copy.cancelled
    for ref in (first, copy):
        h.finish(ref, kind=_ray.CANCELLED, error=TaskCancelledError())
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    assert_idle(h)


def test_a_hedged_call_s_ref_is_the_winning_copy_s() -> None:
    h = Harness(3)
    future, first, copy = hedged_pair(h)
    h.finish(copy, "copy")
    assert future.ref is copy
    h.finish(first, kind=_ray.CANCELLED, error=TaskCancelledError())
    assert_idle(h)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_a_hedge_delay_that_is_not_a_finite_positive_number_is_refused(bad: float) -> None:
    h = Harness(1)
    with pytest.raises(ValueError, match="hedge="):
        h.method().options(hedge=bad)


def test_a_hedge_of_the_wrong_type_is_refused() -> None:
    h = Harness(1)
    with pytest.raises(TypeError, match="hedge='fast'"):
        h.method().options(hedge="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("verb", ["all", "shard"])
def test_hedge_is_refused_for_all_and_shard(verb: str) -> None:
    h = Harness(2)
    method = h.method(hedge=True, dispatch=am.dispatch.split())
    with pytest.raises(ValueError, match=f"{verb}: hedge=True is for choose and map"):
        getattr(method, verb)([1, 2])
    assert sent(h) == []


# -- affinity keys are routed by value --------------------------------------------------------
def test_keys_that_are_not_equal_are_two_sessions_even_with_one_hash() -> None:
    recorder = Recorder()
    h = Harness(2, balancer=recorder)
    h.method(affinity=-1).choose(1)
    h.method(affinity=-2).choose(2)
    assert [key for _, key in recorder.seen] == [-1, -2]


def test_equal_keys_are_one_session() -> None:
    recorder = Recorder()
    h = Harness(2, balancer=recorder)
    h.method(affinity=1).choose(1)
    h.method(affinity=1.0).choose(2)
    assert [key for _, key in recorder.seen] == [1]


def test_the_router_forgets_the_least_recently_used_keys_beyond_the_capacity() -> None:
    h = Harness(2, balancer=am.Policy("least_loaded", affinity_capacity=3))
    for key in range(10):
        h.method(affinity=key).choose(key)
    assert len(h.router.sessions) == 3
    for actor in (0, 1):
        h.finish_all(actor, 0)
