"""`am.ActorPool`: the interface of `ray.util.ActorPool` over an actor mesh and its balancer.

    pool.submit(fn, value)                 a task, numbered in the order of results
      _route: Router.route(Call(fn=_send)) the mesh's balancer picks an actor with a free
                                           slot, or the call waits in the native queue
        pool._send(handle, task)           fn(handle, value): the user's own Ray call
      ... Ray's completion thread frees the slot, settles the call's future:
      pool._ended(task, call)              a death with retries left: routed again (loop
                                           thread); otherwise the task is done
      pool._post_sends(send)               the queued calls the freed slot went to are sent
                                           by the reader, if one waits, else the loop thread
    pool.get_next() / get_next_unordered() waits for a done task (sending what it is handed
                                           meanwhile), then ray.get of its refs

Membership changes (`pop_idle`, `push`) start a new *generation*: a mesh over the new set of
actors (a scheduler has a fixed number of actors). Calls still queued in the old one move to
the new one; calls running on an actor that stays hold a slot in the new scheduler until they
end, so no actor gets more than `max_in_flight` calls across generations. Only the newest
generation routes calls; an old one only ends the calls it sent.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from . import _loop, _ray
from ._balancer import Balancer, BalancerSpec, Policy
from ._bulk import check_timeout
from ._calls import Call, Result
from ._mesh import ActorMesh

log = logging.getLogger("actormesh")

T = TypeVar("T")
V = TypeVar("V")

_METHOD = "ActorPool.submit"  # how errors name a pool's call
_LOST = (_ray.DIED, _ray.UNAVAILABLE)  # outcomes after which a call may run again elsewhere
_ANY = -1  # `_awaited` when a reader waits for whichever task is done first


class _Task:
    """One submission: its place in the order of results, what to call, and its current call."""

    __slots__ = ("index", "fn", "value", "retries", "call", "slot_gen", "done", "dropped",
                 "send_error")

    def __init__(self, index: int, fn: Callable[[Any, Any], Any], value: Any,
                 retries: int) -> None:
        self.index = index
        self.fn = fn
        self.value = value
        self.retries = retries  # runs left after a death
        self.call: Call | None = None  # None while the pool has no actor to route to
        self.slot_gen: _Generation | None = None  # the generation counting its call's slot
        self.done = False  # its last call has ended: the result can be read
        self.dropped = False  # nobody will read it (ignore_if_timedout, a new map)
        self.send_error: BaseException | None = None  # what `fn` raised, if it did


def _run_all(sends: list[Callable[[], None]]) -> None:
    """Run the sends handed to a thread; each goes, whatever the one before it did."""
    for i, send in enumerate(sends):
        try:
            send()
        except Exception:  # noqa: BLE001 - a bug: the router fails the calls it cannot send
            log.exception("actormesh: sending the queued calls of an ActorPool failed")
        except BaseException:  # KeyboardInterrupt, say: the rest go from the loop thread
            if i + 1 < len(sends):
                _loop.post(_run_all, sends[i + 1:])
            raise


class _Generation:
    """The pool's mesh over its actors as they are between two membership changes."""

    __slots__ = ("mesh", "target", "router", "scheduler", "handles", "index")

    def __init__(self, handles: list[ActorHandle[Any]], balancer: BalancerSpec,
                 max_in_flight: int, post_sends: Callable[[Callable[[], None]], None]) -> None:
        # `fn` makes each Ray call itself: the pool cannot send calls together (coalesce=1).
        self.mesh: ActorMesh[Any] = ActorMesh.from_actors(
            handles, balancer=balancer, max_in_flight=max_in_flight, coalesce=1,
            name="ActorPool")
        self.target = self.mesh._target  # the whole mesh, which every call is routed in
        self.router = self.target.router
        self.router.post_sends = post_sends
        self.scheduler = self.router.scheduler
        self.handles = handles
        self.index = {_ray.actor_id(h): i for i, h in enumerate(handles)}

    def free(self) -> bool:
        """Nothing waits for a slot and some live actor has one."""
        scheduler = self.scheduler
        if scheduler.queued():
            return False
        slots = scheduler.max_in_flight or math.inf
        return any(status == "alive" and n < slots
                   for n, status in zip(scheduler.in_flight(), scheduler.status()))

    def retire(self) -> None:
        """Route nothing more (its calls in flight still end normally); leave the actors'
        state notices to the newest generation."""
        self.mesh.shutdown()


