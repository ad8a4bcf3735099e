"""The balancing policies in plain Python: a readable twin of the native scheduler in csrc/.

It implements the contract of csrc/API.md with the same policies, the same random stream and the
same tie-breaking, so that for one seed and one sequence of events it makes exactly the decisions
`actormesh._native.Scheduler` makes. The differential tests hold the two to that, and the
decision-cost benchmark uses it as the pure-Python baseline. Where the native core keeps heaps and
Fenwick trees to avoid scans, this file scans: read it to learn what each policy decides.

Shared rules, native and here:
- Random numbers come from SplitMix64 seeded with `seed`; `below(n)` is `(next() * n) >> 64`.
  A policy draws only when it has a choice (two or more eligible members).
- An actor is eligible in a group when it is a member, alive, and has a free slot.
- random: the k-th eligible member in rank order, k = below(count).
- round_robin: the first eligible member at or after the group's cursor, wrapping around; the
  cursor moves just past it.
- pow2: i = below(n), j = below(n - 1) bumped past i; the lower in_flight wins, a tie goes to i.
- least_loaded and pull: the fewest calls in flight, lowest rank on ties. pull is least_loaded
  with max_in_flight defaulting to 1, so the group queue is its central queue.
- sed: the least (in_flight + 1) * ewma_s, then fewer calls in flight, then lowest rank.
- adaptive: the fewest calls in flight, then the most recently sent a task, then lowest rank.
- Each actor holds at most max_tasks Ray tasks (0: unbounded), a task beyond the first only while
  its ewma_s is below pipeline_s (when that is > 0).
- affinity: the key's last actor keeps the call unless its in_flight exceeds the group's least
  loaded eligible member by more than affinity_abs AND by a factor above affinity_rel.
- A queued call leaves its queue when a slot frees in one of its group's actors; among the
  groups that can dispatch, the oldest ticket goes first.
- Coalescing: the call a drain dispatches opens a Ray task on its actor; the calls that wait for
  that actor (in any of its groups, oldest first) join the task while each may ride (neither it
  nor its method is alone), the task has fewer than `coalesce` calls, the actor a free call slot,
  and their expected service times (the method's ewma_s, or batch_budget_s / 4 unmeasured) fit
  the rest of batch_budget_s.
- Service time: a task of k calls is k samples of an equal share of its duration: the EWMA moves
  by the weight 1 - (1 - alpha)**k (alpha for one call). The method's estimate, and the actor's
  one for the pipeline rule (`low_s`), rise RISE_SLOWER times slower than they fall: samples
  taken on the driver are inflated by its own delays, never deflated.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MASK64 = (1 << 64) - 1

Picker = Callable[[list[int], list[int], list[float], "int | None"], int]


class SplitMix64:
    """Steele, Lea and Flood's SplitMix64, bit for bit as in csrc/rng.hpp."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """Uniform in [0, n) by multiply-high: one draw, no rejection."""
        return (self.next() * n) >> 64


class NoLiveActors(RuntimeError):
    """submit() on a group whose members are all dead."""


class PickerError(RuntimeError):
    """The picker raised while queued calls were being dispatched; see csrc/API.md."""

    def __init__(self, message: str, dispatched: list[Decision], failed: list[int]) -> None:
        super().__init__(message)
        self.dispatched = dispatched
        self.failed = failed


@dataclass(frozen=True)
class Decision:
    """One Ray task: its first call's ticket, its actor (-1: queued), every call's ticket."""

    ticket: int
    actor: int  # -1: queued
    tickets: tuple[int, ...] = ()  # of a batch; () for a lone call


@dataclass
class ActorLoad:
    in_flight: int = 0
    tasks: int = 0
    last_task: int = 0  # when it was last sent a task, counted in tasks sent
    alive: bool = True
    ewma_s: float | None = None  # None until the first sample
    low_s: float = 0.0  # slow to rise: for the pipeline rule
    last_end_s: float = -math.inf


@dataclass
class Method:
    alone: bool
    ewma_s: float | None = None


@dataclass(frozen=True)
class Queued:
    ticket: int
    affinity: int | None
    method: int
    alone: bool


