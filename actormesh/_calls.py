"""The call path: calls, the Ray tasks that carry them (1..N calls each), and how a task ends.

    mesh.methods.f.choose(x)        _method.MeshMethod.choose: a Call, Router.route(call)
      Router.route                  the native scheduler picks an actor (or queues the call:
                                    a freed slot drains the queue and the loop thread sends
                                    each decision's calls together, `_send_decisions`)
      Router.send_task              ONE send: a Task of 1..N calls, ONE Ray call (`_send`,
                                    by the task's wire: `_send_lone`, `_send_to_runner`)
      ... the task ends ONCE (Task.claim): Ray's callback, or the caller of a lone call that
      read its value first (read_sent)
      Router.end(task, outcomes)    ONE end: the scheduler frees the task's slots, counting each
                                    call's success or failure; each call is settled, retried
                                    (its actor was lost) or re-sent (it never started)
    MeshFuture.get() -> read(call)  the call's value or error, on the caller's thread

How a task travels (`Task.wire`) depends on the actor and the calls, never on what follows:
LONE, one call as the Ray call of its own method (Ray's options, concurrency group, cancel and
retries as for any Ray call); LIST, several calls through a method the mesh's actor class
gains (`_runner.BATCH`) or Ray's `__ray_call__`, each call's outcome packed apart in the actor;
STREAM, the same reported call by call (`_runner.STREAM`), for a task expected to run long, so
that a call that finished reaches its caller even if the actor dies later in the task.
Hedged calls (`_hedge`) reach this module through `Router.send_copy` and `Call.twin` only.
"""

from __future__ import annotations

import _thread
import concurrent.futures as cf
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import ray
from ray import ObjectRef
from ray.exceptions import RayError

from . import _loop, _native, _ray, _runner
from ._balancer import SessionKeys
from ._errors import MeshError, MeshTimeoutError, NoLiveActorsError, from_ray
from ._failures import Failures
from ._hedge import Hedges
from ._holds import Holds
from ._metrics import MeshMetrics
from ._shape import Point, format_coords

log = logging.getLogger("actormesh")

T = TypeVar("T")

_NO_KWARGS: dict[str, Any] = {}  # never written to
# What a generator method's Ray call returns (exported by `ray`, missing from its stubs).
ObjectRefGenerator: Any = getattr(ray, "ObjectRefGenerator")  # noqa: B009

# How a task travels (see the module docstring).
LONE, LIST, STREAM = 0, 1, 2
# A task expected to run longer than this reports each call as it ends (STREAM); one in order
# that runs longer than this anyway starts no more calls (`_runner.Deferred`).
STREAM_ABOVE_S = _runner.UNSTREAMED_S
# `map` keeps at least this many calls per task slot outstanding: enough for a backlog, under
# which tasks carry several calls and the method's time per call can be measured again (a
# window sized from an estimate inflated by lone round trips would keep every call alone).
MIN_WINDOW_BATCH = 8
# An outcome of a call the actor did not start (`_runner.Skipped`): it goes again, alone, and so
# do the method's later calls.
SKIPPED = -1
# An outcome of every call of a task that never ran them (its arguments could not be loaded in
# the actor): each goes again alone, where it gets what it would have got alone.
RESEND = -2
# An outcome of a call a task in order did not reach in time (`_runner.Deferred`): it is routed
# again, as any queued call.
DEFERRED = -3
_NOT_RUN = (SKIPPED, RESEND, DEFERRED)
_LOST = (_ray.DIED, _ray.UNAVAILABLE)


_PENDING, _VALUE, _ERROR = 0, 1, 2
_settling = threading.Lock()  # one for every result: held for a few bytecodes, never to wait
_reading = threading.Lock()  # a generator's values, read once (`Task.lone_value`); no callback


class Result(Generic[T]):
    """A value or an error that arrives once, from any thread: the subset of
    `concurrent.futures.Future` the call path uses, with the same meaning, in one slotted object
    with no lock of its own until somebody waits (a `Future`'s `Condition` per call cost a
    `choose` about twice its Python time: the garbage collector walks its containers). Settling
    twice is no error: the second outcome is dropped (`set_*` returns False), as a call that
    times out and then ends needs. A callback that raises is logged; the others still run."""

    __slots__ = ("_state", "_value", "_callbacks", "_gate")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None  # the value or the error; written before `_state`
        self._callbacks: list[Callable[[Result[T]], object]] | None = None
        # Locked while somebody waits; released once settled. Each waiter passes it on, so
        # every waiter wakes.
        self._gate: _thread.LockType | None = None

    @classmethod
    def of(cls, value: T) -> Result[T]:
        """A result settled with `value` already."""
        result: Result[T] = cls()
        result._value, result._state = value, _VALUE
        return result

    def done(self) -> bool:
        return self._state != _PENDING

    def failed(self) -> bool:
        """Settled with an error (a cancel and a timeout included)."""
        return self._state == _ERROR

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


class Routed(Protocol):
    """The view a routed call was made through (`_method.Target`)."""

    @property
    def group(self) -> int: ...
    def point_of(self, actor: int) -> Point: ...


SendFn = Callable[..., Any]
"""`fn(actor_handle, *args)` making a Ray call and returning its ObjectRef (or a list of them)."""