class ActorPool(Generic[T]):
    """`ray.util.ActorPool`, method for method, on an actor mesh: change the import and code
    written for Ray's pool runs the same, plus what Ray's lacks.

    `fn(actor, value)` makes a Ray call on the actor it is given and returns its ObjectRef (a
    list of them for `num_returns > 1`), as with Ray's pool. Results come back in submission
    order (`get_next`, `map`) or as they complete (`get_next_unordered`, `map_unordered`);
    `map` and `map_unordered` drop the results nobody read, then submit every value at once.

    Beyond Ray's pool:
    - An actor that dies leaves the pool: its call raises `am.ActorDiedError` (with
      `retries=n`, it runs again on another actor, up to n times), calls that no live actor is
      left to take raise `am.NoLiveActorsError`; nothing hangs.
    - `max_in_flight=k`: each actor holds up to k calls (1, the default, is Ray's pool).
    - `balancer`: the mesh's native balancer picks among the actors with a free slot ("pull",
      the default, takes the least loaded; "sed" prefers the faster actors).
    - Timeouts work for calls with several returns, and with `get_next_unordered`.

    Differences, all of them deliberate:
    - An actor's slot is freed when its call ends, not when its result is read: a finished
      call never keeps its actor from work. So `has_free` and `pop_idle` may see an actor
      free before its result is read; queued submissions go out as slots free, from the
      thread waiting in `get_next` / `get_next_unordered` (or `map`'s iterator) if one is,
      else from the library's loop thread: `fn` runs on your thread or on that one.
    - `has_free()`: some live actor has a free slot and no submission waits for one.
      `pop_idle()` returns an actor with no call at all (and takes it out), else None.
    - A result you drop (`ignore_if_timedout=True`, the leftovers a new `map` drops) is never
      read: a call not yet sent is taken out of the queue; one already running finishes on
      its actor and only then frees its slot (Ray's pool frees the actor at once, so the
      next call waits behind the dropped one). Dropping leftovers never raises their errors.
    - A method that raised reaches you as Ray raises it (`ray.exceptions.RayTaskError`, also
      an instance of the method's exception class); a dead actor as `am.ActorDiedError`.
    - A pool with no actor at all (emptied with `pop_idle`) keeps submissions until `push`
      gives it one, as Ray's does; as in Ray's, they are no pending results until then
      (`has_next()` is False, `get_next` raises StopIteration).

    Like Ray's pool, it is meant to be driven from one thread.
    """

    def __init__(self, actors: Iterable[ActorHandle[T]], *, balancer: BalancerSpec = "pull",
                 max_in_flight: int = 1, retries: int = 0) -> None:
        handles = list(actors)
        for handle in handles:
            if not isinstance(handle, ActorHandle):
                raise TypeError(f"ActorPool takes Ray actor handles, got {handle!r}")
        if len({_ray.actor_id(h) for h in handles}) != len(handles):
            raise ValueError("ActorPool: the same actor is given twice")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) \
                or max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight!r}: must be an int >= 1")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries={retries!r}: must be an int >= 0")
        # Checked before any mesh is made: the pool may start empty, and make its first mesh
        # only at `push`.
        if isinstance(balancer, str):
            Policy(balancer)  # raises ValueError naming an unknown policy
        elif not isinstance(balancer, (Policy, Balancer)):
            raise TypeError(f"balancer={balancer!r}: must be a policy name, an am.Policy or an "
                            "am.Balancer")
        self._balancer: BalancerSpec = balancer
        self._max_in_flight = max_in_flight
        self._retries = retries
        # `_lock`: which generation routes, and the calls moving between generations. Never
        # taken on Ray's completion thread. `_cond`: the tasks and which of them are done, and
        # the sends handed to the reader; taken there, briefly. Order: `_lock`, then `_cond`.
        self._lock = threading.RLock()
        self._cond = threading.Condition()
        # The task a reader waits for (_ANY: any of them); None while no reader waits. While one
        # waits, the sends of queued calls that slots freed for are handed to it rather than to
        # the loop thread: it is woken for its results anyway, and a wake-up of another thread
        # per call cost more driver CPU than Ray's pool spends on a call.
        self._awaited: int | None = None
        self._sends: list[Callable[[], None]] = []
        self._gen = self._generation(handles) if handles else None
        self._unrouted: list[_Task] = []  # submitted while the pool had no actor
        self._tasks: dict[int, _Task] = {}  # submitted, result not yet returned or dropped
        self._finished: dict[int, _Task] = {}  # of those, the done ones, in completion order
        self._live: dict[int, _Task] = {}  # every task whose call has not ended, dropped too
        self._next_index = 0
        self._next_return = 0

    def _generation(self, handles: list[ActorHandle[Any]]) -> _Generation:
        return _Generation(handles, self._balancer, self._max_in_flight, self._post_sends)

    # -- submitting --------------------------------------------------------------------------
    def submit(self, fn: Callable[[ActorHandle[T], V], Any], value: V) -> None:
        """Schedule `fn(actor, value)` on an actor with a free slot, now or when one frees.
        If `fn` runs at once and raises, so does `submit` (the task is not kept)."""
        if not callable(fn):
            raise TypeError(f"submit needs fn(actor, value) -> ObjectRef, got {fn!r}")
        task = _Task(self._next_index, fn, value, self._retries)
        with self._cond:
            self._tasks[task.index] = task
            self._live[task.index] = task
        self._next_index += 1
        with self._lock:
            self._route(task)
        error = task.send_error
        if error is not None:  # as Ray's pool: fn's error, raised where fn ran, takes no place
            with self._cond:
                self._tasks.pop(task.index, None)
                self._finished.pop(task.index, None)
                self._live.pop(task.index, None)
            self._next_index -= 1
            raise error

    def _route(self, task: _Task) -> None:
        """Route `task` in the newest generation, or keep it until there is one (`_lock` held)."""
        gen = self._gen
        if gen is None:
            task.call = None
            self._unrouted.append(task)
            return
        call = Call(gen.router, _METHOD, (task,), {}, target=gen.target, fn=self._send)
        task.call, task.slot_gen = call, gen
        call.future.add_done_callback(functools.partial(self._ended, task, call))
        gen.router.route(call)

    def _send(self, handle: ActorHandle[T], task: _Task) -> Any:
        """The call's `fn`, run by the router once it has picked `handle` (caller's or loop
        thread): the user's fn, after making sure the newest generation counts the slot."""
        if task.slot_gen is not self._gen:
            with self._lock:
                gen = self._gen
                if task.slot_gen is not gen and gen is not None and task.call is not None:
                    self._carry(gen, task.call)
                task.slot_gen = gen
        try:
            return task.fn(handle, task.value)
        except BaseException as err:
            task.send_error = err
            raise

    @staticmethod
    def _carry(gen: _Generation, call: Call) -> None:
        """Count `call`, sent by an older generation, in `gen` until it ends (`_lock` held)."""
        actor = gen.index.get(_ray.actor_id(call.router.handles[call.actor]))
        if actor is None:  # its actor left the pool
            return
        gen.scheduler.acquire(actor)
        call.future.add_done_callback(lambda _: gen.router._give_back(actor))

    def _ended(self, task: _Task, call: Call, future: Result[Any]) -> None:
        """The call's future settled (Ray's completion thread, or wherever it failed)."""
        try:
            if call is not task.call:
                return
            if (task.retries and not task.dropped and call.outcome in _LOST
                    and future.exception() is None):
                task.retries -= 1
                _loop.post(self._resubmit, task)
                return
        except BaseException:  # never leave a task unfinished
            log.exception("actormesh: ending a call of an ActorPool failed")
        self._finish(task)

    def _finish(self, task: _Task) -> None:
        with self._cond:
            task.done = True
            self._live.pop(task.index, None)
            if not task.dropped:
                self._finished[task.index] = task
                if self._awaited == task.index or self._awaited == _ANY:
                    self._cond.notify()  # only the reader: a wake-up per result, not per call

    def _resubmit(self, task: _Task) -> None:
        """Route a task whose actor died again, in the newest generation (loop thread)."""
        with self._lock:
            if task.dropped:
                self._finish(task)
            else:
                self._route(task)

    # -- results -----------------------------------------------------------------------------
    def has_next(self) -> bool:
        """Whether some submitted result has not been returned yet, as Ray's pool counts them:
        not a submission still waiting for the pool to have an actor at all (after `pop_idle`
        took the last one), which comes once an actor is pushed."""
        if not self._unrouted:
            return bool(self._tasks)
        return any(task.call is not None for task in self._tasks.values())

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order, waiting up to `timeout` s (None: for ever).

        Raises StopIteration when nothing is pending, ValueError after `get_next_unordered`
        has returned a later result, TimeoutError on timeout; with `ignore_if_timedout` the
        timed-out result is dropped first (the next call returns the one after it).
        """
        check_timeout(timeout)
        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return >= self._next_index:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        task = self._tasks[self._next_return]
        with self._cond:
            done = self._wait(task.index, lambda: task.done, timeout)
            if done:
                del self._tasks[task.index]
                self._finished.pop(task.index, None)
        if not done:
            return self._timed_out(task, timeout, ignore_if_timedout)
        self._next_return += 1
        return self._read(task)

    def get_next_unordered(self, timeout: float | None = None,
                           ignore_if_timedout: bool = False) -> Any:
        """Any next result, the first to complete, waiting up to `timeout` s (None: for ever).

        Raises StopIteration when nothing is pending and TimeoutError on timeout; with
        `ignore_if_timedout` the oldest pending result is dropped first.
        """
        check_timeout(timeout)
        if not self.has_next():
            raise StopIteration("No more results to get")
        with self._cond:
            task = None
            found = self._wait(_ANY, lambda: bool(self._finished), timeout)
            if found:
                index = next(iter(self._finished))
                task = self._finished.pop(index)
                del self._tasks[index]
        if task is None:
            return self._timed_out(self._tasks[next(iter(self._tasks))], timeout,
                                   ignore_if_timedout)
        self._next_return = max(self._next_return, task.index + 1)
        return self._read(task)

    def _wait(self, awaited: int, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (`_cond` held) until `done()` or `timeout` s; meanwhile send what is handed to
        this thread (`_post_sends`). Nothing handed is left behind when it returns."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._awaited = awaited
        try:
            while True:
                if self._sends:
                    sends, self._sends = self._sends, []
                    self._cond.release()
                    try:
                        _run_all(sends)
                    finally:
                        self._cond.acquire()
                    continue
                if done():
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        finally:
            self._awaited = None
            sends, self._sends = self._sends, []
            if sends:  # handed over while this thread stopped waiting: the loop thread's now
                _loop.post(_run_all, sends)

    def _post_sends(self, send: Callable[[], None]) -> None:
        """Where the pool's router hands the sending of queued calls that freed slots went to
        (Ray's completion thread): to the waiting reader, else to the loop thread."""
        with self._cond:
            if self._awaited is not None:
                self._sends.append(send)
                self._cond.notify()
                return
        _loop.post(send)

    def _timed_out(self, task: _Task, timeout: float | None, ignore: bool) -> Any:
        message = f"Timed out waiting for result (timeout={timeout} s)"
        if not ignore:
            raise TimeoutError(message)
        self._next_return = max(self._next_return, task.index + 1)
        self._drop([task])
        raise TimeoutError(f"{message}. The task {task.index} has been ignored.")

    @staticmethod
    def _read(task: _Task) -> Any:
        """The result of a done task: `ray.get` of what fn returned, or the call's error."""
        call = task.call
        assert call is not None  # a done task was routed
        error = call.future.exception()
        if error is not None:
            raise error
        sent, _ = call.future.result()  # the Ray task that carried it
        try:
            return _ray.get(sent.out)
        except RayActorError as err:
            raise call.error(err) from None

    def _drop(self, tasks: list[_Task]) -> None:
        """Nobody will read these results: calls still queued are taken out unsent."""
        with self._cond:
            for task in tasks:
                task.dropped = True
                self._tasks.pop(task.index, None)
                self._finished.pop(task.index, None)
        with self._lock:
            unsent: list[_Task] = []
            for task in tasks:
                call = task.call
                if call is None:
                    unsent.append(task)
                # The scheduler says atomically whether the call was still queued; if it was
                # just given a slot, it runs and frees the slot when it ends.
                elif call.ticket and call.router.scheduler.cancel(call.ticket):
                    call.fail(cf.CancelledError(f"{_METHOD}: task {task.index} was dropped"))
            if unsent:
                self._unrouted = [t for t in self._unrouted if not t.dropped]
                for task in unsent:
                    self._finish(task)

    # -- map -------------------------------------------------------------------------------
    def map(self, fn: Callable[[ActorHandle[T], V], Any], values: Iterable[V]) -> Iterator[Any]:
        """Drop every result not yet read, submit `fn(actor, value)` for every value at once,
        and return an iterator over the results in order (it stops at the first error)."""
        self._drop_leftovers()
        for value in values:
            self.submit(fn, value)
        return self._results(self.get_next)

    def map_unordered(self, fn: Callable[[ActorHandle[T], V], Any],
                      values: Iterable[V]) -> Iterator[Any]:
        """As `map`, the results as they complete."""
        self._drop_leftovers()
        for value in values:
            self.submit(fn, value)
        return self._results(self.get_next_unordered)

    def _results(self, get: Callable[[], Any]) -> Iterator[Any]:
        while self.has_next():
            yield get()

    def _drop_leftovers(self) -> None:
        self._drop(list(self._tasks.values()))
        self._next_return = self._next_index

    # -- the actors ------------------------------------------------------------------------
    def has_free(self) -> bool:
        """Whether a submission now would start at once: a live actor has a free slot and no
        submission waits for one."""
        gen = self._gen
        return gen is not None and not self._unrouted and gen.free()

    def pop_idle(self) -> ActorHandle[T] | None:
        """Take an actor with no call in flight out of the pool and return it; None if
        `has_free()` is False or every actor has a call."""
        with self._lock:
            gen = self._gen
            # An idle live actor has a free slot: only waiting submissions make it unavailable.
            if gen is None or self._unrouted or gen.scheduler.queued():
                return None
            in_flight, status = gen.scheduler.in_flight(), gen.scheduler.status()
            idle = [i for i, (n, s) in enumerate(zip(in_flight, status)) if s == "alive" and not n]
            if not idle:
                return None
            actor = idle[-1]
            # Out of rotation now: no call may reach it before the next generation exists.
            gen.scheduler.mark_dead(actor, restarting=True)
        self._switch([h for i, h in enumerate(gen.handles) if i != actor and status[i] != "dead"])
        popped: ActorHandle[T] = gen.handles[actor]
        return popped

    def push(self, actor: ActorHandle[T]) -> None:
        """Add an actor to the pool; submissions waiting for a slot may start on it at once.
        Raises ValueError if it belongs to the pool already."""
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"push takes a Ray actor handle, got {actor!r}")
        gen = self._gen
        if gen is None:
            self._switch([actor])
            return
        if _ray.actor_id(actor) in gen.index:
            raise ValueError("Actor already belongs to current ActorPool")
        status = gen.scheduler.status()
        self._switch([h for h, s in zip(gen.handles, status) if s != "dead"] + [actor])

    def _switch(self, handles: list[ActorHandle[Any]]) -> None:
        """Make `handles` the pool's actors: a new generation takes over the routing."""
        # Made before `_lock` is taken: it waits on the loop thread, which may need the lock.
        new = self._generation(handles) if handles else None
        with self._lock:
            # Newest first, so that a call sent meanwhile by an old generation either sees the
            # change in `_send` or has its actor set when the loop below looks at it.
            old, self._gen = self._gen, new
            moved = [] if old is None else [d.payload.args[0] for d in old.scheduler.take_queued()]
            waiting = sorted(moved + self._unrouted, key=lambda t: t.index)
            self._unrouted = []
            if new is not None:
                with self._cond:
                    live = list(self._live.values())
                moving = {id(t) for t in moved}
                for task in live:
                    call = task.call
                    if id(task) in moving or call is None or call.actor < 0 or call.future.done():
                        continue  # routed below, or holding no slot (a queued call being sent
                        # by an old generation is counted by `_send`)
                    if task.slot_gen is not new:
                        self._carry(new, call)
                        task.slot_gen = new
            for task in waiting:
                self._route(task)
        if old is not None:
            old.retire()
        log.debug("actormesh: ActorPool now has %d actors (%d calls moved)", len(handles),
                  len(waiting))

    def __repr__(self) -> str:
        gen = self._gen
        return f"ActorPool({len(gen.handles) if gen else 0} actors, {len(self._tasks)} pending)"