@dataclass
class Group:
    members: list[int]  # ascending rank
    member_set: frozenset[int]
    queue: deque[Queued] = field(default_factory=deque)
    cursor: int = 0  # round_robin


POLICIES = ("random", "round_robin", "pow2", "least_loaded", "pull", "sed", "adaptive",
            "external")
UNMEASURED_BATCH = 4  # an unmeasured method's calls are expected to take budget / this
RISE_SLOWER = 8.0


def lower(estimate: float, sample: float, weight: float) -> float:
    """An EWMA step that rises RISE_SLOWER times slower than it falls."""
    return estimate + (weight if sample < estimate else weight / RISE_SLOWER) * (sample - estimate)


class Scheduler:
    def __init__(
        self,
        num_actors: int,
        policy: str = "pow2",
        *,
        max_in_flight: int = 0,
        max_tasks: int = 0,
        pipeline_s: float = 0.0,
        coalesce: int = 1,
        batch_budget_s: float = 0.002,
        seed: int = 0,
        ewma_alpha: float = 0.2,
        prior_s: float = 0.0,
        affinity_abs: int = 2,
        affinity_rel: float = 1.5,
        affinity_capacity: int = 65536,
        picker: Picker | None = None,
    ) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors {num_actors}: must be >= 1")
        if picker is not None:
            if policy not in ("external", "pow2"):
                raise ValueError(
                    f"policy {policy!r} with a picker: a picker makes the policy 'external'"
                )
            policy = "external"
        elif policy == "external":
            raise ValueError("policy 'external' needs a picker")
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight {max_in_flight}: must be >= 0 (0 = unbounded)")
        if not 0 <= seed <= MASK64:
            raise ValueError(f"seed {seed}: must be in [0, 2**64)")
        self.num_actors = num_actors
        self.policy = policy
        self.max_in_flight = 1 if policy == "pull" and max_in_flight == 0 else max_in_flight
        self.max_tasks = max_tasks
        self._pipeline_s = pipeline_s
        self.coalesce = coalesce
        self._budget_s = batch_budget_s
        self._rng = SplitMix64(seed)
        self._alpha = ewma_alpha
        self._prior_s = prior_s
        self._affinity_abs = affinity_abs
        self._affinity_rel = affinity_rel
        self._affinity_capacity = affinity_capacity
        self._picker = picker
        self._pick = {
            "random": self._pick_random,
            "round_robin": self._pick_round_robin,
            "pow2": self._pick_pow2,
            "least_loaded": self._pick_least_loaded,
            "pull": self._pick_least_loaded,  # over single slots: max_in_flight defaults to 1
            "sed": self._pick_sed,
            "adaptive": self._pick_adaptive,
            "external": self._pick_external,
        }[policy]
        self._loads = [ActorLoad() for _ in range(num_actors)]
        self._methods = [Method(alone=False)]  # method 0: any call
        self._tasks_sent = 0
        # Kept incrementally, like the native core, so that both round the mean EWMA alike.
        self._ewma_sum = 0.0
        self._measured = 0
        self._blocked = 0  # actors not eligible: when 0, every member of every group is
        self._affinity: OrderedDict[int, int] = OrderedDict()  # key -> actor, oldest first
        self._groups: list[Group] = []
        self._group_ids: dict[tuple[int, ...], int] = {}
        self._memberships: list[list[int]] = [[] for _ in range(num_actors)]
        self._queued: dict[int, int] = {}  # ticket -> group
        self._next_ticket = 1
        self.add_group(list(range(num_actors)))

    # Groups

    def add_group(self, members: list[int]) -> int:
        if not members:
            raise ValueError("group members []: must not be empty")
        for actor in members:
            self._check_actor(actor)
        ranks = sorted(members)
        for a, b in zip(ranks, ranks[1:], strict=False):
            if a == b:
                raise ValueError(f"group members: actor {a} listed twice")
        key = tuple(ranks)
        if key in self._group_ids:
            return self._group_ids[key]
        group_id = len(self._groups)
        self._groups.append(Group(ranks, frozenset(ranks)))
        self._group_ids[key] = group_id
        for actor in ranks:
            self._memberships[actor].append(group_id)
        return group_id

    def group_members(self, group: int) -> list[int]:
        return list(self._group(group).members)

    def add_method(self, alone: bool = False) -> int:
        self._methods.append(Method(alone))
        return len(self._methods) - 1

    def method_latency_s(self, method: int) -> float:
        ewma = self._method(method).ewma_s
        return math.nan if ewma is None else ewma

    # Events

    def submit(self, group: int, affinity: int | None = None, *, method: int = 0,
               alone: bool = False) -> Decision:
        """Dispatches to an eligible member, or queues when every live member is full."""
        g = self._group(group)
        self._method(method)
        key = None if affinity is None else affinity & MASK64
        if not any(self._loads[a].alive for a in g.members):
            raise NoLiveActors(f"no live actor among the {len(g.members)} actors of group {group}")
        ticket = self._next_ticket
        if not self._eligible_members(g) or g.queue:
            self._next_ticket += 1
            g.queue.append(Queued(ticket, key, method, alone))
            self._queued[ticket] = group
            return Decision(ticket, -1)
        actor = self._choose(g, key)  # a picker may raise here; nothing has changed yet
        self._next_ticket += 1
        self._add_load(actor, 1, 1)
        return Decision(ticket, actor)

    def complete(self, actor: int, started_s: float, ended_s: float, ok: bool, *,
                 calls: int = 1, method: int = 0, timed: bool = True) -> list[Decision]:
        """Ends a task of `calls` calls on `actor`, learns its service time per call, and
        dispatches what its slots free."""
        self._check_actor(actor)
        self._method(method)
        if not (math.isfinite(started_s) and math.isfinite(ended_s)):
            raise ValueError(
                f"complete(actor={actor}): started_s {started_s}, ended_s {ended_s}: times must be finite"
            )
        load = self._loads[actor]
        if not 1 <= calls <= load.in_flight or load.tasks == 0:
            raise RuntimeError(f"complete(actor={actor}, calls={calls}): {load.in_flight} calls "
                               f"in {load.tasks} tasks in flight on actor {actor}")
        was = self._eligible(actor)
        load.in_flight -= calls
        load.tasks -= 1
        if timed:
            self._record(load, started_s, ended_s, ok, calls, self._methods[method])
        self._blocked += was - self._eligible(actor)
        return self._drain(actor)

    def acquire(self, actor: int) -> None:
        self._check_actor(actor)
        self._add_load(actor, 1, 1)

    def cancel(self, ticket: int) -> bool:
        group = self._queued.pop(ticket, None)
        if group is None:
            return False
        queue = self._groups[group].queue
        queue.remove(next(call for call in queue if call.ticket == ticket))
        return True

    def mark_dead(self, actor: int) -> list[int]:
        """Stops routing to `actor`; returns the queued tickets whose group has no live member."""
        self._check_actor(actor)
        if not self._loads[actor].alive:
            return []
        self._set_alive(actor, False)
        orphaned: list[int] = []
        for group in self._memberships[actor]:
            g = self._groups[group]
            if any(self._loads[a].alive for a in g.members):
                continue
            for call in g.queue:
                orphaned.append(call.ticket)
                del self._queued[call.ticket]
            g.queue.clear()
        return sorted(orphaned)

    def mark_alive(self, actor: int) -> list[Decision]:
        self._check_actor(actor)
        if self._loads[actor].alive:
            return []
        self._set_alive(actor, True)
        return self._drain(actor)

    # Views

    def in_flight(self) -> list[int]:
        return [load.in_flight for load in self._loads]

    def mean_latency_s(self) -> list[float]:
        return [self._latency(actor) for actor in range(self.num_actors)]

    def tasks(self) -> list[int]:
        return [load.tasks for load in self._loads]

    def alive(self) -> list[bool]:
        return [load.alive for load in self._loads]

    def queued(self) -> int:
        return len(self._queued)

    # Choosing

    def _choose(self, g: Group, key: int | None) -> int:
        if key is not None:
            last = self._affinity.get(key)
            if last is not None and self._sticks(g, last):
                self._remember(key, last)
                return last
        actor = self._pick(g, self._eligible_members(g), key)
        if key is not None:
            self._remember(key, actor)
        return actor

    def _sticks(self, g: Group, actor: int) -> bool:
        """Whether an affinity key stays on `actor`: both escape margins must be exceeded to move."""
        if actor not in g.member_set or not self._eligible(actor):
            return False
        load = self._loads[actor].in_flight
        least = min(self._loads[a].in_flight for a in self._eligible_members(g))
        overloaded = load - least > self._affinity_abs and load > self._affinity_rel * least
        return not overloaded

    def _remember(self, key: int, actor: int) -> None:
        if key in self._affinity:
            self._affinity[key] = actor
            self._affinity.move_to_end(key)
            return
        if self._affinity_capacity == 0:
            return
        if len(self._affinity) == self._affinity_capacity:
            self._affinity.popitem(last=False)
        self._affinity[key] = actor

    # Policies: each picks from `eligible`, the group's eligible members in rank order (non-empty).

    def _pick_random(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        if len(eligible) == 1:
            return eligible[0]
        return eligible[self._rng.below(len(eligible))]

    def _pick_round_robin(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        n = len(g.members)
        after_cursor = ((g.cursor + step) % n for step in range(n))
        pos = next(p for p in after_cursor if self._eligible(g.members[p]))
        g.cursor = (pos + 1) % n
        return g.members[pos]

    def _pick_pow2(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        if len(eligible) == 1:
            return eligible[0]
        i = self._rng.below(len(eligible))
        j = self._rng.below(len(eligible) - 1)
        if j >= i:
            j += 1  # two distinct candidates
        a, b = eligible[i], eligible[j]
        return b if self._loads[b].in_flight < self._loads[a].in_flight else a

    def _pick_least_loaded(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        return min(eligible, key=lambda a: self._loads[a].in_flight)  # first minimum: lowest rank

    def _pick_sed(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        prior = self._prior_s if self._prior_s > 0 else self._mean_ewma_or(1.0)

        def expected_delay(actor: int) -> tuple[float, int]:
            load = self._loads[actor]
            ewma = prior if load.ewma_s is None else load.ewma_s
            return ((load.in_flight + 1) * ewma, load.in_flight)

        return min(eligible, key=expected_delay)

    def _pick_adaptive(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        return min(eligible, key=lambda a: (self._loads[a].in_flight, -self._loads[a].last_task))

    def _pick_external(self, g: Group, eligible: Sequence[int], key: int | None) -> int:
        assert self._picker is not None
        index = self._picker(
            list(eligible),
            [self._loads[a].in_flight for a in eligible],
            [self._latency(a) for a in eligible],
            key,
        )
        if not isinstance(index, int):
            raise TypeError(f"picker returned {index!r}, expected an int index into the candidates")
        if not 0 <= index < len(eligible):
            raise ValueError(
                f"picker returned index {index} for {len(eligible)} candidates "
                f"(expected 0..{len(eligible) - 1})"
            )
        return eligible[index]

    # Queues

    def _drain(self, actor: int) -> list[Decision]:
        """Dispatches queued calls while a group of `actor` has both a queue and a free slot."""
        dispatched: list[Decision] = []
        failed: list[int] = []
        error: Exception | None = None
        while True:
            ready = [
                self._groups[group]
                for group in self._memberships[actor]
                if self._groups[group].queue and self._eligible_members(self._groups[group])
            ]
            if not ready:
                break
            g = min(ready, key=lambda group: group.queue[0].ticket)
            call = g.queue.popleft()
            del self._queued[call.ticket]
            try:
                chosen = self._choose(g, call.affinity)
            except Exception as err:  # noqa: BLE001 - any picker failure fails only this call
                error = error or err
                failed.append(call.ticket)
                continue
            self._add_load(chosen, 1, 1)
            dispatched.append(self._batch(chosen, call))
        if error is not None:
            raise PickerError(
                f"picker failed on {len(failed)} queued call(s) ({type(error).__name__}: {error})",
                dispatched,
                failed,
            ) from error
        return dispatched

    def _batch(self, actor: int, first: Queued) -> Decision:
        """The task `first` opens on `actor`, with the waiting calls that ride along."""
        tickets = [first.ticket]
        if self.coalesce == 1 or not self._may_ride(first):
            return Decision(first.ticket, actor)
        budget = self._budget_s - self._expected_s(first)
        while len(tickets) < self.coalesce and self._has_call_slot(actor):
            waiting = [self._groups[group] for group in self._memberships[actor]
                       if self._groups[group].queue]
            if not waiting:
                break
            g = min(waiting, key=lambda group: group.queue[0].ticket)
            mate = g.queue[0]
            if not self._may_ride(mate) or self._expected_s(mate) > budget:
                break
            budget -= self._expected_s(mate)
            g.queue.popleft()
            del self._queued[mate.ticket]
            self._add_load(actor, 1, 0)
            if mate.affinity is not None:
                self._remember(mate.affinity, actor)
            tickets.append(mate.ticket)
        return Decision(first.ticket, actor, tuple(tickets) if len(tickets) > 1 else ())

    def _may_ride(self, call: Queued) -> bool:
        return not call.alone and not self._methods[call.method].alone

    def _expected_s(self, call: Queued) -> float:
        ewma = self._methods[call.method].ewma_s
        return self._budget_s / UNMEASURED_BATCH if ewma is None else ewma

    # Load bookkeeping

    def _has_call_slot(self, actor: int) -> bool:
        return self.max_in_flight == 0 or self._loads[actor].in_flight < self.max_in_flight

    def _eligible(self, actor: int) -> bool:
        load = self._loads[actor]
        if not load.alive or not self._has_call_slot(actor):
            return False
        if self.max_tasks == 0 or load.tasks == 0:
            return True
        short = self._pipeline_s <= 0 or (load.ewma_s is not None and load.low_s < self._pipeline_s)
        return load.tasks < self.max_tasks and short

    def _eligible_members(self, g: Group) -> Sequence[int]:
        if self._blocked == 0:  # skips the scan in the common case, keeping pow2 O(1) here too
            return g.members
        return [a for a in g.members if self._eligible(a)]

    def _add_load(self, actor: int, calls: int, tasks: int) -> None:
        was = self._eligible(actor)
        self._loads[actor].in_flight += calls
        self._loads[actor].tasks += tasks
        if tasks > 0:
            self._tasks_sent += 1
            self._loads[actor].last_task = self._tasks_sent
        self._blocked += was - self._eligible(actor)

    def _set_alive(self, actor: int, alive: bool) -> None:
        was = self._eligible(actor)
        self._loads[actor].alive = alive
        self._blocked += was - self._eligible(actor)

    def _record(self, load: ActorLoad, started_s: float, ended_s: float, ok: bool, calls: int,
                method: Method) -> None:
        """Service time per call: from the later of the task's start and the actor's previous
        completion, shared equally by its calls, each one sample."""
        sample = (ended_s - max(started_s, load.last_end_s)) / calls
        load.last_end_s = max(load.last_end_s, ended_s)
        if not ok or sample < 0:
            return
        weight = self._alpha if calls == 1 else 1.0 - (1.0 - self._alpha) ** calls
        if load.ewma_s is None:  # the first sample moves the prior like any other
            prior = self._prior_s if self._prior_s > 0 else self._mean_ewma_or(sample)
            load.ewma_s = prior + weight * (sample - prior)
            load.low_s = sample
            self._ewma_sum += load.ewma_s
            self._measured += 1
        else:
            old = load.ewma_s
            load.ewma_s = old + weight * (sample - old)
            load.low_s = lower(load.low_s, sample, weight)
            self._ewma_sum += load.ewma_s - old
        method.ewma_s = sample if method.ewma_s is None else lower(method.ewma_s, sample, weight)

    def _latency(self, actor: int) -> float:
        ewma = self._loads[actor].ewma_s
        return math.nan if ewma is None else ewma

    def _mean_ewma_or(self, fallback: float) -> float:
        return self._ewma_sum / self._measured if self._measured else fallback

    def _check_actor(self, actor: int) -> None:
        if not 0 <= actor < self.num_actors:
            raise IndexError(f"actor {actor} out of range for {self.num_actors} actors")

    def _method(self, method: int) -> Method:
        if not 0 <= method < len(self._methods):
            raise IndexError(f"method {method} unknown ({len(self._methods)} methods registered)")
        return self._methods[method]

    def _group(self, group: int) -> Group:
        if not 0 <= group < len(self._groups):
            raise IndexError(f"group {group} unknown ({len(self._groups)} groups registered)")
        return self._groups[group]
