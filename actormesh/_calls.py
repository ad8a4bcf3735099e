"""The call path: from a verb to one Ray actor call and back, keeping the load table exact.

    mesh.methods.f.choose(x)                  _method.MeshMethod: the verbs, written once
      Router.route(call)                      the native scheduler picks an actor
        picked now:   Router._send            handle.f.remote(x); ref._on_ready(call.ended)
        no free slot: the call waits in the scheduler's queue, which holds it
      ... Ray's completion thread:
      Call.ended -> Router._ended             free the slot, learn how the call ended,
                                              settle call.future with the ObjectRef;
                                              the rest goes to the loop thread (_loop):
                                              queued calls the slot went to, a death, a retry
    MeshFuture.get() -> read(call)            ray.get(ref) on the caller's thread, errors
                                              named with the actor's rank and coordinates

`all` and `shard` send one call per actor with `Router.send`; their future settles once every
part has ended, and its first reader reads and combines the parts (`_future`). A call's slot is
freed exactly once, when it ends, whatever the outcome; a call is settled exactly once (a second
outcome, e.g. after a timeout, is dropped). A cancelled call is never sent again, and one that
was sent is cancelled in its actor where Ray can (`Router.cancel_sent`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayError

from . import _loop, _native, _ray
from ._balancer import affinity_hash
from ._errors import MeshError, MeshTimeoutError, NoLiveActorsError, from_ray
from ._failures import Failures
from ._result import Result
from ._shape import Point, format_coords

log = logging.getLogger("actormesh")

_NO_KWARGS: dict[str, Any] = {}  # never written to


class Call:
    """One call to one actor: what to send, where it may go, and the future of its outcome.

    `future` settles with the call's ObjectRef once the call has ended (its value is read by
    whoever asks, see `read`), or with an error if it never ran to its end (cancelled, timed
    out, no actor to take it, the mesh shut down).
    """

    __slots__ = ("router", "method", "fn", "args", "kwargs", "target", "key", "affinity",
                 "retries", "future", "actor", "epoch", "ticket", "ref", "out", "started",
                 "outcome", "_point")

    def __init__(self, router: Router, method: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, point: Point | None = None,
                 target: Routed | None = None, key: Hashable | None = None, retries: int = 0,
                 fn: SendFn | None = None) -> None:
        self.router = router
        self.method = method
        self.fn = fn  # makes the Ray call itself, given the actor's handle (ActorPool.submit)
        self.args = args
        self.kwargs = kwargs
        self.target = target  # the view `choose` routes in (its group); None: sent directly
        self.key = key  # the affinity key as given; `affinity` is what the core routes by
        self.affinity = affinity_hash(key)
        self.retries = retries
        self.future: Result[Any] = Result()
        self.actor = -1  # set with `epoch`, `ref` and `started` when sent
        self.epoch = 0
        self.ticket = 0  # set while the call waits in the scheduler's queue
        self.ref: ray.ObjectRef[Any] | None = None  # what the end of the call is watched on
        self.out: Any = None  # what its value is read from: `ref`, or the refs `fn` returned
        self.started = 0.0
        self.outcome = _ray.OK  # how it ended (`_ray.outcome`), once it has
        self._point = point

    @property
    def point(self) -> Point:
        """The called actor's point in the mesh it was called through (known once sent)."""
        if self._point is None:
            if self.target is None or self.actor < 0:
                raise RuntimeError(f"{self.method}: the call was never sent to an actor")
            self._point = self.target.point_of(self.actor)
        return self._point

    def error(self, error: RayError) -> BaseException:
        """`error`, which the call ended with, as actormesh raises it: naming the actor's rank and
        coordinates in the whole mesh."""
        return from_ray(self.router.points[self.actor], self.method, error)

    def ended(self, error: BaseException | None) -> None:
        """Ray's `_on_ready` callback: the call has ended (`error`: its value will never exist)."""
        self.router._ended(self, error)

    def settle(self, out: Any) -> None:
        self.future.set_result(out)

    def fail(self, error: BaseException) -> None:
        self.future.set_exception(error)


class Routed(Protocol):
    """The view a routed call was made through (`_method.Target`)."""

    @property
    def group(self) -> int: ...
    def point_of(self, actor: int) -> Point: ...


SendFn = Callable[..., Any]
"""`fn(actor_handle, *args)` making a Ray call and returning its ObjectRef (or a list of them)."""


def _first_ref(out: Any, what: str) -> ray.ObjectRef[Any]:
    refs = out if isinstance(out, list) else [out]
    if not refs or not all(isinstance(r, ray.ObjectRef) for r in refs):
        raise TypeError(f"{what} returned {out!r}: it must return the ObjectRef of the Ray call "
                        "it made (or a list of them)")
    first: ray.ObjectRef[Any] = refs[0]
    return first


def read(call: Call) -> Any:
    """The value of a call that has ended: its error (mapped) raised, else its value read."""
    ref = call.future.result()
    try:
        return ray.get(ref)
    except RayError as err:
        raise call.error(err) from None


