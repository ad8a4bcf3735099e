"""Failures: which actors of a mesh may take calls, and since which incarnation.

Deaths and restarts are learnt from Ray's GCS actor channel (`ActorStates`), which reports every
state change of every actor within milliseconds, idle or busy, and carries Ray's restart count:
the actor's *epoch*. A call records the epoch it was sent to, so a failure that arrives late
from an earlier incarnation never takes a restarted actor out again.

Each actor's state changes in one place: `_liveness.transition`, on the library's loop thread.
Every event goes through it (a GCS notice, a call found the actor gone, the answer to a state
read, the end of a hook, the restart timer) and this module carries out what it answers: mark
the actor in the scheduler, start or stop the restart timer, read the actor's state (retried
with back-off until the GCS answers), and bring a restarted actor back.

A call that finds its actor gone is seen on Ray's completion thread, which marks the actor
"restarting" in the scheduler at once (no queued call may follow the lost one there) and hands
the event to the loop; the transition then restates the actor's state to the scheduler, so a
mark that raced with a re-admission is undone there, with no check-then-act across threads.

A restarted incarnation is admitted once this process can call it and its `on_restart(view)`
hook has run, on the mesh's own user lane (it may call the mesh and wait: the actor answers calls
sent to it directly, only `choose` does not route to it yet). A hook that raises is logged, and
one that runs past `on_restart_timeout_s` is logged and left to finish on its thread: the actor
is used again all the same, since it did come back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import _loop, _native, _ray
from ._errors import NoLiveActorsError
from ._liveness import (
    ComeBack,
    Effect,
    Event,
    HookEnded,
    Life,
    Lost,
    Notice,
    Probe,
    Route,
    Seen,
    StartTimer,
    Status,
    StopTimer,
    TimerFired,
    transition,
)
from ._metrics import MeshMetrics

log = logging.getLogger("actormesh")

_CALLABLE_POLL_S = 0.005
_CALLABLE_POLLS = 2000  # 10 s: then the hook and the calls go ahead, and fail if they must
_READ_FIRST_S = 0.05  # the first retry of a state read that failed; doubled up to the next
_READ_MAX_S = 2.0
ON_RESTART_TIMEOUT_S = 600.0
"""How long an `on_restart` hook may run before its actor is used again anyway (by default:
re-forming a collective group may legitimately take minutes)."""

_SEEN: dict[int, Seen] = {_ray.ALIVE: "alive", _ray.RESTARTING: "restarting", _ray.DEAD: "dead"}

SendDrained = Callable[[Callable[[int], list[_native.Decision]], int], None]
"""`send_drained(take, actor)` sends the queued calls `take(actor)` gives a slot (the router's)."""
FailQueued = Callable[[Sequence[_native.Decision], BaseException], None]
"""Fails queued calls that can never run (the router's)."""


class Failures:
    """Deaths and restarts of the actors of one mesh (shared by its views)."""

    def __init__(self, scheduler: _native.Scheduler, names: Sequence[str], *,
                 restart_timeout_s: float, send_drained: SendDrained, fail: FailQueued) -> None:
        self._scheduler = scheduler
        self._names = list(names)  # "rank 1 (dp=0,tp=1)", for messages
        self._restart_timeout_s = restart_timeout_s
        # Runs (on the mesh's hook lane) when an actor is back, before `choose` uses it again.
        self.on_restart: Callable[[int], object] | None = None
        self.on_restart_timeout_s = ON_RESTART_TIMEOUT_S
        self.label = "mesh"  # the mesh's name, for the log (set by the mesh)
        self.metrics: MeshMetrics | None = None  # where deaths and restarts are counted
        self._send_drained = send_drained
        self._fail = fail
        count = len(self._names)
        self._lives = [Life()] * count  # replaced whole on the loop thread, read anywhere
        self.epochs = [0] * count  # the newest incarnation seen; read by the router per call
        self._timers: list[_loop.Timer | None] = [None] * count
        self._next_timer = 1
        self._reading: set[int] = set()  # actors whose state is being read
        self._hooks = _loop.Lane()
        self._actor_ids: list[bytes] = []
        self._closed = False

    # -- events -------------------------------------------------------------------------------
    def on_state(self, actor: int, state: int, epoch: int, reason: str) -> None:
        """A state notice from the GCS (loop thread)."""
        seen = _SEEN.get(state)
        if seen is not None:
            self._event(actor, Notice(seen, epoch, reason))

    def lost(self, actor: int, epoch: int) -> None:
        """A call sent to incarnation `epoch` found the actor gone (Ray's completion thread):
        stop routing to it at once, and let the loop thread decide what became of it."""
        if self._closed:
            return
        # Whatever `_lives` says: the loop thread replaces the life with a death notice's before
        # it tells the scheduler, and a slot freed in between would send a queued call to the
        # dead actor. Marking one the scheduler already holds dead changes nothing.
        if self._lives[actor].routed == epoch:
            self._scheduler.mark_dead(actor, restarting=True)
        _loop.post(self._event, actor, Lost(epoch))

    def _event(self, actor: int, event: Event) -> None:
        """Pass `event` through the actor's transition and carry out what it answers (loop
        thread)."""
        if self._closed:
            return
        before = self._lives[actor]
        life, effects = transition(before, event, timer=self._next_timer)
        self._lives[actor] = life
        self._report(actor, before, life)
        self.epochs[actor] = life.epoch
        for effect in effects:
            self._apply(actor, effect)

    def _apply(self, actor: int, effect: Effect) -> None:
        if isinstance(effect, Route):
            self._route(actor, effect)
        elif isinstance(effect, StartTimer):
            self._next_timer += 1
            self._stop_timer(actor)
            why = f"did not come back within restart_timeout_s={self._restart_timeout_s} s"
            self._timers[actor] = _loop.call_later(
                self._restart_timeout_s, _weak(self._event), actor, TimerFired(effect.token, why))
        elif isinstance(effect, StopTimer):
            self._stop_timer(actor)
        elif isinstance(effect, Probe):
            if actor not in self._reading and actor < len(self._actor_ids):
                self._reading.add(actor)
                _loop.loop().create_task(self._read_state(actor))
        elif isinstance(effect, ComeBack):
            _loop.loop().create_task(self._come_back(actor, effect.epoch))

    def _route(self, actor: int, route: Route) -> None:
        """Make the scheduler see the actor as `route` says, unless it does already."""
        now = self._scheduler.status()[actor]
        if route.as_ == now:
            return
        if route.as_ == "alive":
            self._send_drained(self._scheduler.mark_alive, actor)
        elif route.as_ == "restarting":
            self._scheduler.mark_dead(actor, restarting=True)  # a dead one stays dead till admitted
        else:
            orphans = self._scheduler.mark_dead(actor)
            if orphans:
                self._fail(orphans, NoLiveActorsError(
                    f"no live actor left to take the call ({self._names[actor]} {route.why})"))

    def _report(self, actor: int, before: Life, after: Life) -> None:
        """Log (WARNING) and count in the mesh's metrics what Ray said became of the actor:
        it died, came back after a restart, or will not come back. Once this driver has left
        Ray (`ray.shutdown()`, the interpreter's exit), the actors it owns die with it: that is
        expected, and logged at DEBUG only."""
        name = f"{self.label}: {self._names[actor]}"
        level = logging.WARNING if _ray.connected() else logging.DEBUG
        if before.seen == "alive" and after.seen != "alive":
            self._count("died")
            if after.seen == "restarting":
                log.log(level, "actormesh: %s died; Ray is restarting it", name)
        if after.status is Status.DEAD and before.status is not Status.DEAD:
            log.log(level, "actormesh: %s died and will not be restarted (max_restarts reached, "
                    "or killed for good)", name)
        elif after.status is Status.GONE and before.status is not Status.GONE:
            log.log(level, "actormesh: %s did not come back within restart_timeout_s=%s s; its "
                    "calls failed", name, self._restart_timeout_s)
        elif after.status is Status.ALIVE and after.routed > before.routed:
            self._count("restarted")
            log.log(level, "actormesh: %s is back after a restart (restart %d)", name,
                    after.routed)

    def _count(self, event: str) -> None:
        if self.metrics is not None:
            self.metrics.actor_event(event)

    def _stop_timer(self, actor: int) -> None:
        timer, self._timers[actor] = self._timers[actor], None
        if timer is not None:
            timer.cancel()

    async def _read_state(self, actor: int) -> None:
        """Ask the GCS what became of an actor a call found gone, until it answers: one failed
        read concludes nothing."""
        delay = _READ_FIRST_S
        try:
            while not self._closed and _ray.connected():  # no GCS left to ask after shutdown
                try:
                    found = await _ray.actor_state(self._actor_ids[actor])
                except Exception as err:  # noqa: BLE001 - the GCS is busy or away: ask again
                    log.debug("actormesh: cannot read the state of %s (%s); retrying in %.2f s",
                              self._names[actor], err, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _READ_MAX_S)
                    continue
                if found is not None:
                    self.on_state(actor, *found)
                return
        finally:
            self._reading.discard(actor)

    def _returning(self, actor: int, epoch: int) -> bool:
        life = self._lives[actor]
        return not self._closed and life.status is Status.RETURNING and life.epoch == epoch

    async def _come_back(self, actor: int, epoch: int) -> None:
        # The channel says "alive" a little before this process's core worker knows it, which
        # fails calls sent meanwhile ("the actor is restarting"): wait for it (a few ms).
        actor_id = self._actor_ids[actor] if actor < len(self._actor_ids) else None
        for _ in range(_CALLABLE_POLLS):
            if not self._returning(actor, epoch) or actor_id is None \
                    or _ray.locally_alive(actor_id):
                break
            await asyncio.sleep(_CALLABLE_POLL_S)
        hook = self.on_restart
        if hook is None:
            self._event(actor, HookEnded(epoch))
        elif self._returning(actor, epoch):
            self._hooks.run(f"on_restart of {self._names[actor]}", self._run_hook, hook, actor,
                            epoch)

    def _run_hook(self, hook: Callable[[int], object], actor: int, epoch: int) -> None:
        """On the hook lane: run the hook of incarnation `epoch`, unless it went away while
        the hook waited for its turn (a newer incarnation's hook runs instead)."""
        if not self._returning(actor, epoch):
            return
        limit = self.on_restart_timeout_s
        overran = _loop.call_later(limit, self._overran, actor, epoch, limit)
        try:
            hook(actor)
        finally:
            overran.cancel()
            _loop.post(self._event, actor, HookEnded(epoch))

    def _overran(self, actor: int, epoch: int, limit: float) -> None:
        if self._returning(actor, epoch):
            log.error("actormesh: on_restart of %s did not return within on_restart_timeout_s="
                      "%s s; routing to the actor again (the hook goes on in its thread)",
                      self._names[actor], limit)
            self._hooks.abandon()
            self._event(actor, HookEnded(epoch))

    # -- lifetime --------------------------------------------------------------------------------
    def watch(self, actor_ids: Sequence[bytes], *, known: bool) -> None:
        """Follow these actors (rank order) on the GCS channel. Actors made elsewhere (not
        `known`) may have restarted or died already: their state is read first."""
        self._actor_ids = list(actor_ids)
        ActorStates.get().watch(self, self._actor_ids)
        if not known:
            _loop.submit(self._read_states()).result(60)

    async def _read_states(self) -> None:
        for actor, actor_id in enumerate(self._actor_ids):
            found = await _ray.actor_state(actor_id)
            seen = None if found is None else _SEEN.get(found[0])
            if found is None or seen is None:
                continue
            _, epoch, reason = found
            self._lives[actor] = Life(epoch=epoch, seen=seen, routed=epoch)
            self.epochs[actor] = epoch
            if seen != "alive":
                self._event(actor, Notice(seen, epoch, reason))

    def close(self) -> None:
        self._closed = True
        for actor in range(len(self._timers)):
            self._stop_timer(actor)
        ActorStates.get().unwatch(self, self._actor_ids)


def _weak(method: Callable[..., None]) -> Callable[..., None]:
    """`method` held weakly: a pending timer must not keep a dropped mesh alive."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


class ActorStates:
    """The process's one subscription to the GCS actor channel, read on the loop thread.

    Meshes register their actors' ids; a notice for one of them goes to the `Failures` of every
    mesh over it (several meshes may share actors: `from_actors`, a pool's generations), each
    held weakly: a dropped mesh stops listening. Notices for other actors are ignored.
    """

    _instance: ActorStates | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._watched: dict[bytes, list[tuple[weakref.ref[Failures], int]]] = {}
        self._address: str | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def get(cls) -> ActorStates:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = ActorStates()
            return cls._instance

    def start(self, timeout_s: float = 30.0) -> bool:
        """Subscribe (once per cluster) before actors are created, so no change is missed.
        False, with a warning, if this Ray cannot be followed: deaths of idle actors are then
        noticed only when a call to them fails."""
        address = _ray.gcs_address()
        if address is None:
            log.warning("actormesh: cannot follow actor states (no GCS address); deaths of idle "
                        "actors will be noticed only when a call to them fails")
            return False
        try:
            _loop.submit(self._start(address)).result(timeout_s)
        except Exception as err:  # noqa: BLE001 - reported, then the mesh works without it
            log.warning("actormesh: cannot follow actor states on the GCS at %s (%s); deaths of "
                        "idle actors will be noticed only when a call to them fails", address, err)
            return False
        return True

    async def _start(self, address: str) -> None:
        if self._address == address and self._task is not None and not self._task.done():
            return
        if self._task is not None:
            self._task.cancel()
        subscriber = await _ray.subscribe(address)
        self._address = address
        self._task = asyncio.get_running_loop().create_task(self._follow(subscriber, address))

    async def _follow(self, subscriber: Any, address: str) -> None:
        idle_polls = 0
        try:
            while _ray.connected():  # ray.shutdown() ends the cluster and this subscription
                try:
                    notices = await _ray.poll(subscriber)
                except Exception as err:  # noqa: BLE001 - the GCS went away: retry, slowly
                    log.debug("actormesh: actor channel poll failed: %s", err)
                    notices = []
                if not notices:
                    # An empty batch means the poll ended without news (the GCS restarted or
                    # this process left the cluster); back off instead of spinning.
                    idle_polls += 1
                    await asyncio.sleep(min(0.05 * idle_polls, 1.0))
                    continue
                idle_polls = 0
                for actor_id, state, epoch, reason in notices:
                    self._deliver(actor_id, state, epoch, reason)
        finally:
            if self._address == address:
                self._address = None
            try:
                await subscriber.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass

    def _deliver(self, actor_id: bytes, state: int, epoch: int, reason: str) -> None:
        for ref, index in self._watched.get(actor_id, ()):
            failures = ref()
            if failures is None:
                continue
            try:
                failures.on_state(index, state, epoch, reason)
            except Exception:
                log.exception("actormesh: handling the state of an actor failed")

    def watch(self, failures: Failures, actor_ids: Sequence[bytes]) -> None:
        ref = weakref.ref(failures)

        def add() -> None:
            for index, actor_id in enumerate(actor_ids):
                listeners = self._watched.setdefault(actor_id, [])
                listeners[:] = [(r, i) for r, i in listeners if r() is not None]
                listeners.append((ref, index))

        _loop.post(add)

    def unwatch(self, failures: Failures, actor_ids: Sequence[bytes]) -> None:
        ref = weakref.ref(failures)

        def drop() -> None:
            for actor_id in actor_ids:
                listeners = [(r, i) for r, i in self._watched.get(actor_id, ())
                             if r() is not None and r != ref]
                if listeners:
                    self._watched[actor_id] = listeners
                else:
                    self._watched.pop(actor_id, None)

        _loop.post(drop)
