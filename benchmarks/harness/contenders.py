"""The contenders of the balancing scenarios: ways of sending one call to one of N actors, each
behind the same small API.

- `MeshChoose`: actormesh's `mesh.methods.<m>.choose(...)`, one mesh per native policy, and a
  second mesh with the default policy: the A/A twin, the same contender run twice.
- `RayRandom`: `random.choice(handles).<m>.remote(...)`, what Ray's ActorMesh prototype and
  Monarch's `choose` do.
- `RayRoundRobin`: `handles[i % n].<m>.remote(...)`, raw Ray calls in turn: what a user writes by
  hand today, and the floor for per-call overhead.
- `RayActorPool`: `ray.util.ActorPool`, one call in flight per actor; an actor is freed only when
  the driver reads its result, so the pool makes progress only inside `wait`.

In the fault scenario every contender retries a call whose actor died, once: actormesh through
`options(retries=1)` (re-routed to a live actor), the baselines through Ray's own
`max_task_retries=1` (re-sent to the same actor once Ray has restarted it).

A contender reports each call's end through `on_done(token, value, error)` from whatever thread
the result arrives on. Raw calls and actormesh both use the ObjectRef completion callback, so the
two pay for the same mechanism and the latency is the one a callback-driven user would see.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util import ActorPool

import actormesh as am
from actormesh import _balancer

OnDone = Callable[[int, Any, "BaseException | None"], None]

POLICIES: tuple[str, ...] = _balancer.POLICIES  # every native policy of the library
BASELINES = ("ray-random", "ray-rr", "ActorPool")


def default_policy() -> str:
    """The policy a user gets who leaves out `balancer=`, read from `am.ActorMesh` itself."""
    default = inspect.signature(am.ActorMesh).parameters["balancer"].default
    return default.name if isinstance(default, am.Policy) else str(default)


def twin_name(policy: str) -> str:
    """The A/A twin of a policy's contender: the same policy on a second mesh."""
    return f"{policy} (A/A)"


def _method(handle: Any, name: str, retries: int) -> Any:
    """`handle.<name>`, with Ray's own retry of a call whose actor died when `retries` > 0."""
    method = getattr(handle, name)
    return method.options(max_task_retries=retries) if retries else method


def _ignore(token: int, value: Any, error: BaseException | None) -> None:
    pass


def _when_done(future: am.MeshFuture[Any], fn: Callable[[Any, BaseException | None], None]) -> None:
    """Call `fn(value, error)` when a MeshFuture settles, on the thread that settles it (Ray's
    completion thread), value read there: like for like with the raw contenders'
    `ObjectRef._on_completed`. (`MeshFuture.add_done_callback` runs user code on the library's
    user thread instead, one hop later; a timing harness must not measure that hop against Ray's
    own callback.)"""
    future._future.add_done_callback(lambda _: fn(*_outcome(future)))


def _outcome(future: am.MeshFuture[Any]) -> tuple[Any, BaseException | None]:
    try:
        return future.get(timeout=0), None
    except Exception as error:  # the call's own error, reported as an outcome
        return None, error


class Contender:
    """One way to route calls. Subclasses implement `submit`; `wait` lets the driver idle."""

    name: str = ""
    label: str = ""
    family: str = "baseline"  # "actormesh", or "aa" for the A/A twin (neither side of a ratio)

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)
        self.on_done: OnDone = _ignore
        self.deadline = math.inf

    def begin(self, on_done: OnDone, *, deadline: float, retries: int = 0) -> None:
        """Start a run: results go to `on_done`. Calls carry `deadline` (a `time.time()` value
        after which the actor skips them); `retries` is how many times a call whose actor died
        runs again."""
        self.on_done = on_done
        self.deadline = deadline

    def submit(self, token: int, method: str, duration_s: float) -> None:
        raise NotImplementedError

    def wait(self, seconds: float) -> None:
        """Let time pass (the driver has nothing to send for `seconds`)."""
        if seconds > 0:
            time.sleep(seconds)

    def settle(self, timeout: float) -> bool:
        """After the run: wait (unrecorded) until every call sent has ended; False on timeout.

        Nothing is cancelled: `ray.cancel` of a queued call to a synchronous actor leaves a gap in
        the actor's call sequence that stalls its next calls for 30 s. The deadline each call
        carries makes a leftover backlog drain quickly instead.
        """
        return True

    def end(self) -> None:
        """After `settle`: drop what the run held (results, futures, refs)."""
        self.on_done = _ignore


