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
        the slot went to waiting calls:       Router._send_batch sends those that wait for the
                                              same actor as ONE Ray task (_batch.Batch), ended
                                              by one callback, Batch.ended -> Router._ended_batch
    MeshFuture.get() -> read(call)            ray.get(ref) on the caller's thread (a batch's
                                              value is read once, each call takes its element),
                                              errors named with the actor's rank and coordinates;
                                              a lone call is read as soon as its value exists
                                              (read_sent), and ended there if Ray's callback
                                              has not ended it yet

`all` and `shard` send one call per actor with `Router.send`; their future settles once every
part has ended, and its first reader reads and combines the parts (`_future`). A call's slot is
freed exactly once, when it ends, whatever the outcome; a call is settled exactly once (a second
outcome, e.g. after a timeout, is dropped). A cancelled call is never sent again, and one that
was sent is cancelled in its actor where Ray can (`Router.cancel_sent`). Calls only ride
together when they waited: one that finds a free slot is sent alone at once. A hedged call may
have a second copy, a `Call` of its own sharing its future (`_hedge` draws that path).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayError

from . import _loop, _native, _ray
from ._balancer import SessionKeys
from ._batch import Batch, Item, SendBatch
from ._errors import MeshError, MeshTimeoutError, NoLiveActorsError, from_ray
from ._failures import Failures
from ._hedge import Hedges
from ._result import Result
from ._shape import Point, format_coords

log = logging.getLogger("actormesh")

_NO_KWARGS: dict[str, Any] = {}  # never written to


class Call:
    """One call to one actor: what to send, where it may go, and the future of its outcome.

    `future` settles with the call's ObjectRef once the call has ended (its value is read by
    whoever asks, see `read`), or with an error if it never ran to its end (cancelled, timed
    out, no actor to take it, the mesh shut down). A hedged call's second copy is a `Call` too
    (`copy` set), with the same future: the first of the two to end settles it.
    """

    __slots__ = ("router", "method", "method_id", "alone", "fn", "args", "kwargs", "target", "key",
                 "affinity", "retries", "hedge", "twin", "copy", "future", "actor", "epoch",
                 "ticket", "ref", "out", "started", "outcome", "finished", "deferred", "batch",
                 "index", "deadline", "_point", "__weakref__")

    def __init__(self, router: Router, method: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, point: Point | None = None,
                 target: Routed | None = None, key: Hashable | None = None, retries: int = 0,
                 fn: SendFn | None = None, method_id: int = 0, alone: bool = False,
                 hedge: float | None = None) -> None:
        self.router = router
        self.method = method
        self.method_id = method_id  # the scheduler's id of `method` (`Router.method_id`)
        # Never rides a batch: an ObjectRef argument Ray must resolve, a call `fn` makes, or a
        # hedged call (cancelling one of its copies must never cancel another call).
        self.alone = alone or fn is not None or hedge is not None
        self.fn = fn  # makes the Ray call itself, given the actor's handle (ActorPool.submit)
        self.args = args
        self.kwargs = kwargs
        self.target = target  # the view `choose` routes in (its group); None: sent directly
        self.key = key  # the affinity key as given; `affinity` is what the core routes by
        self.affinity = None if key is None else router.sessions.id_of(key)
        self.retries = retries
        self.hedge = hedge  # None, or the delay before a second copy (`_hedge.LEARNT`)
        self.twin: Call | None = None  # the other copy of a hedged call, once there is one
        self.copy = False  # this is the second copy
        self.future: Result[Any] = Result()
        self.actor = -1  # set with `epoch`, `ref` and `started` when sent
        self.epoch = 0
        self.ticket = 0  # set while the call waits in the scheduler's queue
        self.ref: ray.ObjectRef[Any] | None = None  # what the end of the call is watched on
        self.out: Any = None  # what its value is read from: `ref`, or the refs `fn` returned
        self.started = 0.0
        self.outcome = _ray.OK  # how it ended (`_ray.outcome`), once it has
        self.finished = False  # its latest send has been seen to end (see `_finishes`)
        # Lost while its hedge copy ran: the copy's end settles the call (see `Router._end`).
        self.deferred = False
        self.batch: Batch | None = None  # the batch it rode, if it did; `index` its place there
        self.index = 0
        self.deadline: float | None = None  # `time.monotonic()` when its own timeout fails it
        self._point = point

    @property
    def point(self) -> Point:
        """The called actor's point in the mesh it was called through (known once sent): for a
        hedged call, the actor of the copy that gave the result."""
        if self._point is None:
            sender = self.sender()
            if self.target is None or sender.actor < 0:
                raise RuntimeError(f"{self.method}: the call was never sent to an actor")
            self._point = self.target.point_of(sender.actor)
        return self._point

    def sender(self) -> Call:
        """The copy whose ObjectRef the settled future holds: this call, or its hedge copy."""
        twin = self.twin
        if twin is None or not self.future.done() or self.future.exception() is not None:
            return self
        return twin if twin.out is self.future.result() else self

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
    batch = call.batch
    if batch is None:
        try:
            return _ray.get(ref)
        except RayError as err:
            raise call.sender().error(err) from None
    value, error = batch.element(call.index)
    if error is not None:
        raise call.error(error) from None
    return value