class Call:
    """One call of a method, for one actor: what to send, where it may go, and the future of
    its outcome, which settles with `(task, index)` (where its value is read) once the call has
    ended, or with an error if it never ran to its end (cancelled, timed out, no actor)."""

    __slots__ = ("router", "method", "method_id", "rides", "fn", "args", "kwargs", "target",
                 "group", "key", "affinity", "retries", "hedge", "future", "ticket", "deadline",
                 "outcome", "task", "index", "twin", "_point", "__weakref__")

    def __init__(self, router: Router, method: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], *, point: Point | None = None,
                 target: Routed | None = None, group: int = -1, key: Hashable | None = None,
                 retries: int = 0,
                 fn: SendFn | None = None, method_id: int = 0, alone: bool = False,
                 hedge: float | None = None) -> None:
        self.router = router
        self.method = method
        self.method_id = method_id  # the scheduler's id of `method` (`Router.method_id`)
        # May share a task with other calls: not a call `fn` makes, not a hedged call
        # (cancelling one copy must cancel nothing else), no ObjectRef argument (Ray resolves
        # those for a task's own arguments only), not a method that must go alone.
        self.rides = not (alone or fn is not None or hedge is not None) \
            and router.may_ride(method)
        self.fn = fn  # makes the Ray call itself, given the actor's handle (ActorPool.submit)
        self.args = args
        self.kwargs = kwargs
        self.target = target  # the view `choose` routes in; None: sent directly
        # The view's group in the scheduler (the caller may know it: one hop less per call).
        self.group = group if group >= 0 or target is None else target.group
        self.key = key  # the affinity key as given; `affinity` is what the core routes by
        self.affinity = None if key is None else router.sessions.id_of(key)
        self.retries = retries
        self.hedge = hedge  # None, or the delay before a second copy (`_hedge.LEARNT`)
        self.future: Result[tuple[Task, int]] = Result()
        self.ticket = 0  # set while the call waits in the scheduler's queue
        self.deadline: float | None = None  # `time.monotonic()` when its own timeout fails it
        self.outcome = _ray.OK  # how its latest send ended (`_ray.outcome`), once it has
        self.task: Task | None = None  # the task of its latest send, and its place there
        self.index = 0
        self.twin: Call | None = None  # a hedged call's other copy (sharing `future`)
        self._point = point

    @property
    def actor(self) -> int:
        """The actor of the latest send (-1 before any)."""
        task = self.task
        return -1 if task is None else task.actor

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
        """The copy whose outcome the settled future holds: this call, or its hedge copy."""
        twin = self.twin
        if twin is None or not self.future.done() or self.future.exception() is not None:
            return self
        return twin if self.future.result()[0] is twin.task else self

    def error(self, error: BaseException) -> BaseException:
        """`error`, which the call ended with, as actormesh raises it: naming the actor's rank and
        coordinates in the whole mesh."""
        return from_ray(self.router.points[self.actor], self.method, error)

    def fail(self, error: BaseException) -> None:
        self.future.set_exception(error)


class Task:
    """One Ray task: calls sent together to one actor. It ends once (`claim`), with each call's
    outcome; its calls' values are read from it by their callers (`value`)."""

    __slots__ = ("router", "calls", "actor", "epoch", "started", "wire", "ref", "out",
                 "results", "busy_s", "error", "cancels", "stopping", "lone", "_waiting",
                 "_claims", "__weakref__")

    def __init__(self, router: Router, calls: list[Call], actor: int, wire: int) -> None:
        self.router = router
        self.calls = calls  # until it has ended
        self.actor = actor
        self.epoch = router.failures.epochs[actor]
        self.started = 0.0
        self.wire = wire
        self.ref: Any = None  # what its end is watched on (a generator's completion: STREAM)
        self.out: Any = None  # LONE: what the Ray call returned (the refs `fn` returned)
        self.results: list[Any] = []  # LIST/STREAM: each call's packed outcome (`_runner`)
        self.busy_s = math.nan  # LIST: the seconds the actor reported running the calls
        self.error: BaseException | None = None  # STREAM: what the task ended with, if it failed
        self.cancels = 0  # its calls cancelled or timed out while it ran (`Router.cancel`)
        self.stopping = False  # Ray was asked to cancel it (`_cancel_task`)
        self.lone: tuple[Any, BaseException | None] | None = None  # `_lone_value`'s, once read
        self._waiting = 0  # STREAM: the reports and the end not yet arrived
        self._claims = [True]  # one to take: whoever ends the task (see `claim`)

    def claim(self) -> bool:
        """Whether the caller is the first to end this task (Ray's callback, or a reader that
        got a lone call's value first): exactly one of them ends it. Atomic: `list.pop`."""
        try:
            return self._claims.pop()
        except IndexError:
            return False

    def ended(self) -> bool:
        return not self._claims

    def lone_value(self) -> tuple[Any, BaseException | None]:
        """The value of a lone Ray call of several returns (a tuple of them) or of a generator
        (the list of the values it yielded), or its error: read once, by the first reader (a
        generator is consumed by reading it)."""
        with _reading:
            if self.lone is None:
                try:
                    self.lone = (_lone_value(self.out), None)
                except RayError as err:
                    self.lone = (None, err)
        return self.lone

    def value_in_ref(self) -> bool:
        """Whether the value of its (one) call is its `ref`'s: a lone Ray call of one return
        (not several returns, nor a generator's)."""
        return self.wire == LONE and self.ref is not None and self.out is self.ref

    # -- Ray's completion thread: short, never waits, never runs user code ----------------------
    def _ready(self, error: BaseException | None) -> None:
        """LONE: the call's object exists (`error`: it never will)."""
        if not self.claim():
            return
        try:
            outcome = _ray.FAILED if error is not None else _ray.outcome(self.ref)
        except BaseException as err:  # a bug here must not leave the call unsettled
            log.exception("actormesh: ending %s failed", self.calls[0].method)
            outcome, error = _ray.FAILED, err
        self.router.end(self, [outcome], error)

    def _listed(self, envelope: Any) -> None:
        """LIST: the task's value, every call's packed outcome (or the error it ended with)."""
        if not self.claim():
            return
        if isinstance(envelope, BaseException):
            self.router.end(self, [_failed(envelope, ran=False)] * len(self.calls), envelope)
        else:
            self.busy_s, self.results = envelope
            self.router.end(self, [_packed_outcome(p) for p in self.results], None)

    def _reported(self, item: Any) -> None:
        """STREAM: one call's `(index, packed outcome)` has arrived (an error: it never will).
        A call that ran while others of the task still run reaches its caller now, not when
        the task ends: a call riding with one that runs for long (or for good: timed out on an
        asyncio actor, where it is cancelled only once every call of its task is done) gets its
        value as it would alone. The last to report is settled with the task's end, which
        follows it at once, so that its caller sees the actor's load without it."""
        if not isinstance(item, BaseException):
            index, packed = item
            self.results[index] = packed
            call = self.calls[index]
            outcome = _packed_outcome(packed)
            if self._waiting > 2 and outcome not in _NOT_RUN and call.twin is None:
                call.outcome = outcome
                if call.future.set_result((self, index)) and self.cancels and not self.stopping:
                    _loop.post(self.router.cancel_sent, self)  # others were cancelled: stop it
        self._arrived()

    def _stream_ended(self, value: Any) -> None:
        """STREAM: the task itself has ended (an error: how it failed)."""
        if isinstance(value, BaseException):
            self.error = value
        self._arrived()

    def _arrived(self) -> None:
        """STREAM: each call's report, and the task's end, counted (Ray's one thread runs them
        all); the last of them ends the task: each call reported ended as reported, the others
        as the task did (an error, or lost with its actor: they never finished)."""
        self._waiting -= 1
        if self._waiting or not self.claim():
            return
        error = self.error
        reported = any(p is not None for p in self.results)
        unfinished = _ray.FAILED if error is None else _failed(error, ran=reported)
        outcomes = [unfinished if p is None else _packed_outcome(p) for p in self.results]
        self.router.end(self, outcomes, error)

    # -- the caller's thread ------------------------------------------------------------------
    def value(self, index: int, method: str) -> Any:
        """Call `index`'s value, its error raised as the call of `method` would raise it alone."""
        call_error: BaseException | None
        if self.value_in_ref():
            try:
                return _ray.get(self.out)
            except RayError as err:
                call_error = err
        elif self.wire == LONE:
            value, call_error = self.lone_value()
            if call_error is None:
                return value
        else:
            packed = self.results[index]
            if isinstance(packed, ObjectRef):  # put for its `.ref`: read from there
                try:
                    return _ray.get(packed)
                except RayError as err:
                    call_error = err
            else:
                value, call_error = _runner.unpack(packed)
                if call_error is None:
                    return value
        raise from_ray(self.router.points[self.actor], method, call_error)  # its cause kept

    def own_ref(self, index: int) -> ray.ObjectRef[Any]:
        """An ObjectRef of call `index`'s own value: the Ray call's, or one put for it (once)."""
        if self.value_in_ref():
            ref: ray.ObjectRef[Any] = self.ref
            return ref
        if self.wire == LONE:  # several returns, or a generator's: their values, put as one
            if not self.results:
                value, error = self.lone_value()
                self.results = [ray.put(error if error is not None else value)]
            values: ray.ObjectRef[Any] = self.results[0]
            return values
        put = self.results[index]
        if not isinstance(put, ObjectRef):
            value, error = _runner.unpack(put)
            put = ray.put(error if error is not None else value)  # an error as Ray stores one
            self.results[index] = put
        return put