class MeshChoose(Contender):
    def __init__(self, mesh: am.ActorMesh[Any], name: str, label: str,
                 family: str = "actormesh") -> None:
        super().__init__(mesh.actors)
        self.mesh = mesh
        self.name = name
        self.label = label
        self.family = family
        self._choose: dict[str, Any] = {}
        self._futures: list[am.MeshFuture[Any]] = []

    def begin(self, on_done: OnDone, *, deadline: float, retries: int = 0) -> None:
        super().begin(on_done, deadline=deadline, retries=retries)
        methods = self.mesh.methods
        self._choose = {
            m: getattr(methods, m).options(retries=retries).choose if retries
            else getattr(methods, m).choose
            for m in ("work", "spin", "noop")
        }
        self._futures = []

    def submit(self, token: int, method: str, duration_s: float) -> None:
        choose = self._choose[method]
        future = (choose(token) if method == "noop"
                  else choose(token, duration_s, self.deadline))
        self._futures.append(future)
        _when_done(future, lambda value, error: self.on_done(token, value, error))

    def end(self) -> None:
        super().end()
        self._futures = []

    def settle(self, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        for future in self._futures:
            try:
                future.get(timeout=max(0.0, deadline - time.perf_counter()))
            except TimeoutError:
                return False
            except Exception:  # the call failed: it has ended
                pass
        return True


class FreshMesh(MeshChoose):
    """The default policy through a mesh made anew over the same actors before each turn: what
    the default's mesh would do had nothing run on it before (its estimates, batch sizes and
    holds start from nothing). Against the default's own mesh, after the other scenarios, it
    shows whether what ran before still weighs on it."""

    FRESH = "fresh mesh"

    def __init__(self, mesh: am.ActorMesh[Any]) -> None:
        super().__init__(am.ActorMesh.from_actors(mesh.actors), self.FRESH,
                         "actormesh, the default balancer, a mesh made anew before each turn",
                         family="actormesh")
        self._handles = list(mesh.actors)

    def begin(self, on_done: OnDone, *, deadline: float, retries: int = 0) -> None:
        self.mesh.shutdown()
        self.mesh = am.ActorMesh.from_actors(self._handles)
        super().begin(on_done, deadline=deadline, retries=retries)

    def shutdown(self) -> None:
        self.mesh.shutdown()


class _Handles(Contender):
    """Raw Ray calls on handles; the subclass decides which handle gets each call."""

    def __init__(self, handles: Sequence[Any]) -> None:
        super().__init__(handles)
        self._methods: dict[str, list[Any]] = {}
        self._refs: list[Any] = []

    def begin(self, on_done: OnDone, *, deadline: float, retries: int = 0) -> None:
        super().begin(on_done, deadline=deadline, retries=retries)
        # Bound methods looked up once, as actormesh's router caches them.
        self._methods = {m: [_method(h, m, retries) for h in self.handles]
                         for m in ("work", "spin", "noop")}
        self._refs = []

    def pick(self, token: int) -> int:
        raise NotImplementedError

    def submit(self, token: int, method: str, duration_s: float) -> None:
        remote = self._methods[method][self.pick(token)]
        ref = (remote.remote(token) if method == "noop"
               else remote.remote(token, duration_s, self.deadline))
        self._refs.append(ref)
        ref._on_completed(lambda result: self._done(token, result))

    def _done(self, token: int, result: Any) -> None:
        if isinstance(result, BaseException):
            self.on_done(token, None, result)
        else:
            self.on_done(token, result, None)

    def end(self) -> None:
        super().end()
        self._refs = []

    def settle(self, timeout: float) -> bool:
        if not self._refs:
            return True
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=timeout,
                            fetch_local=False)
        return len(ready) == len(self._refs)