def own_ref(call: Call) -> ray.ObjectRef[Any] | None:
    """The ObjectRef of `call`'s own value: its Ray call's, or for a call that rode a batch
    (whose task holds every call's value), one put for it once it has ended, on first use. A
    call still waiting for a slot is waited for; None if it never ran (it failed first)."""
    if call.ref is None or call.hedge is not None:  # a hedged call: whichever copy wins
        call.future.wait()
    batch = call.batch
    if batch is None:
        return call.sender().ref
    call.future.wait()
    if call.out is batch.ref:
        value, error = batch.element(call.index)
        put = ray.put(error if error is not None else value)
        with _finishing:
            if call.out is batch.ref:
                call.out = put
    own: ray.ObjectRef[Any] = call.out
    return own


NOT_READ: Any = object()


def read_sent(call: Call, timeout: float | None) -> Any:
    """The value of a lone call already sent, read as soon as it exists: `ray.get` of its ref
    wakes the caller as Ray's own reply does, instead of after the completion callback has
    run on Ray's thread and woken it in turn. Whichever of the two sees the end first ends the
    call (frees its slot, settles its future), so the load is exact when this returns.

    NOT_READ when that cannot tell the outcome: not sent alone yet, an error (a lost call may
    be retried: its future tells), `timeout` or the call's own deadline passed, or it was
    cancelled or timed out meanwhile; and for a hedged call, whose second copy may end first.
    The caller then waits for the future.
    """
    ref = call.ref
    if ref is None or call.batch is not None or call.hedge is not None:
        return NOT_READ
    if call.deadline is not None:
        left = max(call.deadline - time.monotonic(), 0.0)
        timeout = left if timeout is None else min(timeout, left)
    late = _ray.arrived(ref)  # then when it ended is not known: no service-time sample
    if not _ray.connected():
        return NOT_READ
    try:
        value = ray.get(ref, timeout=timeout)
    except RayError:  # GetTimeoutError included
        return NOT_READ
    call.router.read_ended(call, ref, timed=not late)
    call.future.wait()  # settled once ended, here or (a moment later) by Ray's callback
    return NOT_READ if call.future.exception() is not None else value