def _failed(error: BaseException, *, ran: bool = True) -> int:
    """The outcome of every call of a task that ended with `error` (`ran`: some call of it may
    have run)."""
    from ray import exceptions as rx

    if isinstance(error, rx.ActorUnavailableError):
        return _ray.UNAVAILABLE
    if isinstance(error, (rx.RayActorError, rx.WorkerCrashedError, rx.NodeDiedError)):
        return _ray.DIED
    if isinstance(error, rx.TaskCancelledError) or (
            isinstance(error, rx.RayTaskError) and isinstance(error.cause, rx.TaskCancelledError)):
        return _ray.CANCELLED  # a streamed task Ray cancelled ends with it as the cause
    if isinstance(error, rx.RayTaskError) and not ran:
        # The runner never raises (`_runner`): the task failed before it ran a call, as when
        # an argument of one call cannot be loaded in the actor. Alone, only that call fails.
        return RESEND
    return _ray.FAILED


# Ray 2.60 may drop a cancel of a streamed task sent a moment before (an asyncio actor then
# runs its calls): a task not ended this long after its cancel is cancelled again.
_CANCEL_AGAIN_S = (1.0, 2.0, 4.0, 8.0, 16.0)


def _cancel_task(task_ref: weakref.ref[Task], attempt: int) -> None:
    """`ray.cancel` of a task every call of which is done (any thread), and again after each
    of `_CANCEL_AGAIN_S` while it has not ended (loop thread; the timer keeps no task alive)."""
    task = task_ref()
    if task is None or task.ended() or not _ray.connected():
        return
    task.stopping = True
    try:
        streamed = task.wire == STREAM or isinstance(task.out, ObjectRefGenerator)
        ray.cancel(task.out if streamed else task.ref)
    except Exception as err:  # noqa: BLE001 - Ray is shutting down, or the task is gone
        log.debug("actormesh: cancelling a task of %s failed: %s", _task_name(task.calls), err)
        return
    if attempt < len(_CANCEL_AGAIN_S):
        _loop.call_later(_CANCEL_AGAIN_S[attempt], _cancel_task, task_ref, attempt + 1)


def _reported_value(call: Call, task: Task) -> bool:
    """Whether `call`'s future holds its own outcome in `task` (settled by its report)."""
    return call.future.exception() is None and call.future.result()[0] is task


def _outcome_name(call: Call, outcome: int, settled_before: bool) -> str:
    """How a call's execution ended, as the metrics name it (`_metrics.OUTCOMES`)."""
    if settled_before:
        error = call.future.exception()
        return "ok" if error is None else _cancelled_name(error)
    if outcome == _ray.OK:
        return "ok"
    if outcome in _LOST:
        return "lost"
    return "cancelled" if outcome == _ray.CANCELLED else "error"


_CANCELS = (cf.CancelledError, MeshTimeoutError)  # what a call cancelled or timed out ends with