class RayRandom(_Handles):
    name = "ray-random"
    label = "random.choice + .remote() (Ray ActorMesh prototype, Monarch)"

    def __init__(self, handles: Sequence[Any], seed: int = 0) -> None:
        super().__init__(handles)
        self._rng = random.Random(seed)

    def pick(self, token: int) -> int:
        return self._rng.randrange(len(self.handles))


class RayRoundRobin(_Handles):
    name = "ray-rr"
    label = "raw .remote() in turn (hand-written round robin)"

    def __init__(self, handles: Sequence[Any]) -> None:
        super().__init__(handles)
        self._next = 0

    def pick(self, token: int) -> int:
        i = self._next
        self._next = (i + 1) % len(self.handles)
        return i


class RayActorPool(Contender):
    name = "ActorPool"
    label = "ray.util.ActorPool"

    def __init__(self, handles: Sequence[Any]) -> None:
        super().__init__(handles)
        self._pool = ActorPool(self.handles)
        self._retries = 0
        self._calls: dict[str, Callable[[Any, Any], Any]] = {
            "work": lambda a, v: self._sent(v[0], self._m(a, "work").remote(v[0], v[1],
                                                                         self.deadline)),
            "spin": lambda a, v: self._sent(v[0], self._m(a, "spin").remote(v[0], v[1],
                                                                         self.deadline)),
            "noop": lambda a, v: self._sent(v[0], self._m(a, "noop").remote(v[0])),
        }
        self._tokens: dict[Any, int] = {}  # ObjectRef -> token, while the pool holds it

    def begin(self, on_done: OnDone, *, deadline: float, retries: int = 0) -> None:
        super().begin(on_done, deadline=deadline, retries=retries)
        self._pool = ActorPool(self.handles)  # a fresh pool: a dead actor leaves a pool for good
        self._retries = retries
        self._tokens = {}

    def _m(self, actor: Any, name: str) -> Any:
        return _method(actor, name, self._retries)

    def _sent(self, token: int, ref: Any) -> Any:
        self._tokens[ref] = token
        return ref

    def _returned(self, error: BaseException) -> None:
        """The pool raised a call's error without saying which call: it is the ref it let go."""
        held = self._pool._future_to_actor
        for ref in [r for r in self._tokens if r not in held]:
            self.on_done(self._tokens.pop(ref), None, error)

    def submit(self, token: int, method: str, duration_s: float) -> None:
        self._pool.submit(self._calls[method], (token, duration_s))

    def wait(self, seconds: float) -> None:
        deadline = time.perf_counter() + max(seconds, 0.0)
        while True:
            left = deadline - time.perf_counter()
            if not self._pool.has_next():
                if left > 0:
                    time.sleep(left)
                return
            try:
                value = self._pool.get_next_unordered(timeout=max(left, 0.0))
            except TimeoutError:
                return
            except ray.exceptions.RayError as error:
                self._returned(error)
            else:
                self._tokens = {r: t for r, t in self._tokens.items() if t != value[0]}
                self.on_done(value[0], value, None)
            if time.perf_counter() >= deadline:
                return

    def settle(self, timeout: float) -> bool:
        self._pool._pending_submits.clear()  # never sent to an actor: nothing to wait for
        deadline = time.perf_counter() + timeout
        while self._pool.has_next():
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            try:
                self._pool.get_next_unordered(timeout=left)
            except TimeoutError:
                return False
            except ray.exceptions.RayError:
                pass
        return True
