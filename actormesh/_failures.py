"""Failures: which actors of a mesh may take calls, and since which incarnation.

Deaths and restarts are learnt from Ray's GCS actor channel (`_ray.ActorStates`), which reports
every state change of every actor within milliseconds, idle or busy, and carries Ray's restart
count: the actor's *epoch*. A call records the epoch it was sent to, so a failure that arrives
late from an earlier incarnation never takes a restarted actor out again.

An actor goes through these states here (all changes on the library's loop thread):

    alive --(restarting notice, or a call found it gone)--> restarting --(alive notice)--> alive
    restarting --(dead notice, or restart_timeout_s passed)--> dead

While restarting it takes no call but stays live: a call that only it can serve waits for it in
the scheduler's queue. When it is alive again with a new epoch, `on_restart(view)` runs on the
user thread (it may call the mesh and wait: the actor answers calls sent to it directly, only
`choose` does not route to it yet), then `choose` uses it again. A hook that raises is logged,
and the actor is used again all the same: it did come back.
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

log = logging.getLogger("actormesh")

_ALIVE, _RESTARTING, _DEAD = "alive", "restarting", "dead"
_CALLABLE_POLL_S = 0.005
_CALLABLE_POLLS = 2000  # 10 s: then the hook and the calls go ahead, and fail if they must

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
        # Runs (on the user thread) when an actor is back, before `choose` uses it again.
        self.on_restart: Callable[[int], object] | None = None
        self._send_drained = send_drained
        self._fail = fail
        count = len(self._names)
        self.epochs = [0] * count  # the newest incarnation seen; read by the router per call
        self._routed = [0] * count  # the incarnation `choose` routes to
        self._status = [_ALIVE] * count
        self._timers: list[_loop.Timer | None] = [None] * count
        self._actor_ids: list[bytes] = []
        self._closed = False

    # -- what happens to an actor (loop thread) ----------------------------------------------
    def on_state(self, actor: int, state: int, epoch: int, reason: str) -> None:
        """A state notice from the GCS (or its answer to a question): apply it unless stale."""
        if self._closed or epoch < self.epochs[actor]:
            return
        self.epochs[actor] = epoch
        if state == _ray.DEAD:
            self._dead(actor, f"{self._names[actor]} died" + (f": {reason}" if reason else ""))
        elif state == _ray.RESTARTING:
            self._restarting(actor)
        elif state == _ray.ALIVE:
            if epoch > self._routed[actor]:
                self._restarting(actor)  # its restart may have been too quick to be published
                self._come_back(actor, epoch)
            elif self._status[actor] == _RESTARTING:
                self._readmit(actor, epoch)  # a call failed, but this incarnation is fine

    def lost(self, actor: int, epoch: int) -> None:
        """A call sent to incarnation `epoch` found the actor gone (Ray's completion thread):
        stop routing to it at once, and look into it on the loop thread."""
        if self._closed or epoch != self.epochs[actor] or self._status[actor] != _ALIVE:
            return
        self._scheduler.mark_dead(actor, restarting=True)
        _loop.post(self._suspect, actor, epoch)

    def _suspect(self, actor: int, epoch: int) -> None:
        """Ask the GCS what became of an actor a call found gone (its own notice usually comes
        first); until then it takes no call."""
        if self._closed or epoch != self.epochs[actor] or self._status[actor] != _ALIVE:
            return
        self._restarting(actor)
        _loop.loop().create_task(self._ask(actor))

    async def _ask(self, actor: int) -> None:
        actor_id = self._actor_ids[actor]
        try:
            state = await _ray.actor_state(actor_id)
        except Exception as err:  # noqa: BLE001 - the GCS notice will tell instead
            log.debug("actormesh: cannot read the state of %s: %s", self._names[actor], err)
            return
        if state is not None:
            self.on_state(actor, *state)

    def _restarting(self, actor: int) -> None:
        if self._status[actor] != _ALIVE:
            return
        self._status[actor] = _RESTARTING
        self._scheduler.mark_dead(actor, restarting=True)
        self._timers[actor] = _loop.call_later(
            self._restart_timeout_s, _weak(self._gave_up), actor, self.epochs[actor]
        )

    def _gave_up(self, actor: int, epoch: int) -> None:
        if self._status[actor] == _RESTARTING and self.epochs[actor] == epoch:
            self._dead(actor, f"{self._names[actor]} did not come back within "
                              f"restart_timeout_s={self._restart_timeout_s} s")

    def _dead(self, actor: int, why: str) -> None:
        self._cancel_timer(actor)
        if self._status[actor] == _DEAD:
            return
        self._status[actor] = _DEAD
        orphans = self._scheduler.mark_dead(actor)
        if orphans:
            self._fail(orphans, NoLiveActorsError(f"no live actor left to take the call ({why})"))

    def _come_back(self, actor: int, epoch: int) -> None:
        """A new incarnation answers: once this process can call it, run the hook, then route
        to it."""
        _loop.loop().create_task(self._when_callable(actor, epoch))

    async def _when_callable(self, actor: int, epoch: int) -> None:
        # The channel says "alive" a little before this process's core worker knows it, which
        # fails calls sent meanwhile ("the actor is restarting"): wait for it (a few ms).
        actor_id = self._actor_ids[actor] if actor < len(self._actor_ids) else None
        for _ in range(_CALLABLE_POLLS):
            if self._closed or self.epochs[actor] != epoch or actor_id is None \
                    or _ray.locally_alive(actor_id):
                break
            await asyncio.sleep(_CALLABLE_POLL_S)
        hook = self.on_restart
        if hook is None:
            self._readmit(actor, epoch)
            return

        def run_hook() -> None:
            try:
                hook(actor)
            finally:
                _loop.post(self._readmit, actor, epoch)

        _loop.run_user(f"on_restart of {self._names[actor]}", run_hook)

    def _readmit(self, actor: int, epoch: int) -> None:
        if self._closed or self.epochs[actor] != epoch:
            return  # it died again meanwhile: the newer notice decides
        self._cancel_timer(actor)
        self._status[actor] = _ALIVE
        self._routed[actor] = epoch
        self._send_drained(self._scheduler.mark_alive, actor)

    def _cancel_timer(self, actor: int) -> None:
        timer, self._timers[actor] = self._timers[actor], None
        if timer is not None:
            timer.cancel()

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
            if found is None:
                continue
            state, epoch, reason = found
            self.epochs[actor] = self._routed[actor] = epoch
            if state != _ray.ALIVE:
                self.on_state(actor, state, epoch, reason)

    def close(self) -> None:
        self._closed = True
        for actor in range(len(self._timers)):
            self._cancel_timer(actor)
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
            while True:
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