def _cancelled_name(error: BaseException) -> str:
    return "timeout" if isinstance(error, MeshTimeoutError) else "cancelled"


def _packed_outcome(packed: Any) -> int:
    if isinstance(packed, _runner.Raised):
        return _ray.RAISED
    if isinstance(packed, _runner.Skipped):
        return SKIPPED
    if isinstance(packed, _runner.Deferred):
        return DEFERRED
    return _ray.OK


def read(call: Call) -> Any:
    """The value of a call that has ended: its error (mapped) raised, else its value read."""
    task, index = call.future.result()
    return task.value(index, call.method)


def own_ref(call: Call) -> ray.ObjectRef[Any] | None:
    """The ObjectRef of `call`'s own value: a lone call's Ray call, as soon as it is sent; for
    any other (waiting for a slot, hedged, or riding a task with others) once it has ended
    (waited for). None if it never ran (it failed first)."""
    task = call.task
    if task is not None and task.value_in_ref() and call.hedge is None and call.fn is None:
        ref: ray.ObjectRef[Any] = task.ref
        return ref
    call.future.wait()
    if call.future.exception() is not None:
        return None
    task, index = call.future.result()
    return task.own_ref(index)


NOT_READ: Any = object()


def read_sent(call: Call, timeout: float | None) -> Any:
    """The value of a lone call already sent, read as soon as it exists: `ray.get` of its ref
    wakes the caller as Ray's own reply does, instead of after the completion callback has run
    on Ray's thread and woken it in turn. Whichever of the two sees the end first ends the task
    (`Task.claim`), so the load is exact when this returns.

    NOT_READ when that cannot tell the outcome: not sent alone yet, an error (a lost call may be
    retried: its future tells), `timeout` or the call's own deadline passed, or it was cancelled
    or timed out meanwhile (`_ray.get_until` stops reading then), or ended before; and for a
    hedged call, whose other copy may end first. The caller then waits for the future.
    """
    task = call.task
    if task is None or not task.value_in_ref() or call.fn is not None or call.hedge is not None:
        return NOT_READ
    ref = task.ref
    if call.deadline is not None:
        left = max(call.deadline - time.monotonic(), 0.0)
        timeout = left if timeout is None else min(timeout, left)
    try:  # Ray not running (shut down meanwhile): a MeshError, raised
        read = _ray.get_until(ref, timeout, stop=call.future.failed, ended=call.future.done)
    except RayError:  # GetTimeoutError included
        return NOT_READ
    if read is None:
        return NOT_READ
    value, late = read
    call.router.read_ended(task, timed=not late)  # late: when it ended is not known
    call.future.wait()  # settled once ended, here or (a moment later) by Ray's callback
    return NOT_READ if call.future.exception() is not None else value


