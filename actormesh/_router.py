"""The call path: from a verb to a Ray actor call and back, keeping the native load table exact.

Every call to an actor goes through `Router.send` (the caller picked the actor: `all`, `shard`)
or `Router.route` (the native scheduler picks: `choose`). Either way the actor's in-flight count
goes up when the call is sent and down in the call's completion callback, which fires once for
every way a call ends: result, error, cancellation, actor death. Calls the scheduler queued (all
candidates at `max_in_flight`) are sent from that callback as slots free, never by polling.

Two callbacks, by what the router needs to know. `all` and `shard` combine values and a call with
`retries` must see an actor death, so theirs (`_on_completed`) gets the value. A plain `choose`
only frees its slot: `_on_ready` says the call ended without reading its value, which `get()`
reads later on the caller's thread. That keeps the per-call work on Ray's callback thread, where
it competes with the caller for the GIL, to a few microseconds.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError as RayActorDiedError
from ray.exceptions import RayActorError, RayError, RayTaskError, TaskCancelledError

from . import _native, _timers
from ._actor import WATCH
from ._errors import ActorDiedError, ActorError, MeshError, MeshTimeoutError, NoLiveActorsError
from ._future import Outcome, Part
from ._shape import Point, Shape

# `ObjectRef._on_ready` (Ray >= 2.60) tells a call has ended without reading its value.
_ON_READY = hasattr(ray.ObjectRef, "_on_ready")
_NO_KWARGS: dict[str, Any] = {}  # never written to
try:
    _ray_worker: Any = importlib.import_module("ray._private.worker")  # internals, for `_inline`
except ImportError:
    _ray_worker = None


def _inline(ref: ray.ObjectRef[Any]) -> bool:
    """Whether `ref`'s value came back inline with the reply (small; every error does), so that
    reading it on Ray's callback thread cannot wait on a transfer from another node."""
    try:
        core_worker = _ray_worker.global_worker.core_worker
        return bool(core_worker.object_exists(ref, memory_store_only=True))
    except AttributeError:  # not the internals of the Ray this was built for: assume small
        return True


# A restarting actor fails probes until it is back (about 1-2 s here); probing is cheap.
_PROBE_DELAYS_S = (0.02, 0.05, 0.1, 0.2)  # then every 0.2 s


class Call(Part):
    """One call to one actor: what to send, how to route it (`choose`), and its outcome (a `Part`).

    One object from `choose` to the completion callback, which is the call itself (`__call__`):
    nothing else is allocated per call to keep alive while it is in flight.
    """

    __slots__ = ("method", "args", "kwargs", "group", "affinity", "retries", "return_exceptions",
                 "ticket", "router", "started")

    def __init__(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 point: Point | None = None, view: Callable[[int], Point] | None = None,
                 *, group: int = -1, affinity: int | None = None, retries: int = 0,
                 return_exceptions: bool = False) -> None:
        super().__init__(point, view)
        self.method = method
        self.args = args
        self.kwargs = kwargs
        self.group = group  # the scheduler group `choose` routes in; -1 for a call sent directly
        self.affinity = affinity
        self.retries = retries
        self.return_exceptions = return_exceptions
        self.ticket = 0  # set while the call waits in the scheduler's queue
        self.router: Router | None = None  # set with `actor` and `started` when sent
        self.started = 0.0

    def __call__(self, error: BaseException | None) -> None:
        """Ray's `_on_ready` callback: the call ended; its value is read when asked for."""
        assert self.router is not None
        self.router._ready(self, error)

    def on_result(self, result: Any) -> None:
        """Ray's `_on_completed` callback, with the value or the error."""
        assert self.router is not None
        self.router._finish(self, result)

    def _raised(self, error: Exception) -> Outcome:
        # Not a death notice: the value may be read long after the actor came back; the watch
        # call the router keeps on every actor reports deaths.
        assert self.router is not None
        mapped = self.router._error(self.actor, self.method, error)
        return (mapped, None) if self.return_exceptions else (None, mapped)


