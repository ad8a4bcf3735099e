"""Choosing a balancer: built-in native policies by name or `Policy(...)`, or a Python `Balancer`.

Every choice is made by the native scheduler in `actormesh._native`; a Python `Balancer` plugs in
as its `external` policy, called back with the live candidates that have a free slot.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import math
import random
import threading
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Literal, cast

from . import _native

PolicyName = Literal["random", "round_robin", "pow2", "least_loaded", "pull", "sed", "adaptive"]
POLICIES: tuple[str, ...] = ("random", "round_robin", "pow2", "least_loaded", "pull", "sed",
                             "adaptive")

DEFAULT_BALANCER: PolicyName = "adaptive"
"""The policy of every mesh whose `balancer=` is left out (`ActorMesh`, `from_actors`)."""

DEFAULT_COALESCE = 64
"""At most this many calls that waited for one actor ride one Ray task, unless `coalesce=`."""


@dataclasses.dataclass(frozen=True)
class ActorLoad:
    """One candidate actor as a `Balancer` sees it."""

    rank: int
    in_flight: int
    mean_latency_s: float  # moving average of service time; NaN until first measured
    alive: bool = True
    restarting: bool = False  # not alive, but coming back: calls only it can take wait for it
    ejected: bool = False  # failed several calls in a row: passed over for a while
    others: int = 0  # of `in_flight`, the calls of other drivers (a mesh several drivers share)


class Balancer(abc.ABC):
    """A routing policy written in Python. Pass an instance as `ActorMesh(..., balancer=)`.

    `pick` runs inside the native scheduler, under its lock, on the thread that makes the call
    or on the library's loop thread (for calls that waited for a slot): keep it short, and do
    not call the mesh from it (that would wait for the lock it holds).

    A balancer that routes by key itself (cache-aware routing) sets `routes_by_key = True`: the
    native stickiness is then off, and `pick` sees every keyed call with its key.
    """

    routes_by_key: ClassVar[bool] = False

    @abc.abstractmethod
    def pick(self, loads: Sequence[ActorLoad], affinity: Hashable | None) -> int:
        """Return an index into `loads`: the live candidates with a free slot, in rank order,
        `.rank` being the rank in the (sub-)mesh called (as in `mesh.load()` and results).
        `affinity` is the call's key exactly as given to `options(affinity=...)`."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A built-in native policy with its settings (`balancer="sed"` is `Policy("sed")`).

    `max_in_flight` bounds calls per actor (default: unbounded, 1 for "pull"); `prefetch` adds
    slots to "pull" so an actor never idles for a round trip between very short calls.

    `max_tasks` bounds the Ray tasks per actor (default: unbounded; 2 for "adaptive" over actors
    that run one call at a time, unbounded over asyncio or threaded actors, where a call may
    wait for another that a bound would hold back): calls
    that find no actor with a free task slot wait in the mesh's queue, and ride together (see
    `ActorMesh(coalesce=)`) when a slot frees. A task beyond an actor's first waits behind the
    running one, hiding the round trip, so it is sent (over actors that run one call at a
    time; over asyncio or threaded ones it runs beside the first, whenever `max_tasks` allows)
    only while the actor's calls are measured shorter than `pipeline_s` (or take the same time
    each), or, with `pipeline_backlog`, while twice as many calls wait in the mesh's queue as
    the (sub-)mesh has actors: each waits through several ends then anyway, and an actor that
    starts the next call without idling for the round trip drains the queue sooner (never
    behind an actor measured slower than the others, and only while the method's calls take
    about the same time each: its 90th percentile within 2× its median, which exponential
    times exceed). A call sent ahead is a
    sent call: cancelled, it still runs on an actor that runs calls in order, its result
    dropped. A batch holds as many calls as their expected service times fit in
    `batch_budget_s`, so a slow method's calls go alone and tiny ones ride by the dozen; under
    a backlog (2 calls waiting per actor) a batch may take up to 8 budgets, as the backlog's
    depth allows, and at least 2 calls, so that a method measured slow once (a service time
    measured on the driver holds each task's round trip) is measured again over several calls
    a task and its batches grow back. An actor whose speed is not known yet (new, restarted,
    back from an ejection; its first call, which may have waited for its `__init__`, does not
    count) takes its calls one per task: it may be a straggler.
    "adaptive" over actors that run one call at a time also holds a call back from a free
    straggler (an actor over `hold_ratio` times slower than the others, measured) while the
    faster actors are expected to take and finish it sooner, at most for the straggler's own
    service time (0: never hold).
    Affinity escapes to the least loaded actor when the sticky actor's in-flight count exceeds
    the minimum by more than `affinity_abs` calls and by more than `affinity_rel` times.

    Outlier ejection: an actor whose `eject_after`-th call in a row failed (raised, or its actor
    died; 0 turns this off; calls are counted, not Ray tasks: a batch with one raising call is
    one failure after successes) is passed over for `eject_base_s`, doubled each time it is
    ejected again without a success in between, up to `eject_max_s`, as long as another actor
    of the (sub-)mesh is alive and not ejected (calls wait for it): an actor that fails fast
    must not draw the traffic. Each failed call also makes its actor look slower, and an actor
    back from an ejection or a restart is measured anew (tried first).
    """

    name: PolicyName = DEFAULT_BALANCER
    max_in_flight: int | None = None
    prefetch: int = 0
    max_tasks: int | None = None
    pipeline_s: float = 0.002
    pipeline_backlog: bool = True
    batch_budget_s: float = 0.002
    hold_ratio: float = 5.0
    seed: int | None = None
    ewma_alpha: float = 0.2
    prior_s: float | None = None
    affinity_abs: int = 2
    affinity_rel: float = 1.5
    affinity_capacity: int = 65536
    eject_after: int = 5
    eject_base_s: float = 1.0
    eject_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"balancer {self.name!r}: unknown policy; choose one of {POLICIES}")
        if self.max_in_flight is not None and (
            isinstance(self.max_in_flight, bool) or self.max_in_flight < 1
        ):
            raise ValueError(f"max_in_flight={self.max_in_flight!r}: must be an int >= 1")
        if self.prefetch < 0 or (self.prefetch and self.name != "pull"):
            raise ValueError(f"prefetch={self.prefetch!r}: only for 'pull', and >= 0")
        if self.max_tasks is not None and (
            isinstance(self.max_tasks, bool) or not isinstance(self.max_tasks, int)
            or self.max_tasks < 1
        ):
            raise ValueError(f"max_tasks={self.max_tasks!r}: must be an int >= 1, or None")
        for field in ("pipeline_s", "batch_budget_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < math.inf:
                raise ValueError(f"{field}={value!r}: must be a finite number of seconds > 0")
        if not isinstance(self.pipeline_backlog, bool):
            raise ValueError(f"pipeline_backlog={self.pipeline_backlog!r}: must be True or False")
        if isinstance(self.hold_ratio, bool) or not isinstance(self.hold_ratio, (int, float)) \
                or not 0 <= self.hold_ratio < math.inf:
            raise ValueError(f"hold_ratio={self.hold_ratio!r}: must be a finite number >= 0 "
                             "(0: never hold a call back)")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha={self.ewma_alpha!r}: must be in (0, 1]")
        if self.affinity_abs < 0 or self.affinity_rel < 1 or self.affinity_capacity < 1:
            raise ValueError(
                f"affinity margins abs={self.affinity_abs!r} rel={self.affinity_rel!r} "
                f"capacity={self.affinity_capacity!r}: need abs >= 0, rel >= 1, capacity >= 1"
            )
        if isinstance(self.eject_after, bool) or not isinstance(self.eject_after, int) \
                or self.eject_after < 0:
            raise ValueError(f"eject_after={self.eject_after!r}: must be an int >= 0 (0: never)")
        if not (0 < self.eject_base_s <= self.eject_max_s < math.inf):
            raise ValueError(
                f"eject_base_s={self.eject_base_s!r}, eject_max_s={self.eject_max_s!r}: "
                "need 0 < base <= max, both finite"
            )

    def tasks(self, concurrent: bool) -> int:
        """Ray tasks per actor allowed in flight (0: unbounded) over actors that run several
        calls at once (`concurrent`) or one at a time."""
        if self.max_tasks is not None:
            return self.max_tasks
        return 2 if self.name == "adaptive" and not concurrent else 0

    def slots(self) -> int:
        """Calls per actor allowed in flight; 0 means unbounded."""
        if self.max_in_flight is not None:
            return self.max_in_flight + self.prefetch
        return 1 + self.prefetch if self.name == "pull" else 0

    def settings(self, coalesce: int, concurrent: bool,
                 at_once: bool | None = None) -> _native.SchedulerSettings:
        """The native scheduler's settings (csrc/settings.hpp): every field of this policy that
        is one, by its own name, and those that depend on the mesh (`coalesce`; `concurrent`:
        its actors may run several calls at once, in a concurrency group of their own
        included; `at_once`: they run any calls at once, asyncio or threaded, by default as
        `concurrent`) or default to something the core cannot know."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name in _native.SETTINGS and f.name != "policy"}
        derived: _native.SchedulerSettings = {
            "max_in_flight": self.slots(),
            "max_tasks": self.tasks(concurrent),
            # over actors that run calls at once a second task runs beside the first
            "pipeline_s": 0.0 if (concurrent if at_once is None else at_once) else self.pipeline_s,
            "coalesce": coalesce,
            "seed": self.seed if self.seed is not None else random.getrandbits(63),
            "prior_s": self.prior_s or 0.0,
        }
        return cast("_native.SchedulerSettings", {**own, **derived})


BalancerSpec = PolicyName | Policy | Balancer


def make_scheduler(
    num_actors: int, spec: BalancerSpec, max_in_flight: int | None, coalesce: int = 1, *,
    concurrent: bool = False, at_once: bool | None = None,
) -> _native.Scheduler:
    """The native scheduler for one mesh, from the `balancer=`, `max_in_flight=` and
    `coalesce=` arguments; `concurrent`, `at_once`: how its actors run calls (`settings`)."""
    check_coalesce(coalesce)
    if isinstance(spec, Balancer):
        if max_in_flight is not None and (isinstance(max_in_flight, bool) or max_in_flight < 1):
            raise ValueError(f"max_in_flight={max_in_flight!r}: must be an int >= 1")
        return _native.Scheduler(
            num_actors, "pow2", max_in_flight=max_in_flight or 0, coalesce=coalesce,
            eject_after=Policy.eject_after, sticky=not spec.routes_by_key, picker=_Picker(spec),
        )
    if isinstance(spec, str):
        spec = Policy(spec)  # validated by Policy
    if not isinstance(spec, Policy):
        raise TypeError(f"balancer={spec!r}: must be a policy name, an am.Policy or an am.Balancer")
    if max_in_flight is not None:
        spec = dataclasses.replace(spec, max_in_flight=max_in_flight)
    return _native.Scheduler(num_actors, spec.name, **spec.settings(coalesce, concurrent, at_once))


def check_coalesce(coalesce: int) -> None:
    """`coalesce`, the most calls one Ray task may carry, is an int >= 1 (1: never batch)."""
    if isinstance(coalesce, bool) or not isinstance(coalesce, int) or coalesce < 1:
        raise ValueError(f"coalesce={coalesce!r}: must be an int >= 1 (1: every call alone)")


class SessionKeys:
    """Affinity keys by value: the number the native core routes each key by (it never holds
    Python objects). Keys that are equal (`1` and `1.0`) share a number, keys that are not
    (`-1` and `-2`, whose `hash()` is the same) never do. The least recently used keys beyond
    `capacity` are forgotten, as the native table forgets them, so memory stays bounded; a
    forgotten key that comes back is a new session."""

    __slots__ = ("_numbers", "_capacity", "_next", "_lock")

    def __init__(self, capacity: int) -> None:
        self._numbers: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self._capacity = max(capacity, 1)
        self._next = 0
        self._lock = threading.Lock()  # held for a few bytecodes: calls come from any thread

    def id_of(self, key: Hashable) -> int:
        with self._lock:
            number = self._numbers.get(key)
            if number is not None:
                self._numbers.move_to_end(key)
                return number
            number = self._next
            self._next += 1
            self._numbers[key] = number
            if len(self._numbers) > self._capacity:
                self._numbers.popitem(last=False)
            return number

    def __len__(self) -> int:
        return len(self._numbers)


class _Picker:
    """Adapts a `Balancer` to the native `external` policy's callback, which is shown the call
    being placed: its key as given, and the view it was made through, for view ranks."""

    def __init__(self, balancer: Balancer) -> None:
        self._balancer = balancer

    def __call__(self, actors: list[int], in_flight: list[int], latency: list[float],
                 affinity: int | None, call: Any) -> int:
        position = call.target.position
        loads = [ActorLoad(position(a), n, t) for a, n, t in zip(actors, in_flight, latency)]
        return self._balancer.pick(loads, call.key)