class Router:
    """Sends the calls of one mesh (shared by all its views) as tasks, and ends them."""

    def __init__(self, handles: Sequence[Any], points: Sequence[Point],
                 scheduler: _native.Scheduler, *, defer_drain: bool,
                 restart_timeout_s: float) -> None:
        self.handles = list(handles)
        self.points = list(points)
        self.scheduler = scheduler
        self.sessions = SessionKeys(scheduler.affinity_capacity)
        self._actors = [_ActorKind(h) for h in self.handles]
        self.coalesces = scheduler.coalesce > 1 and any(k.batches for k in self._actors)
        # Methods whose calls must go alone: Ray options of their own, or a concurrency group.
        self._alone: set[str] = {m for k in self._actors for m in k.alone_methods}
        self._no_reply: set[str] = {m for k in self._actors for m in k.no_reply}
        self._tasks_not_run: dict[str, int] = {}  # per method (`_task_not_run`)
        # Over actors that run calls in order, a copy that lost cannot be taken out of an
        # actor's queue (`cancel_sent`): a call is hedged only once it runs (`_hedge`).
        self.in_order = not all(_ray.runs_calls_at_once(h) for h in self.handles)
        self.hedges = Hedges(self, in_order=self.in_order)
        # When each actor last ended a task: a call waiting behind another in an actor that runs
        # calls in order begins then.
        self.last_end = [-math.inf] * len(self.handles)
        self.holds = Holds(scheduler, self.send_drained)
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
        # Queued calls given a slot, waiting to be sent by what `post_sends` hands the send to:
        # the loop thread (an `am.ActorPool` hands it to its reader while one waits).
        self.post_sends: Callable[[Callable[[], None]], None] = _loop.post
        self._outbox: list[_native.Decision] = []
        self._outbox_posted = False
        self._outbox_lock = threading.Lock()
        self.metrics: MeshMetrics | None = None  # where each call's end is counted (the mesh's)
        # What no node of the cluster can give one actor ("GPU=1 per actor: ..."), if anything:
        # a call that times out says it (the mesh sets it).
        self.lacking = ""
        self.closed = False

    def check_open(self, method: str) -> None:
        if self.closed:
            raise MeshError(f"{method}: the mesh is shut down")

    def may_ride(self, method: str) -> bool:
        return self.coalesces and method not in self._alone

    def method_id(self, method: str, alone: bool) -> int:
        """The scheduler's id of `method`, registered on first use (`alone`: its calls never
        ride a batch): calls of one method share a service-time estimate."""
        known = self._method_ids.get(method)
        if known is None:
            if method in self._no_reply:
                raise TypeError(
                    f"{method} is a Ray method with num_returns=0: nothing tells when a call of "
                    "it ends, so a mesh cannot hold its slot; call it on the actor handle")
            with self._method_ids_lock:
                known = self._method_ids.get(method)
                if known is None:
                    alone = alone or not self.may_ride(method)
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
        per_actor = (tasks or 1) * max(scheduler.batch_size(method_id), MIN_WINDOW_BATCH)
        if slots:
            per_actor = min(per_actor, slots)
        return 2 * actors * per_actor

    # -- sending: one path, whatever the number of calls ----------------------------------------
    def send(self, actor: int, call: Call) -> None:
        """Send `call` to `actor` (the caller chose it), counted whatever the slot limit."""
        self.scheduler.acquire(actor)
        self.send_task(actor, [call])

    def route(self, call: Call) -> None:
        """Let the scheduler pick the actor for `call`, now or when a slot frees."""
        if self.closed:
            self._fail_unsent(call, MeshError(f"{call.method}: the mesh is shut down"))
            return
        try:
            decision = self.scheduler.submit(call.group, call.affinity, call,
                                             time.perf_counter(), call.method_id, not call.rides)
        except _native.NoLiveActors as err:
            self._fail_unsent(call, NoLiveActorsError(f"{call.method}: {err}"))
            return
        except Exception as err:  # a Python Balancer raised or returned a bad index
            self._fail_unsent(call, err)
            return
        if decision.actor >= 0:
            self.send_task(decision.actor, [call])  # refused there if Ray is not running
            return
        call.ticket = decision.ticket
        if not _ray.connected():  # no slot would ever free for it
            self.cancel([call], MeshError(f"{call.method}: {_ray.NOT_RUNNING}"))
        else:
            self._watch_holds()

    def send_task(self, actor: int, calls: list[Call]) -> None:
        """Send `calls` to `actor` as one Ray task; they hold one task slot and a call slot
        each. Calls cancelled or timed out while they waited give their slots back; a task
        that cannot be sent sends each of its calls again alone (`_unsendable`)."""
        live: list[Call] = []
        for call in calls:
            call.ticket = 0
            if call.future.done():
                self._count_unsent(call)
                continue
            live.append(call)
        if len(live) < len(calls):
            self._give_back(actor, len(calls) - len(live), task=not live)
        if not live:
            return
        task = Task(self, live, actor, self._actors[actor].wire(live, self))
        for index, call in enumerate(live):
            call.task, call.index = task, index
        try:
            if not _ray.connected():  # else Ray's `.remote()` would start a new cluster
                raise MeshError(f"{live[0].method}: {_ray.NOT_RUNNING}")
            self._send(task)
        except Exception as err:  # noqa: BLE001 - e.g. an argument that cannot be serialised
            self._unsendable(task, err)
            return
        if any(call.future.done() for call in live):  # cancelled while being sent: unseen
            self.cancel_sent(task)
        for call in live:
            if call.hedge is not None and call.twin is None:
                self.hedges.arm(call)
            elif not call.retries and task.wire == LONE:
                # Ray holds what it sent; free the caller's objects (a call of a task of several
                # keeps them until it ends: one the actor did not start goes again)
                call.args, call.kwargs = (), _NO_KWARGS

    def _send(self, task: Task) -> None:
        """The task's one Ray call, and the callback that ends it: as its wire says."""
        task.started = time.perf_counter()
        if task.wire == LONE:
            self._send_lone(task)
        else:
            self._send_to_runner(task)

    def _send_lone(self, task: Task) -> None:
        """LONE: the call is the Ray call of its method (or the one its `fn` makes)."""
        call, handle = task.calls[0], self.handles[task.actor]
        if call.fn is None:
            remote = self._remote.get((task.actor, call.method))
            if remote is None:
                remote = self._remote[(task.actor, call.method)] = getattr(handle, call.method)
            task.out = remote.remote(*call.args, **call.kwargs)
            # Several returns, or a generator's (the method's Ray options): ended with the
            # task's first return, or the generator's end.
            task.ref = _first_ref(task.out, call.method) \
                if isinstance(task.out, (list, ObjectRefGenerator)) else task.out
        else:
            task.out = call.fn(handle, *call.args)
            task.ref = _first_ref(task.out, call.method)
        task.ref._on_ready(task._ready)

    def _send_to_runner(self, task: Task) -> None:
        """LIST or STREAM: the calls go to the library's runner in the actor (`_runner`)."""
        actor, calls = task.actor, task.calls
        handle = self.handles[actor]
        items = [(c.method, c.args, c.kwargs) for c in calls]
        name = _task_name(calls)
        if task.wire == STREAM:
            task.out = getattr(handle, _runner.STREAM)._remote(
                args=(items,), name=name, num_returns="streaming", max_task_retries=0)
            task.ref = task.out.completed()
            task.results = [None] * len(calls)
            task._waiting = len(calls) + 1
            for reported in _ray.stream_refs(task.out, len(calls)):
                reported._on_completed(task._reported)
            task.ref._on_completed(task._stream_ended)
            return
        bound = _bound_s(calls, self.scheduler)
        kwargs = None if bound == math.inf else {"bound_s": bound}
        if self._actors[actor].runner:
            task.ref = getattr(handle, _runner.BATCH)._remote(
                args=(items,), kwargs=kwargs, name=name, max_task_retries=0)
        else:
            task.ref = handle.__ray_call__._remote(
                args=(_runner.run_in_actor, items), kwargs=kwargs, name=name,
                max_task_retries=0)
        task.ref._on_completed(task._listed)

    def _unsendable(self, task: Task, error: BaseException) -> None:
        """The task could not be sent: a lone call fails with `error`; each call of a task of
        several goes again alone, where a call whose arguments cannot be serialised fails with
        its own error (not one naming its task's other calls) and the others run."""
        calls = task.calls
        task.claim()
        self._give_back(task.actor, len(calls))
        if len(calls) == 1 or not _ray.connected():
            for call in calls:
                twin = call.twin
                if twin is not None and twin.task is not None and not twin.task.ended():
                    continue  # a hedge's copy: the call it copies still runs, and ends it
                self._fail_unsent(call, error)
            return
        for call in calls:
            call.rides = False
            _loop.post(self._retry, call)

    def send_copy(self, actor: int, call: Call) -> None:
        """Send a second copy of the hedged `call` to `actor`, whose slot the scheduler counted
        for it (loop thread). It shares the call's future (see `end` for which copy wins)."""
        copy = Call(self, call.method, call.args, call.kwargs, target=call.target, group=call.group,
                    method_id=call.method_id, alone=True)
        copy.future = call.future
        copy.twin, call.twin = call, copy
        copy.hedge = call.hedge
        if not call.retries:
            call.args, call.kwargs = (), _NO_KWARGS
        self.send_task(actor, [copy])  # not sent, its slot given back, if the call ended

    def _send_decisions(self, decisions: Sequence[_native.Decision]) -> None:
        """Send the queued calls the scheduler has just given a slot (loop thread): one task per
        decision."""
        for decision in decisions:
            self.send_task(decision.actor, decision.payloads)

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
        self._watch_holds()  # a drain may begin a hold (an actor back from a restart, say)

    def _hand_on(self, drained: list[_native.Decision], actor: int) -> None:
        """After a slot was freed: the queued calls it went to are sent off Ray's thread, by
        what `post_sends` gives the send to (the loop thread), and the drain a Python Balancer
        defers by the loop thread. Calls freed while a send is already on its way join it: one
        wake-up serves them all. A slot no queued call took may take the copy of a late hedged
        call; a hold may have begun."""
        self._watch_holds()
        if drained:
            with self._outbox_lock:
                self._outbox.extend(drained)
                if self._outbox_posted:
                    return
                self._outbox_posted = True
            self.post_sends(self._send_outbox)
        elif not self._drain_inline and self.scheduler.queued():
            _loop.post(self._drain, actor)
        elif self.hedges.due:
            self.hedges.retry_soon()

    def _watch_holds(self) -> None:
        """After anything that may begin a hold: the hold timer is armed for the earliest."""
        holds = self.holds
        if holds.active and self.scheduler.hold_deadline_s() < holds.timer_at:
            holds.watch()

    def _send_outbox(self) -> None:
        with self._outbox_lock:
            decisions, self._outbox = self._outbox, []
            self._outbox_posted = False
        if self.closed:  # given a slot just before shutdown: never sent, slot given back
            for decision in decisions:
                self.scheduler.release(decision.actor, False, len(decision.payloads), True)
            self._fail_decisions(decisions, MeshError(
                "the mesh was shut down before this call was sent"), "cancelled")
            return
        self._send_decisions(decisions)

    def _picker_failed(self, err: _native.PickerError) -> list[_native.Decision]:
        """A Python Balancer raised while queued calls were drained: fail those, lose none."""
        self._fail_decisions(err.failed, err.__cause__ or err)
        return err.dispatched

    # -- the end: one path, whatever the number of calls (Ray's thread, or a reader's) ----------
    def read_ended(self, task: Task, *, timed: bool) -> None:
        """The caller read the value of the lone call of `task`: it ended well, and unless Ray's
        callback has seen that already, it ends here, on the caller's thread (`timed`: the
        caller waited for the value, so its end is now, a service-time sample)."""
        if task.claim():
            self.end(task, [_ray.OK], None, timed)

    def end(self, task: Task, outcomes: Sequence[int], error: BaseException | None,
            timed: bool = True) -> None:
        """End `task` (once: its claimer): free its slots, counting each call's success or
        failure, then settle, retry or re-send each call. `error` is what the task as a whole
        ended with, if it did not run to its end."""
        calls, task.calls = task.calls, []  # its calls refer to it: no cycle once it has ended
        try:
            actor = task.actor
            ended = self.last_end[actor] = time.perf_counter()
            lost = any(o in _LOST for o in outcomes)
            if lost:  # before the slots are freed: no queued call may follow these there
                self.failures.lost(actor, task.epoch)
            drained = self._free_slots(task, calls, outcomes, ended, timed, lost)
            self._hand_on(drained, actor)
            metrics = self.metrics
            counted: list[tuple[str, str]] = []  # each call's method and outcome, for metrics
            for index, (call, outcome) in enumerate(zip(calls, outcomes)):
                call.outcome = outcome
                # cancelled or timed out while it ran (not settled by its own report)
                settled_before = call.future.done() and not (
                    task.wire == STREAM and _reported_value(call, task))
                twin = call.twin
                self._settle(call, outcome, task, index, error)
                if metrics is not None and outcome not in _NOT_RUN and (
                        twin is None or _ends_hedged_call(call, twin, settled_before)):
                    counted.append((call.method, _outcome_name(call, outcome, settled_before)))
                if call.future.done() and call.hedge is None:
                    call.args, call.kwargs = (), _NO_KWARGS
            if metrics is not None:
                metrics.task_ended(counted, ended - task.started)
        except BaseException as err:  # a bug here must not leave a call unsettled
            log.exception("actormesh: ending a task of %d calls failed", len(calls))
            for call in calls:
                call.fail(_copy(err))

    def _free_slots(self, task: Task, calls: list[Call], outcomes: Sequence[int], ended: float,
                    timed: bool, lost: bool) -> list[_native.Decision]:
        """Free an ended task's slots. The calls that tell of the actor as it is now count as
        its successes and failures, with the task's times; the others free their slots and
        nothing more: calls cancelled, calls not run (`_NOT_RUN`), and calls lost by an earlier
        incarnation (whose end may come after the restart) or by the mesh's own shutdown."""
        actor, scheduler = task.actor, self.scheduler
        stale = lost and (task.epoch != self.failures.epochs[actor] or self.closed)
        if len(outcomes) == 1:  # a lone call, most of them
            outcome = outcomes[0]
            if outcome == _ray.CANCELLED or outcome in _NOT_RUN or (stale and outcome in _LOST):
                return scheduler.release(actor, self._drain_inline, 1, True)
            return scheduler.complete(actor, task.started, ended, 0 if outcome == _ray.OK else 1,
                                      self._drain_inline, 1, calls[0].method_id,
                                      timed and not stale, task.busy_s)
        counts = [o for o in outcomes if o != _ray.CANCELLED and o not in _NOT_RUN
                  and not (stale and o in _LOST)]
        if not counts:
            return scheduler.release(actor, self._drain_inline, len(calls), True)
        if len(counts) < len(calls):
            scheduler.release(actor, False, len(calls) - len(counts), False)
        failed = sum(o != _ray.OK for o in counts)
        run = (-1, 0, 0)  # how the failures fell: unknown, or all of them
        if 0 < failed < len(counts):
            # in the order the calls ran; an asyncio actor runs them at once: the most
            # interleaved order they could have had
            run = _failure_run(counts) if not self._actors[actor].asyncio else \
                (0, -(-failed // (len(counts) - failed + 1)), 0)
        return scheduler.complete(actor, task.started, ended, failed, self._drain_inline,
                                  len(counts), _method_of(calls), timed and not stale,
                                  task.busy_s, *run)

    def _settle(self, call: Call, outcome: int, task: Task, index: int,
                error: BaseException | None) -> None:
        """Settle one call of an ended task: its value or its error, unless it goes again (it
        never started, or its actor was lost and it has retries), or a hedged copy still runs
        that may do better (the first copy to end with a value wins; see `_hedge`)."""
        if outcome in _NOT_RUN:  # never started: it goes again (alone, as Ray would run it)
            if outcome == SKIPPED:
                self._alone.add(call.method)
            elif outcome == RESEND and index == 0:
                self._task_not_run(call.method, error)
            if outcome != DEFERRED:
                call.rides = False
            _loop.post(self._retry, call)
            return
        twin = call.twin
        if outcome != _ray.OK and twin is not None and twin.task is not None \
                and not twin.task.ended() and not call.future.done():
            return  # the other copy still runs: its end settles the call
        if outcome in _LOST and self._retried(call):
            return
        if twin is not None and twin.task is not None and not twin.task.ended():
            # The first to end won: stop the other, posted before the caller can see the value
            # (so a caller that waits for the loop after it knows that the cancel went out).
            _loop.post(self.cancel_sent, twin.task, call.future)
        if outcome == _ray.OK or outcome == _ray.RAISED or error is None:
            call.future.set_result((task, index))
        elif isinstance(error, RayError):
            call.fail(call.error(error))
        else:
            call.fail(_copy(error))

    def _task_not_run(self, method: str, error: BaseException | None) -> None:
        """A task of `method`'s calls failed before running them (their calls go again alone).
        An argument the actor cannot load does that once; a cause that stays (an actor whose
        workers cannot run the library's runner) would do it to every task: after three, the
        method's calls go alone, and the log says why."""
        failures = self._tasks_not_run[method] = self._tasks_not_run.get(method, 0) + 1
        if failures == 3:
            self._alone.add(method)
            log.warning("actormesh: three tasks of %s calls failed before running them (%s): "
                        "its calls go alone from now on", method, error)

    def _retried(self, call: Call) -> bool:
        """A call whose actor was lost goes to another actor if it has retries left (a hedge
        copy: the call it copies)."""
        if call.twin is not None and call.future is call.twin.future and call.hedge is not None \
                and call.twin.retries > call.retries:
            call = call.twin
        if call.retries > 0 and call.target is not None and not call.future.done():
            call.retries -= 1
            if call.twin is not None:  # hedged once: the retry goes without a copy
                call.twin = call.hedge = None
            _loop.post(self._retry, call)
            return True
        return False

    def _retry(self, call: Call) -> None:
        """Route a call again (loop thread: lost, or not run), unless it was cancelled or timed
        out since: such a call is never sent again (and is counted here). A call of `all` or
        `shard` goes back to its own actor."""
        if call.future.done():
            self._count_unsent(call)
        elif call.target is None:
            self.send(call.actor, call)
        else:
            self.route(call)

    def _count_unsent(self, call: Call) -> None:
        """Count a call cancelled or timed out after it left the queue, never (again) sent, as
        `cancel` counts one it takes out of the queue."""
        error = call.future.exception()
        if isinstance(error, _CANCELS):
            self._count_at_once(call, _cancelled_name(error))

    def _count_at_once(self, call: Call, outcome: str) -> None:
        """Count a call that ended without running, after no time (a hedge's copy: its call
        is counted)."""
        if self.metrics is not None and call.twin is None:
            self.metrics.call_ended(call.method, outcome, 0.0)

    def _fail_decisions(self, decisions: Sequence[_native.Decision], error: BaseException,
                        outcome: str = "error") -> None:
        for decision in decisions:
            for call in decision.payloads:
                self._fail_unsent(call, _copy(error), outcome)

    def _fail_unsent(self, call: Call, error: BaseException, outcome: str = "error") -> None:
        """Fail a call that was never sent: it ended after no time, counted as an error (no
        live actor for it, Ray refused the send) or as cancelled (the mesh was shut down)."""
        if call.future.set_exception(error):
            self._count_at_once(call, outcome)

    # -- cancellation, timeouts, shutdown ------------------------------------------------------
    def cancel(self, calls: Sequence[Call], error: BaseException) -> None:
        """Settle every call not yet done with `error`: a queued call leaves the queue and is
        never sent, a call already sent is cancelled where it runs (`cancel_sent`: a task once
        every call in it is done). Its slot is freed when its task ends, as for any call."""
        for call in calls:
            if call.future.done():
                continue
            if call.ticket and self.scheduler.cancel(call.ticket):
                # never sent (False: given a slot meanwhile; its send sees it settled)
                self._count_at_once(call, _cancelled_name(error))
            # Settled first, then `task` read: a send under way either sees the call settled
            # or has set `task` by now, so one of the two cancels it.
            if call.future.set_exception(_copy(error)):
                for copy in (call, call.twin):
                    if copy is not None and copy.task is not None:
                        copy.task.cancels += 1
                        self.cancel_sent(copy.task)

    def cancel_sent(self, task: Task, settling: Result[Any] | None = None) -> None:
        """Ask Ray to stop a task once every call in it is done (cancelled, timed out, or won by
        a hedge copy: `settling`, the future its winner is settling now), where Ray can: an
        async (or threaded) actor cancels it, and one it has not started never runs. A
        synchronous actor runs its calls in order and its task runs to its end, its results
        dropped: Ray 2.60 cannot skip one without stalling the actor
        (`_ray.runs_calls_at_once`). Never a kill."""
        if task.ref is None or task.ended() or task.stopping or not _ray.connected() \
                or not _ray.runs_calls_at_once(self.handles[task.actor]):
            return
        if not all(c.future.done() or c.future is settling or c.task is not task
                   for c in task.calls):
            return
        _cancel_task(weakref.ref(task), 0)

    def expire_after(self, timeout_s: float, calls: Sequence[Call], label: str) -> _loop.Timer:
        """Cancel the calls not done after `timeout_s` with a `MeshTimeoutError` (on the loop
        thread): those still queued are never sent, those sent are cancelled in the actor."""
        error = MeshTimeoutError(f"{label} did not finish within timeout={timeout_s} s"
                                 + self.why_waiting())
        return _loop.call_later(timeout_s, self.cancel, calls, error)

    def why_waiting(self) -> str:
        """For a timeout's message: what the mesh's actors wait for, if the cluster lacks it."""
        return f" (the actors wait for resources: {self.lacking})" if self.lacking else ""

    def close(self, why: str) -> None:
        """Fail every queued call with `why`; later calls fail at once, and calls given a slot
        but not yet sent are never sent."""
        self.closed = self.holds.closed = True
        self.failures.close()
        self._fail_decisions(self.scheduler.take_queued(), MeshError(why), "cancelled")


class _ActorKind:
    """What the router knows of one actor: whether it runs tasks of several calls (and how),
    and its methods that must go alone."""

    __slots__ = ("runner", "streams", "batches", "asyncio", "alone_methods", "no_reply")

    def __init__(self, handle: Any) -> None:
        methods = _ray.method_names(handle)
        self.runner = _runner.BATCH in methods  # a mesh actor: the library's runner is there
        self.streams = _runner.STREAM in methods
        self.asyncio = _runner.ASYNCIO in methods
        # An actor made elsewhere that may run calls at once has no runner the library
        # controls (cancel, its bound): its calls go alone.
        self.batches = self.runner or not _ray.runs_calls_at_once(handle)
        self.alone_methods = _ray.methods_with_options(handle)
        self.no_reply = _ray.methods_without_returns(handle)

    def wire(self, calls: list[Call], router: Router) -> int:
        """How a task of `calls` travels to this actor."""
        if len(calls) == 1 and (not self.asyncio or not calls[0].rides):
            return LONE  # on an asyncio mesh actor every task but these holds its bound
        if self.streams and _expected_s(calls, router.scheduler) > STREAM_ABOVE_S:
            return STREAM
        return LIST


def _expected_s(calls: list[Call], scheduler: _native.Scheduler) -> float:
    """How long the calls are expected to take one after another (unmeasured: long)."""
    total = latency = 0.0
    method = -1
    for call in calls:
        if call.method_id != method:  # a task's calls mostly share one
            method = call.method_id
            latency = scheduler.method_latency_s(method)
            if math.isnan(latency):
                return math.inf
        total += latency
    return total


def _ends_hedged_call(copy: Call, twin: Call, settled_before: bool) -> bool:
    """Whether the end of one copy of a hedged call is the end its metrics count (once per
    call): the copy that settles it, or, for a call cancelled or timed out, the last to end."""
    if not settled_before:
        return copy.future.done()  # it won, or was the last to fail
    return copy.future.exception() is not None and (twin.task is None or twin.task.ended())


def _failure_run(outcomes: Sequence[int]) -> tuple[int, int, int]:
    """The failed calls a task began with, its longest run of them and those it ended with, in
    the order of `outcomes`."""
    first = longest = run = 0
    succeeded = False
    for outcome in outcomes:
        if outcome == _ray.OK:
            succeeded, run = True, 0
            continue
        run += 1
        longest = max(longest, run)
        if not succeeded:
            first = run
    return first, longest, run


def _bound_s(calls: list[Call], scheduler: _native.Scheduler) -> float:
    """How long a task of `calls` that returns them together may run before it starts no more
    of them (`_runner.UNSTREAMED_S`): that, or twice their expected time if longer; none for
    calls of unknown speed."""
    expected = _expected_s(calls, scheduler)
    return max(STREAM_ABOVE_S, 2.0 * expected) if expected != math.inf else math.inf


def _method_of(calls: list[Call]) -> int:
    """The calls' method id when they share one, else 0 (any call)."""
    method = calls[0].method_id
    return method if all(c.method_id == method for c in calls) else 0


def _task_name(calls: list[Call]) -> str:
    """How the dashboard names a task: after its method (its calls' methods)."""
    names = dict.fromkeys(c.method for c in calls)
    return "+".join(names) if len(names) <= 3 else f"{next(iter(names))}+{len(names) - 1} more"


def _lone_value(out: Any) -> Any:
    """The value of a Ray call made alone: its return; a tuple of a method's several returns;
    the list of a generator's values (all there: the call has ended; a list, not an iterator,
    so that every reader of the call's future reads them all)."""
    if isinstance(out, list):
        return tuple(_ray.get(out))
    if isinstance(out, ObjectRefGenerator):
        return [_ray.get(ref) for ref in out]
    return _ray.get(out)


def _first_ref(out: Any, what: str) -> ray.ObjectRef[Any]:
    """The ref whose end is the end of a Ray call that returned `out`."""
    if isinstance(out, ObjectRefGenerator):
        completed: ray.ObjectRef[Any] = out.completed()
        return completed
    refs = out if isinstance(out, list) else [out]
    if not refs or not all(isinstance(r, ray.ObjectRef) for r in refs):
        raise TypeError(f"{what} returned {out!r}: it must return the ObjectRef of the Ray call "
                        "it made (or a list of them)")
    first: ray.ObjectRef[Any] = refs[0]
    return first


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