class Router:
    """Sends the calls of one mesh (shared by all its views) and ends them."""

    def __init__(self, handles: Sequence[Any], points: Sequence[Point],
                 scheduler: _native.Scheduler, *, defer_drain: bool,
                 restart_timeout_s: float, send_batch: SendBatch) -> None:
        self.handles = list(handles)
        self.points = list(points)
        self.scheduler = scheduler
        self.coalesces = scheduler.coalesce > 1
        self.sessions = SessionKeys(scheduler.affinity_capacity)
        # Over actors that run calls in order, a copy that lost cannot be taken out of an
        # actor's queue (`cancel_sent`): a call is hedged only once it runs, and its copy goes
        # only to an idle actor (`_hedge`).
        self.in_order = not all(_ray.runs_calls_at_once(h) for h in self.handles)
        self.hedges = Hedges(self, in_order=self.in_order)
        # When each actor last ended a task: a call waiting behind another in an actor that runs
        # calls in order begins then.
        self.last_end = [-math.inf] * len(self.handles)
        # The loop-thread timer that ends the scheduler's holds (`_watch_holds`).
        self._holds = scheduler.may_hold
        self._hold_timer_at = math.inf
        self._hold_lock = threading.Lock()
        self._send_batch_to = send_batch
        self._method_ids: dict[str, int] = {}
        self._method_ids_lock = threading.Lock()
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

    def method_id(self, method: str, alone: bool) -> int:
        """The scheduler's id of `method`, registered on first use (`alone`: its calls never
        ride a batch): calls of one method share a service-time estimate."""
        known = self._method_ids.get(method)
        if known is None:
            with self._method_ids_lock:
                known = self._method_ids.get(method)
                if known is None:
                    known = self._method_ids[method] = self.scheduler.add_method(alone)
        return known

    def default_window(self, method_id: int, actors: int) -> int:
        """How many calls `map` keeps outstanding by default over `actors` actors: every slot
        busy, and as much again waiting for the slots that free, so each freed slot finds a
        full batch. A batch's expected size follows the method's measured service time."""
        scheduler = self.scheduler
        slots, tasks = scheduler.max_in_flight, scheduler.max_tasks
        if not slots and not tasks:
            return 2 * actors  # nothing ever waits: one call running, one queued in the actor
        per_actor = (tasks or 1) * scheduler.batch_size(method_id)
        if slots:
            per_actor = min(per_actor, slots)
        return 2 * actors * per_actor

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
        if not _ray.connected():
            call.fail(MeshError(f"{call.method}: {_ray.NOT_RUNNING}"))
            return
        assert call.target is not None
        try:
            decision = self.scheduler.submit(call.target.group, call.affinity, call,
                                             time.perf_counter(), call.method_id, call.alone)
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
            if self._holds:
                self._watch_holds()

    def _send(self, actor: int, call: Call, fresh: bool = False) -> None:
        """Send `call` to `actor`, whose slot it holds. A call that waited (not `fresh`) may have
        been cancelled or timed out meanwhile: then its slot is given back instead."""
        call.ticket = 0
        if not fresh and call.future.done():
            self._give_back(actor)
            return
        call.actor = actor
        call.epoch = self.failures.epochs[actor]
        call.batch = None
        call.finished = False
        call.started = time.perf_counter()
        try:
            if not _ray.connected():  # else Ray's `.remote()` would start a new cluster
                raise MeshError(f"{call.method}: {_ray.NOT_RUNNING}")
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
            if not call.copy:
                call.fail(err)
                return
            log.warning("actormesh: a hedge copy of %s could not be sent: %s", call.method, err)
            with _finishing:
                call.finished = True
                first = call.twin
                orphaned = first is not None and first.deferred
            if orphaned and first is not None and not self._retried(first):
                first.fail(err)  # the first copy was lost meanwhile and left the call to this one
            return
        if call.future.done():  # cancelled (or, a copy, won) while being sent: `ref` was unseen
            self.cancel_sent(call)
        elif call.hedge is not None and call.twin is None:
            self.hedges.arm(call)
        if not call.retries and (call.hedge is None or call.twin is not None):
            # Ray holds what it sent; free the caller's objects with its future (a hedged call
            # keeps them for its copy)
            call.args, call.kwargs = (), _NO_KWARGS

    def send_copy(self, actor: int, call: Call) -> None:
        """Send a second copy of the hedged `call` to `actor`, whose slot the scheduler counted
        for it (loop thread). It shares the call's future: the first copy to end settles it."""
        copy = Call(self, call.method, call.args, call.kwargs, target=call.target,
                    method_id=call.method_id, alone=True)
        copy.future = call.future
        copy.twin, copy.copy = call, True
        call.twin = copy
        if not call.retries:
            call.args, call.kwargs = (), _NO_KWARGS
        self._send(actor, copy)  # not sent, its slot given back, if the call ended meanwhile

    def _send_batch(self, actor: int, calls: list[Call]) -> None:
        """Send queued calls the scheduler gave `actor` together as one Ray task. Those cancelled
        or timed out while they waited give their slots back; one left goes alone."""
        for call in calls:
            call.ticket = 0
        live = [c for c in calls if not c.future.done()]
        if len(live) < len(calls):
            self._give_back(actor, len(calls) - len(live), task=not live)
        if len(live) <= 1:
            if live:
                self._send(actor, live[0], fresh=True)
            return
        epoch = self.failures.epochs[actor]
        method = live[0].method_id
        if any(c.method_id != method for c in live):
            method = 0
        batch = Batch(self, live, actor, epoch, time.perf_counter(), method)
        items: list[Item] = []
        for index, call in enumerate(live):
            call.actor, call.epoch, call.started = actor, epoch, batch.started
            call.batch, call.index = batch, index
            items.append((call.method, call.args, call.kwargs))
        try:
            if not _ray.connected():  # else Ray's `.remote()` would start a new cluster
                raise MeshError(_ray.NOT_RUNNING)
            ref = batch.ref = self._send_batch_to(self.handles[actor], items)
            for call in live:
                call.ref = call.out = ref
            ref._on_ready(batch.ended)
        except Exception:  # noqa: BLE001 - e.g. an argument that cannot be serialised
            # Whose it is cannot be told: each call goes alone, and only that one fails (each
            # fails, Ray not running).
            self._give_back(actor, len(live))
            for call in live:
                self.send(actor, call)
            return
        for call in live:
            if not call.retries:
                call.args, call.kwargs = (), _NO_KWARGS

    def _send_decisions(self, decisions: Sequence[_native.Decision]) -> None:
        """Send the queued calls the scheduler has just given a slot (loop thread): one Ray task
        per decision, a batch when the decision carries several calls."""
        for decision in decisions:
            calls = decision.payloads
            if len(calls) == 1:
                self._send(decision.actor, decision.payload)
            else:
                self._send_batch(decision.actor, calls)

    def _give_back(self, actor: int, calls: int = 1, task: bool = True) -> None:
        """Free slots no call used: `calls` call slots, and with `task` their task's slot."""
        # Drains inline only without a Python Balancer: the built-in policies never raise.
        self._hand_on(self.scheduler.release(actor, self._drain_inline, calls, task), actor)

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
        if self._holds:  # a drain may begin a hold (an actor back from a restart, say)
            self._watch_holds()

    def _hand_on(self, drained: list[_native.Decision], actor: int) -> None:
        """After a slot was freed: the queued calls it went to are sent from the loop thread, as
        is the drain a Python Balancer defers. Calls freed while a send is already on its way
        join it: one wake-up of the loop thread serves them all. A slot no queued call took may
        take the copy of a late hedged call; a hold may have begun."""
        if self._holds:
            self._watch_holds()
        if drained:
            with self._outbox_lock:
                self._outbox.extend(drained)
                if self._outbox_posted:
                    return
                self._outbox_posted = True
            _loop.post(self._send_outbox)
        elif not self._drain_inline and self.scheduler.queued():
            _loop.post(self._drain, actor)
        elif self.hedges.has_due():
            self.hedges.retry_soon()

    def _watch_holds(self) -> None:
        """Arm the loop-thread timer that ends the scheduler's earliest hold (any thread), unless
        one that fires no later is armed already."""
        deadline = self.scheduler.hold_deadline_s()
        if deadline >= self._hold_timer_at:
            return
        with self._hold_lock:
            if deadline >= self._hold_timer_at:
                return
            self._hold_timer_at = deadline
        _loop.call_later(max(deadline - time.perf_counter(), 0.0), self._expire_holds)

    def _expire_holds(self) -> None:
        """The calls held back from a straggler for as long as it takes to serve one go to it
        (loop thread); `send_drained` then arms the timer for the holds left."""
        with self._hold_lock:
            self._hold_timer_at = math.inf
        if self.closed:
            return
        self.send_drained(lambda _: self.scheduler.expire_holds(time.perf_counter()), -1)

    def _send_outbox(self) -> None:
        with self._outbox_lock:
            decisions, self._outbox = self._outbox, []
            self._outbox_posted = False
        if self.closed:  # given a slot just before shutdown: never sent, slot given back
            for decision in decisions:
                self.scheduler.release(decision.actor, False, len(decision.payloads), True)
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
        if _finishes(call, call.ref):
            self._end(call, error, None)

    def read_ended(self, call: Call, ref: Any, *, timed: bool) -> None:
        """The caller read a value of `call` sent as `ref`: it ended well, and unless Ray's
        callback has seen that already, it ends here, on the caller's thread (`timed`: the
        caller waited for the value, so its end is now, a service-time sample). If the callback
        is ending it, its future settles once its slot is free: wait for that before relying
        on the load."""
        if _finishes(call, ref):
            self._end(call, None, _ray.OK, timed)

    def _end(self, call: Call, error: BaseException | None, outcome: int | None,
             timed: bool = True) -> None:
        try:
            ended = self.last_end[call.actor] = time.perf_counter()
            if outcome is None:
                outcome = _ray.FAILED if error is not None else _ray.outcome(call.ref)
            call.outcome = outcome
            lost = outcome == _ray.DIED or outcome == _ray.UNAVAILABLE
            if lost:  # before the slot is freed: no queued call may follow this one there
                self.failures.lost(call.actor, call.epoch)
            if outcome == _ray.CANCELLED:  # we cancelled it: no sample, and not the actor's failure
                drained = self.scheduler.release(call.actor, self._drain_inline, 1, True)
            else:
                drained = self.scheduler.complete(call.actor, call.started, ended,
                                                  outcome == _ray.OK, self._drain_inline, 1,
                                                  call.method_id, timed)
            self._hand_on(drained, call.actor)
            twin = call.twin
            if twin is not None and lost:
                with _finishing:  # against the other copy's end, or its failure to be sent
                    call.deferred = not twin.finished
                if call.deferred:
                    return  # a copy lost to its actor's death: the other copy still runs
            if lost and self._retried(twin if call.copy and twin is not None else call):
                return
            if error is not None:
                call.fail(call.error(error) if isinstance(error, RayError) else error)
            else:
                call.settle(call.out)
            if twin is not None and not twin.finished:  # the first to end won: stop the other
                _loop.post(self.cancel_sent, twin)
        except BaseException as err:  # a bug here must not leave the call unsettled
            log.exception("actormesh: ending %s failed", call.method)
            call.fail(err)

    def _ended_batch(self, batch: Batch, error: BaseException | None) -> None:
        """As `_ended`, for every call of a batch at once: one outcome read, one native call
        that frees every slot (one sample per call), then each call settled or retried."""
        calls, batch.calls = batch.calls, []  # its calls refer to it: no cycle once it has ended
        try:
            ended = self.last_end[batch.actor] = time.perf_counter()
            outcome = _ray.FAILED if error is not None else _ray.outcome(batch.ref)
            lost = outcome == _ray.DIED or outcome == _ray.UNAVAILABLE
            if lost:  # before the slots are freed: no queued call may follow these there
                self.failures.lost(batch.actor, batch.epoch)
            if outcome == _ray.CANCELLED:  # every call of it was cancelled: no sample
                drained = self.scheduler.release(batch.actor, self._drain_inline, len(calls),
                                                 True)
            else:
                drained = self.scheduler.complete(batch.actor, batch.started, ended,
                                                  outcome == _ray.OK, self._drain_inline,
                                                  len(calls), batch.method)
            self._hand_on(drained, batch.actor)
            for call in calls:
                call.outcome = outcome
                if lost and self._retried(call):
                    continue
                if error is None:
                    call.settle(batch.ref)
                elif isinstance(error, RayError):
                    call.fail(call.error(error))
                else:
                    call.fail(_copy(error))
        except BaseException as err:  # a bug here must not leave a call unsettled
            log.exception("actormesh: ending a batch of %d calls failed", len(calls))
            for call in calls:
                call.fail(_copy(err))

    def _retried(self, call: Call) -> bool:
        """A call whose actor was lost goes to another actor if it has retries left."""
        if call.retries > 0 and call.target is not None and not call.future.done():
            call.retries -= 1
            _loop.post(self._retry, call)
            return True
        return False

    def _retry(self, call: Call) -> None:
        """Route a lost call again (loop thread), unless it was cancelled or timed out since:
        such a call is never sent again."""
        if not call.future.done():
            self.route(call)

    def _fail_decisions(self, decisions: Sequence[_native.Decision], error: BaseException) -> None:
        for decision in decisions:
            for call in decision.payloads:
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
            if call.future.set_exception(_copy(error)):
                for copy in (call, call.twin):
                    if copy is not None and copy.ref is not None:
                        self.cancel_sent(copy)

    def cancel_sent(self, call: Call) -> None:
        """Ask Ray to stop a call that was sent, where Ray can: an async (or threaded) actor
        cancels it, and one it has not started never runs. A synchronous actor runs its calls
        in order and its call runs to its end, its result dropped: Ray 2.60 cannot skip one
        without stalling the actor (`_ray.runs_calls_at_once`). Never a kill. A call that rode
        a batch is dropped when the batch ends; the batch's task is cancelled only once every
        call in it has been."""
        if call.ref is None or call.finished or not _ray.connected() \
                or not _ray.runs_calls_at_once(self.handles[call.actor]):
            return
        batch = call.batch
        if batch is not None and not all(c.future.done() for c in batch.calls):
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


_finishing = threading.Lock()  # held for a few bytecodes, never to wait


def _finishes(call: Call, ref: Any) -> bool:
    """Whether the caller is the first to see `call`'s send as `ref` end: Ray's completion
    callback, or a reader that got its value first. Exactly one of them ends the call."""
    with _finishing:
        if call.finished or call.ref is not ref:
            return False
        call.finished = True
        return True


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