class Router:
    """Sends calls to the actors of one mesh (shared by all its views) and settles their parts."""

    def __init__(self, handles: Sequence[Any], shape: Shape, scheduler: _native.Scheduler,
                 *, max_restarts: int, on_restart: Callable[[int], None] | None) -> None:
        self.handles = list(handles)
        self.points = [Point(r, shape) for r in range(len(self.handles))]
        self.scheduler = scheduler
        self._max_restarts = max_restarts
        self._on_restart = on_restart
        self._remote: dict[tuple[int, str], Any] = {}
        # Calls the scheduler queued, by ticket. The native queue and this table change apart, so
        # three races are closed under `_qlock` (taken only on the queueing path, never by a call
        # that got a slot at once): a ticket drained before `route` filed it (`_early`: send it
        # then), a ticket given up by `mark_dead` or a failing picker before it was filed
        # (`_orphaned`: fail it then with that error), and a ticket drained while its call was being cancelled (`_abandoned`: free
        # the slot it was given).
        self._queued: dict[int, Call] = {}
        self._early: dict[int, int] = {}
        self._orphaned: dict[int, BaseException] = {}
        self._abandoned: set[int] = set()
        self._qlock = threading.Lock()
        self._dead: set[int] = set()
        # The pending watch and probe call per actor. Held, because Ray may never run the
        # completion callback of an ObjectRef nobody references.
        self._watches: dict[int, Any] = {}
        self._probes: dict[int, Any] = {}
        self._deaths = [0] * len(self.handles)
        self._closed = False

    # -- sending ----------------------------------------------------------------------------
    def send(self, actor: int, call: Call) -> None:
        """Send `call` to `actor`, counting it in the load table whatever the slot limit."""
        self.scheduler.acquire(actor)
        self._send(actor, call)

    def route(self, call: Call) -> None:
        """Let the scheduler pick the actor for `call`, now or when a slot frees."""
        if self._closed:
            self._fail(call, MeshError("the mesh is shut down"))
            return
        try:
            decision = self.scheduler.submit(call.group, call.affinity)
        except _native.NoLiveActors as err:
            self._fail(call, NoLiveActorsError(f"{call.method}: {err}"))
            return
        except Exception as err:  # a Python Balancer raised or returned a bad index
            self._fail(call, err)
            return
        if decision.actor >= 0:
            self._send(decision.actor, call)
            return
        ticket = call.ticket = decision.ticket
        with self._qlock:
            actor = self._early.pop(ticket, None)
            error = self._orphaned.pop(ticket, None) if actor is None else None
            if actor is None and error is None:
                self._queued[ticket] = call
                return
        if error is not None:
            self._fail(call, error)
        elif actor is not None:
            self._send(actor, call)

    def _send(self, actor: int, call: Call) -> None:
        call.ticket = 0
        remote = self._remote.get((actor, call.method))
        if remote is None:
            remote = self._remote[(actor, call.method)] = getattr(self.handles[actor], call.method)
        call.router, call.actor = self, actor
        call.started = time.perf_counter()
        try:
            ref = remote.remote(*call.args, **call.kwargs)
        except Exception as err:  # e.g. an argument that cannot be serialised
            self._finish(call, err, failed=True)
            return
        call.ref = ref
        if call.group < 0 or call.retries > 0 or not _ON_READY:
            ref._on_completed(call.on_result)  # the outcome is needed now: to combine, to retry
        else:
            ref._on_ready(call)
        if not call.retries:  # Ray holds what it sent; free the caller's objects with its future
            call.args, call.kwargs = (), _NO_KWARGS

    def _dispatch(self, decisions: Sequence[_native.Decision]) -> None:
        """Send the queued calls the scheduler has just given a slot."""
        pending = deque(decisions)
        while pending:
            decision = pending.popleft()
            with self._qlock:
                call = self._queued.pop(decision.ticket, None)
                if call is None:
                    if decision.ticket not in self._abandoned:
                        self._early[decision.ticket] = decision.actor
                        continue
                    self._abandoned.discard(decision.ticket)
            if call is None:  # cancelled as it was given a slot: free the slot again
                now = time.perf_counter()
                pending.extend(self._complete(decision.actor, now, now, False))
            else:
                self._send(decision.actor, call)

    def _complete(self, actor: int, started: float, ended: float, ok: bool) -> list[_native.Decision]:
        """End one call in the scheduler; return the queued calls it gave a slot."""
        try:
            return self.scheduler.complete(actor, started, ended, ok)
        except _native.PickerError as err:
            return self._picker_failed(err)

    def _picker_failed(self, err: _native.PickerError) -> list[_native.Decision]:
        """A Python Balancer raised while queued calls were drained: fail those, lose none."""
        cause = err.__cause__ or err
        self._orphan(err.failed, lambda: cause)
        return list(err.dispatched)

    def _orphan(self, tickets: Sequence[int], error: Callable[[], BaseException]) -> None:
        """Fail the calls of tickets the scheduler gave up; those not filed yet fail when filed."""
        with self._qlock:
            calls = []
            for ticket in tickets:
                if ticket in self._queued:
                    calls.append(self._queued.pop(ticket))
                else:
                    self._orphaned[ticket] = error()
        for call in calls:
            self._fail(call, error())

    # -- completion -------------------------------------------------------------------------
    def _ready(self, call: Call, error: BaseException | None) -> None:
        """A `choose` call ended: free its slot now; its value is read when asked for.

        With calls queued, the slot may go straight to one of them, so the outcome is read first
        (as `_finish` does) lest a queued call follow this one to an actor that just died.
        Otherwise the scheduler counts the call's time as a service-time sample whether it
        returned or raised, and the actor's watch call reports its death.
        """
        ref = call.ref
        assert ref is not None
        if error is not None:  # the value will never exist (e.g. its owner lost it)
            self._finish(call, error, failed=True)
            return
        if self.scheduler.queued() and _inline(ref):
            try:
                value = ray.get(ref)
            except RayError as err:
                self._finish(call, err, failed=True)
            else:
                self._finish(call, value, failed=False)
            return
        drained = self._complete(call.actor, call.started, time.perf_counter(), True)
        if drained:
            self._dispatch(drained)
        call.settle_ready(ref)

    def _finish(self, call: Call, result: Any, failed: bool | None = None) -> None:
        actor = call.actor
        if failed is None:
            failed = isinstance(result, RayError)
        died = failed and isinstance(result, RayActorError)
        if died:
            self._on_death(actor)
        drained = self._complete(actor, call.started, time.perf_counter(), not failed)
        if drained:
            self._dispatch(drained)
        if died and call.retries > 0 and call.group >= 0:
            call.retries -= 1
            self.route(call)
            return
        if failed:
            self._fail(call, self._error(actor, call.method, result))
        else:
            call.settle(result, None)  # a second outcome (late, after a timeout) is dropped

    def _fail(self, call: Call, error: BaseException) -> None:
        if call.return_exceptions:
            call.settle(error, None)
        else:
            call.settle(None, error)

    def _error(self, actor: int, method: str, result: BaseException) -> BaseException:
        point = self.points[actor]
        if isinstance(result, RayActorError):
            detail = str(result).strip().splitlines()[0] if str(result).strip() else "unreachable"
            return ActorDiedError(point, method, detail)
        if isinstance(result, TaskCancelledError):
            return cf.CancelledError(f"{method} on rank {point.rank} was cancelled")
        cause = result.cause if isinstance(result, RayTaskError) and result.cause else result
        error = ActorError(point, method, cause)
        error.__cause__ = cause
        return error

    # -- cancellation and timeouts ------------------------------------------------------------
    def cancel(self, calls: Sequence[Call], error: BaseException) -> None:
        """Drop the calls still queued and settle every call not yet done with `error`.

        A call already sent runs to its end and its result is dropped: `ray.cancel` of a call
        waiting in a synchronous actor's queue can stall that actor (Ray 2.60 then times out the
        actor's next call after 30 s), and the slot is freed by the call's own completion anyway.
        """
        for call in calls:
            if call.done():
                continue
            with self._qlock:
                queued = self._queued.pop(call.ticket, None) if call.ticket else None
                if queued is not None and not self.scheduler.cancel(queued.ticket):
                    self._abandoned.add(queued.ticket)
            self._fail(call, error)

    def expire_after(self, timeout_s: float, calls: Sequence[Call], label: str) -> None:
        error = MeshTimeoutError(f"{label} did not finish within timeout={timeout_s} s")
        _timers.call_later(timeout_s, lambda: self.cancel(calls, error))

    # -- failures and restarts ----------------------------------------------------------------
    def watch(self, actor: int) -> None:
        """Keep a never-returning call pending on `actor`: its failure is the death notice."""
        ref = self._watches[actor] = getattr(self.handles[actor], WATCH).remote()
        ref._on_completed(lambda result: self._watched(actor, result))  # pyright: ignore[reportUnknownLambdaType]

    def _watched(self, actor: int, result: Any) -> None:
        if not self._closed and isinstance(result, RayActorError):
            self._on_death(actor)

    def _on_death(self, actor: int) -> None:
        with self._qlock:
            if actor in self._dead:
                return
            self._dead.add(actor)
            self._deaths[actor] += 1
        self._orphan(self.scheduler.mark_dead(actor),
                     lambda: NoLiveActorsError("every candidate actor of the call died"))
        if self._max_restarts < 0 or self._deaths[actor] <= self._max_restarts:
            self._probe(actor, 0)

    def _probe(self, actor: int, attempt: int) -> None:
        """Wait for a restarting actor to answer; then route to it again."""
        if self._closed:
            return
        ref = self._probes[actor] = self.handles[actor].__ray_ready__.remote()
        ref._on_completed(lambda result: self._probed(actor, attempt, result))  # pyright: ignore[reportUnknownLambdaType]

    def _probed(self, actor: int, attempt: int, result: Any) -> None:
        if isinstance(result, RayError):
            if isinstance(result, RayActorDiedError) and "permanently" in str(result).lower():
                return
            delay = _PROBE_DELAYS_S[min(attempt, len(_PROBE_DELAYS_S) - 1)]
            _timers.call_later(delay, lambda: self._probe(actor, attempt + 1))
            return
        if self._on_restart is not None:
            self._on_restart(actor)
        with self._qlock:
            self._dead.discard(actor)
        self.watch(actor)
        try:
            drained = self.scheduler.mark_alive(actor)
        except _native.PickerError as err:
            drained = self._picker_failed(err)
        self._dispatch(drained)

    def close(self) -> None:
        """Fail every queued call; later calls fail at once."""
        self._closed = True
        with self._qlock:
            calls = list(self._queued.values())
            self._queued.clear()
        for call in calls:
            self.scheduler.cancel(call.ticket)
            self._fail(call, MeshError("the mesh was shut down before this call was sent"))