class Router:
    """Sends the calls of one mesh (shared by all its views) and ends them."""

    def __init__(self, handles: Sequence[Any], points: Sequence[Point],
                 scheduler: _native.Scheduler, *, defer_drain: bool,
                 restart_timeout_s: float) -> None:
        self.handles = list(handles)
        self.points = list(points)
        self.scheduler = scheduler
        self.failures = Failures(
            scheduler, [_name(p) for p in self.points], restart_timeout_s=restart_timeout_s,
            send_drained=self.send_drained, fail=self._fail_decisions,
        )
        # A Python Balancer must not run on Ray's completion thread: with one, a completion
        # leaves the queue to a drain on the loop thread.
        self._drain_inline = not defer_drain
        self._remote: dict[tuple[int, str], Any] = {}
        # Queued calls given a slot, waiting for the loop thread to send them.
        self._outbox: list[_native.Decision] = []
        self._outbox_posted = False
        self._outbox_lock = threading.Lock()
        self.closed = False

    def check_open(self, method: str) -> None:
        if self.closed:
            raise MeshError(f"{method}: the mesh is shut down")

    # -- sending ------------------------------------------------------------------------------
    def send(self, actor: int, call: Call) -> None:
        """Send `call` to `actor` (the caller chose it), counted whatever the slot limit."""
        self.scheduler.acquire(actor)
        self._send(actor, call, fresh=True)

    def route(self, call: Call) -> None:
        """Let the scheduler pick the actor for `call`, now or when a slot frees."""
        if self.closed:
            call.fail(MeshError(f"{call.method}: the mesh is shut down"))
            return
        assert call.target is not None
        try:
            decision = self.scheduler.submit(call.target.group, call.affinity, call,
                                             time.perf_counter())
        except _native.NoLiveActors as err:
            call.fail(NoLiveActorsError(f"{call.method}: {err}"))
            return
        except Exception as err:  # a Python Balancer raised or returned a bad index
            call.fail(err)
            return
        if decision.actor >= 0:
            self._send(decision.actor, call, fresh=True)
        else:
            call.ticket = decision.ticket

    def _send(self, actor: int, call: Call, fresh: bool = False) -> None:
        """Send `call` to `actor`, whose slot it holds. A call that waited (not `fresh`) may have
        been cancelled or timed out meanwhile: then its slot is given back instead."""
        call.ticket = 0
        if not fresh and call.future.done():
            self._give_back(actor)
            return
        call.actor = actor
        call.epoch = self.failures.epochs[actor]
        call.started = time.perf_counter()
        try:
            if call.fn is None:
                remote = self._remote.get((actor, call.method))
                if remote is None:
                    remote = self._remote[(actor, call.method)] = getattr(self.handles[actor],
                                                                          call.method)
                out = ref = remote.remote(*call.args, **call.kwargs)
            else:
                out = call.fn(self.handles[actor], *call.args)
                ref = _first_ref(out, call.method)
            call.ref, call.out = ref, out
            ref._on_ready(call.ended)
        except Exception as err:  # e.g. an argument that cannot be serialised
            self._give_back(actor)
            call.fail(err)
            return
        if call.future.done():  # cancelled while being sent: `cancel` may not have seen `ref`
            self.cancel_sent(call)
        if not call.retries:  # Ray holds what it sent; free the caller's objects with its future
            call.args, call.kwargs = (), _NO_KWARGS

    def _send_decisions(self, decisions: Sequence[_native.Decision]) -> None:
        """Send the queued calls the scheduler has just given a slot (loop thread)."""
        for decision in decisions:
            self._send(decision.actor, decision.payload)

    def _give_back(self, actor: int) -> None:
        # Drains inline only without a Python Balancer: the built-in policies never raise.
        self._hand_on(self.scheduler.release(actor, self._drain_inline), actor)

    def _drain(self, actor: int) -> None:
        self.send_drained(self.scheduler.drain, actor)

    def send_drained(self, take: Callable[[int], list[_native.Decision]], actor: int) -> None:
        """Send the queued calls `take(actor)` gives a slot (loop thread); a Python Balancer
        that raises fails the calls it could not place, and none is lost."""
        try:
            drained = take(actor)
        except _native.PickerError as err:
            drained = self._picker_failed(err)
        self._send_decisions(drained)

    def _hand_on(self, drained: list[_native.Decision], actor: int) -> None:
        """After a slot was freed: the queued calls it went to are sent from the loop thread, as
        is the drain a Python Balancer defers. Calls freed while a send is already on its way
        join it: one wake-up of the loop thread serves them all."""
        if drained:
            with self._outbox_lock:
                self._outbox.extend(drained)
                if self._outbox_posted:
                    return
                self._outbox_posted = True
            _loop.post(self._send_outbox)
        elif not self._drain_inline and self.scheduler.queued():
            _loop.post(self._drain, actor)

    def _send_outbox(self) -> None:
        with self._outbox_lock:
            decisions, self._outbox = self._outbox, []
            self._outbox_posted = False
        if self.closed:  # given a slot just before shutdown: never sent, slot given back
            for decision in decisions:
                self.scheduler.release(decision.actor, False)
            self._fail_decisions(decisions, MeshError(
                "the mesh was shut down before this call was sent"))
            return
        self._send_decisions(decisions)

    def _picker_failed(self, err: _native.PickerError) -> list[_native.Decision]:
        """A Python Balancer raised while queued calls were drained: fail those, lose none."""
        self._fail_decisions(err.failed, err.__cause__ or err)
        return err.dispatched

    # -- completion (Ray's thread: short, never waits, never runs user code) --------------------
    def _ended(self, call: Call, error: BaseException | None) -> None:
        try:
            ended = time.perf_counter()
            outcome = call.outcome = _ray.FAILED if error is not None else _ray.outcome(call.ref)
            lost = outcome == _ray.DIED or outcome == _ray.UNAVAILABLE
            if lost:  # before the slot is freed: no queued call may follow this one there
                self.failures.lost(call.actor, call.epoch)
            if outcome == _ray.CANCELLED:  # we cancelled it: no sample, and not the actor's failure
                drained = self.scheduler.release(call.actor, self._drain_inline)
            else:
                drained = self.scheduler.complete(call.actor, call.started, ended,
                                                  outcome == _ray.OK, self._drain_inline)
            self._hand_on(drained, call.actor)
            if lost:
                if call.retries > 0 and call.target is not None and not call.future.done():
                    call.retries -= 1
                    _loop.post(self._retry, call)
                    return
            if error is not None:
                call.fail(call.error(error) if isinstance(error, RayError) else error)
            else:
                call.settle(call.out)
        except BaseException as err:  # a bug here must not leave the call unsettled
            log.exception("actormesh: ending %s failed", call.method)
            call.fail(err)

    def _retry(self, call: Call) -> None:
        """Route a lost call again (loop thread), unless it was cancelled or timed out since:
        such a call is never sent again."""
        if not call.future.done():
            self.route(call)

    def _fail_decisions(self, decisions: Sequence[_native.Decision], error: BaseException) -> None:
        for decision in decisions:
            call: Call = decision.payload
            call.fail(_copy(error))

    # -- cancellation, timeouts, shutdown ------------------------------------------------------
    def cancel(self, calls: Sequence[Call], error: BaseException) -> None:
        """Settle every call not yet done with `error`: a queued call leaves the queue and is
        never sent, a call already sent is cancelled where it runs (`cancel_sent`). Its slot is
        freed when it ends, as for any call."""
        for call in calls:
            if call.future.done():
                continue
            if call.ticket:
                self.scheduler.cancel(call.ticket)  # False: given a slot meanwhile; _send sees it
            # Settled first, then `ref` read: a send under way either sees the call settled
            # or has set `ref` by now, so one of the two cancels it.
            if call.future.set_exception(_copy(error)) and call.ref is not None:
                self.cancel_sent(call)

    def cancel_sent(self, call: Call) -> None:
        """Ask Ray to stop a call that was sent, where Ray can: an async (or threaded) actor
        cancels it, and one it has not started never runs. A synchronous actor runs its calls
        in order and its call runs to its end, its result dropped: Ray 2.60 cannot skip one
        without stalling the actor (`_ray.cancellable`). Never a kill."""
        if not _ray.cancellable(self.handles[call.actor]):
            return
        try:
            ray.cancel(call.ref)
        except Exception as err:  # noqa: BLE001 - Ray is shutting down, or the call is gone
            log.debug("actormesh: cancelling %s failed: %s", call.method, err)

    def expire_after(self, timeout_s: float, calls: Sequence[Call], label: str) -> _loop.Timer:
        """Cancel the calls not done after `timeout_s` with a `MeshTimeoutError` (on the loop
        thread): those still queued are never sent, those sent are cancelled in the actor."""
        error = MeshTimeoutError(f"{label} did not finish within timeout={timeout_s} s")
        return _loop.call_later(timeout_s, self.cancel, calls, error)

    def close(self, why: str) -> None:
        """Fail every queued call with `why`; later calls fail at once, and calls given a slot
        but not yet sent are never sent."""
        self.closed = True
        self.failures.close()
        self._fail_decisions(self.scheduler.take_queued(), MeshError(why))


def _copy(error: BaseException) -> BaseException:
    """A fresh instance of `error` per call: one exception object raised in several threads
    would share (and grow) one traceback."""
    try:
        fresh = type(error)(*error.args)
    except Exception:  # noqa: BLE001 - an exception type with another constructor
        return error
    fresh.__cause__ = error.__cause__
    return fresh


def _name(point: Point) -> str:
    return f"rank {point.rank} ({format_coords(point.coords)})"
