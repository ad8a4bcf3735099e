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
- adaptive: the fewest calls in flight, then the fastest speed class (floor(log2(low_s)); an actor
  whose speed is not known first), then the most recently sent a task if idle (the least recently
  if busy), then lowest rank. With
  hold_ratio > 0 and task slots it holds a call back from a free straggler (see `_holds`).
- Each actor holds at most max_tasks Ray tasks (0: unbounded), a task beyond the first only while
  its low_s is below pipeline_s (when that is > 0) or it is steady (spread < STEADY).
  With pipeline_backlog, a drain of an actor ends by giving it a second task when it has just one
  and calls back up (see `_pipeline_backlog`).
- affinity: the key's last actor keeps the call unless its in_flight exceeds the group's least
  loaded eligible member by more than affinity_abs AND by a factor above affinity_rel.
- A queued call leaves its queue when a slot frees in one of its group's actors; among the
  groups that can dispatch, the oldest ticket goes first.
- Coalescing: the call a drain dispatches opens a Ray task on its actor; the calls that wait for
  that actor (in any of its groups, oldest first) join the task while each may ride (neither it
  nor its method is alone), the task has fewer than `coalesce` calls, the actor a free call slot,
  and their expected service times (the method's ewma_s, or batch_budget_s / 4 unmeasured) fit
  the rest of batch_budget_s. Under a backlog (see `_budget`) the budget grows with its depth
  and a task takes at least two calls. An actor whose speed is not known takes one call a task.
- Service time: a task of k calls is k samples of an equal share of its duration: the EWMA moves
  by the weight 1 - (1 - alpha)**k (alpha for one call). The method's estimate, and the actor's
  one for the pipeline rule (`low_s`), rise RISE_SLOWER times slower than they fall: samples
  taken on the driver are inflated by its own delays, never deflated.
- Failures count per call: a failed call is no sample of its method, and for the actor a
  penalty of FAILURE_PENALTY times the larger of its share and the actor's estimate (the
  method's while the actor is unmeasured): an actor that fails fast never looks fast. A restart
  forgets the actor's estimate: a new process is measured anew.
- Start-up: the first sample of an incarnation (`fresh`) may only lower an estimate, never make
  one: an actor or method whose only sample is a start-up stays unmeasured.
  An actor sent a task after STALE_TASKS_PER_ACTOR tasks per actor went elsewhere is stale: its
  next sample replaces its estimate.
  The method keeps its latest non-start-up samples (RECENT of them) for a percentile.
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
    low_s: float = 0.0  # slow to rise: for the pipeline rule and the speed class
    spread: float = 1.0  # moving average of |sample - ewma_s| / ewma_s
    latest: deque[float] = field(default_factory=lambda: deque(maxlen=LATEST))  # not start-up
    last_end_s: float = -math.inf
    fresh: bool = True  # the next sample is the incarnation's first: it may include start-up
    stale: bool = False  # not sent a task for long: the next sample replaces the estimate
    failures_in_a_row: int = 0  # failed calls in a row (a task's, when most of it failed)

    @property
    def known(self) -> bool:
        return self.ewma_s is not None

    @property
    def steady(self) -> bool:
        return self.known and self.spread < STEADY


REPORT_LASTS = 64  # a method learns from reports only until this many samples came without one


@dataclass
class Method:
    alone: bool
    ewma_s: float | None = None
    # samples since an actor last reported running its calls: a report stands below REPORT_LASTS
    unreported: int = REPORT_LASTS
    recent: list[float] = field(default_factory=list)  # a ring of the latest samples
    next: int = 0  # where the next sample goes once the ring is full


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
    rated: int = 0  # members alive with a known speed
    rate: float = 0.0  # the sum of their speeds, kept incrementally as the native core does
    pace: float = 0.0  # the same over their mean times (1 / ewma_s)
    holding: bool = False  # its first call is held back from a straggler
    hold_until: float = 0.0


POLICIES = ("random", "round_robin", "pow2", "least_loaded", "pull", "sed", "adaptive",
            "external")
UNMEASURED_BATCH = 4  # an unmeasured method's calls are expected to take budget / this
RISE_SLOWER = 8.0
RECENT = 64  # samples a method keeps for its percentile
ENOUGH = 8  # fewer samples tell no percentile
MIN_TIME = 1e-9
MAX_TIME = 3600.0  # the longest estimate: failures in a row stop raising it there
FAILURE_PENALTY = 2.0  # a failed call is a sample of this many times the actor's estimate
STEADY = 0.25  # an actor whose spread is below this takes a second task behind its first
STALE_TASKS_PER_ACTOR = 200.0  # an actor not sent a task for this many per actor is stale
PATIENCE = 4.0  # a hold lasts at most this many times the expected wait
LATEST = 3  # samples an actor keeps: a straggler's are all slow, a heavy tail's only some
ALL_SLOW = 2.0  # a straggler too while its latest LATEST samples are each over this x the bar
FLOOR = 0.25  # and its time over this x the bar
ABOVE_MEAN = 3.0  # and those samples over this x the others' mean time
RETEST_SOONER = 25.0  # a judgement on fewer than LATEST samples counts half as much this x sooner
HEDGE_SLOWER = 2.0  # a hedge never goes to an actor over this many times slower
BACKLOG = 2  # a backlog: this many queued calls per live member of the group
BACKLOG_TAIL = 2.0  # a backlog's second task: the method's p90 within this x its median
BACKLOG_SLOWER = 2.0  # and the actor not over this x slower than the others
BACKLOG_BUDGETS = 8.0  # under a backlog a batch may be expected to take this many budgets
UNKNOWN_CLASS = -(2**31)


def speed_class(load: ActorLoad) -> int:
    """floor(log2(low_s)); UNKNOWN_CLASS (first in order) while the speed is not known."""
    return math.frexp(max(load.low_s, MIN_TIME))[1] - 1 if load.known else UNKNOWN_CLASS


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
        pipeline_backlog: bool = False,
        coalesce: int = 1,
        batch_budget_s: float = 0.002,
        hold_ratio: float = 0.0,
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
        self.pipeline_backlog = pipeline_backlog
        self.coalesce = coalesce
        self._budget_s = batch_budget_s
        self._hold_ratio = hold_ratio
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
        self._clock = 0.0  # the latest time seen
        self._earliest_hold = math.inf
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
        g = Group(ranks, frozenset(ranks))
        for actor in ranks:
            rated, rate, pace = self._rating(actor)
            g.rated += rated
            g.rate += rate
            g.pace += pace
        self._groups.append(g)
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

    def method_quantile_s(self, method: int, q: float) -> float:
        """The ceil(q * n)-th smallest of the method's latest samples; NaN with too few."""
        recent = self._method(method).recent
        if not 0 < q <= 1:
            raise ValueError(f"quantile {q}: must be in (0, 1]")
        if len(recent) < ENOUGH:
            return math.nan
        rank = min(max(math.ceil(q * len(recent)), 1), len(recent))
        return sorted(recent)[rank - 1]

    def may_hold(self) -> bool:
        return self._hold_ratio > 0 and self.policy == "adaptive" and self.max_tasks > 0

    # Events

    def submit(self, group: int, affinity: int | None = None, *, method: int = 0,
               alone: bool = False, now_s: float | None = None) -> Decision:
        """Dispatches to an eligible member, or queues when every live member is full, or the
        call must wait for an idle one, or is held back from a straggler."""
        g = self._group(group)
        self._method(method)
        key = None if affinity is None else affinity & MASK64
        if not any(self._loads[a].alive for a in g.members):
            raise NoLiveActors(f"no live actor among the {len(g.members)} actors of group {group}")
        self._see_time(now_s)
        call = Queued(self._next_ticket, key, method, alone)
        actor = None
        if self._eligible_members(g) and not g.queue:
            actor = self._choose(g, call, 1)  # a picker may raise here; nothing has changed yet
        self._next_ticket += 1
        if actor is None:
            g.queue.append(call)
            self._queued[call.ticket] = group
            return Decision(call.ticket, -1)
        self._add_load(actor, 1, 1)
        return Decision(call.ticket, actor)

    def hedge(self, group: int, first: int, idle: bool = True) -> int:
        """A member other than `first` (with `idle`, one with no call in flight), not over
        HEDGE_SLOWER times slower, for a second copy of a call running on `first`; -1 if none
        or if calls wait in the group's queue."""
        g = self._group(group)
        self._check_actor(first)
        if g.queue:
            return -1
        target = self._free_member(g, first, idle)
        if target is None:
            return -1
        to, running = self._loads[target], self._loads[first]
        if to.known and running.known and to.low_s > HEDGE_SLOWER * running.low_s:
            return -1
        self._add_load(target, 1, 1)
        return target

    def hold_deadline_s(self) -> float:
        return self._earliest_hold

    def expire_holds(self, now_s: float) -> list[Decision]:
        """Sends the calls whose hold is over to the actors they were held from."""
        self._see_time(now_s)
        out: list[Decision] = []
        for g in self._groups:
            if not g.holding or g.hold_until > self._clock:
                continue
            actor = next((a for a in g.members if self._eligible(a)), None)
            if actor is not None:
                out += self._drain(actor)
            # With no member eligible (the straggler too was taken meanwhile) the hold is over
            # all the same: the held call waits for the next slot to free, no timer is due.
            if g.holding and g.hold_until <= self._clock:
                g.holding = False
        self._earliest_hold = min((g.hold_until for g in self._groups if g.holding),
                                  default=math.inf)
        return out

    def complete(self, actor: int, started_s: float, ended_s: float, failed: int, *,
                 calls: int = 1, method: int = 0, timed: bool = True,
                 busy_s: float = math.nan, failed_first: int = -1, failed_longest: int = 0,
                 failed_last: int = 0) -> list[Decision]:
        """Ends a task of `calls` calls on `actor`, `failed` of which failed, learns its service
        time per call (the method's from `busy_s`, the actor's own report, when finite), and
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
        if not 0 <= failed <= calls:
            raise ValueError(f"complete(actor={actor}, calls={calls}): failed {failed}: "
                             "must be in [0, calls]")
        if failed_first >= 0 and not (failed_first <= failed_longest <= failed
                                      and failed_last <= failed_longest):
            raise ValueError(f"complete(actor={actor}, failed={failed}): failed_first "
                             f"{failed_first}, failed_longest {failed_longest}, failed_last "
                             f"{failed_last}: runs of failed calls that cannot be")
        self._see_time(ended_s)
        was = self._eligible(actor)
        rating = self._rating(actor)
        load.in_flight -= calls
        load.tasks -= 1
        # the failures' order known and some call succeeded: the run is left with the task's
        # last failures (no ejection here); else a task whose calls mostly succeeded ends the
        # run of failures, one whose calls mostly failed starts one (continues it when every
        # call failed)
        if failed_first >= 0 and failed < calls:
            load.failures_in_a_row = failed_last
        elif failed_first >= 0 or calls - failed < failed:
            load.failures_in_a_row = failed + (load.failures_in_a_row if failed == calls else 0)
        else:
            load.failures_in_a_row = 0
        if timed:
            self._record(load, started_s, ended_s, failed, calls, self._methods[method], busy_s)
        self._blocked += was - self._eligible(actor)
        self._rerate(actor, rating)
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
        if not queue:
            self._groups[group].holding = False
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
            g.holding = False
        return sorted(orphaned)

    def mark_alive(self, actor: int) -> list[Decision]:
        self._check_actor(actor)
        if self._loads[actor].alive:
            return []
        self._set_alive(actor, True)  # a new process: its speed is to be measured again
        self._loads[actor].fresh = True  # and its first call may wait for __init__
        self._loads[actor].failures_in_a_row = 0
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

    def _choose(self, g: Group, call: Queued, waiting: int) -> int | None:
        """The actor for `call`, or None when it must wait though a member is eligible."""
        key = call.affinity
        if key is not None:
            last = self._affinity.get(key)
            if last is not None and self._sticks(g, last):
                self._remember(key, last)
                return last
        actor = self._pick(g, self._eligible_members(g), key)
        if self._holds(g, actor, waiting):
            return None
        if key is not None:
            self._remember(key, actor)
        return actor

    def _free_member(self, g: Group, exclude: int, idle: bool) -> int | None:
        """The eligible member other than `exclude` (with `idle`, with no call in flight) that
        the adaptive order puts first (lowest rank on ties)."""
        free = [a for a in g.members if a != exclude and self._eligible(a)
                and not (idle and self._loads[a].in_flight)]
        return min(free, key=self._adaptive_key, default=None)

    def _holds(self, g: Group, actor: int, waiting: int) -> bool:
        """Whether a call is held back from the straggler `actor` (see the native core's
        Scheduler::holds): its time (its service time slow to rise, `low_s`, or the mean of
        its latest samples if lower, halved for every STALE_TASKS_PER_ACTOR tasks per actor sent
        since its last, RETEST_SOONER times as often while it has had fewer than LATEST samples
        since it was measured or went stale) is over hold_ratio times the
        harmonic mean of the other rated members, and they are expected to take and finish the
        call sooner, wait = (waiting + others) / rate < its time; at most PATIENCE * wait, or
        its time if sooner, without a call leaving the queue. It is a straggler as well while
        each of its latest LATEST samples is over ALL_SLOW times the bar and ABOVE_MEAN times
        the others' mean time (harmonic, of ewma_s), and its time over FLOOR times the bar."""
        if not self.may_hold():
            return False
        load = self._loads[actor]
        if not load.known:
            return False
        others, rate, pace = self._others(g, actor)
        if others == 0 or not rate > 0:
            return False
        assert load.ewma_s is not None
        sooner = RETEST_SOONER if len(load.latest) < LATEST else 1.0
        retest_after = self._stale_after() / sooner
        passed_over = (self._tasks_sent - load.last_task) / retest_after
        estimate = (min(load.low_s, sum(load.latest) / len(load.latest)) if load.latest
                    else load.low_s)
        time = max(estimate * math.pow(2.0, -passed_over), MIN_TIME)
        wait = (waiting + others) / rate
        bar = self._hold_ratio * others / rate
        all_slow = (pace > 0 and len(load.latest) == LATEST
                    and min(load.latest) > max(ALL_SLOW * bar, ABOVE_MEAN * others / pace))
        if not (time > bar or (time > FLOOR * bar and all_slow)) or not time > wait:
            return False
        if not g.holding:
            g.holding = True
            g.hold_until = self._clock + min(time, PATIENCE * wait)
            self._earliest_hold = min(self._earliest_hold, g.hold_until)
            return True
        return self._clock < g.hold_until

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
        return min(eligible, key=self._adaptive_key)

    def _adaptive_key(self, actor: int) -> tuple[int, int, int]:
        """Fewest in flight, fastest class, then the most recently sent a task if idle, the
        least recently if busy."""
        load = self._loads[actor]
        recency = -load.last_task if load.in_flight == 0 else load.last_task
        return (load.in_flight, speed_class(load), recency)

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
        """Dispatches queued calls while a group of `actor` has both a queue and a free slot (and
        its first call need not wait)."""
        dispatched: list[Decision] = []
        failed: list[int] = []
        error: Exception | None = None
        waiting: set[int] = set()  # groups whose first call waits though a member is eligible
        while True:
            ready = [
                group for group in self._memberships[actor]
                if group not in waiting and self._groups[group].queue
                and self._eligible_members(self._groups[group])
            ]
            if not ready:
                break
            group = min(ready, key=lambda i: self._groups[i].queue[0].ticket)
            g = self._groups[group]
            call = g.queue.popleft()
            del self._queued[call.ticket]
            try:
                chosen = self._choose(g, call, len(g.queue) + 1)
            except Exception as err:  # noqa: BLE001 - any picker failure fails only this call
                error = error or err
                failed.append(call.ticket)
                continue
            if chosen is None:  # it waits, first in line still
                g.queue.appendleft(call)
                self._queued[call.ticket] = group
                waiting.add(group)
                continue
            dispatched.append(self._dispatch_queued(g, chosen, call))
        self._pipeline_backlog(actor, dispatched)
        if error is not None:
            raise PickerError(
                f"picker failed on {len(failed)} queued call(s) ({type(error).__name__}: {error})",
                dispatched,
                failed,
            ) from error
        return dispatched

    def _pipeline_backlog(self, actor: int, dispatched: list[Decision]) -> None:
        """A second task for `actor` while BACKLOG calls per live member wait in one of its
        groups: the oldest such group's first call, unless it has an
        affinity key, the actor is over BACKLOG_SLOWER times slower than the others' harmonic
        mean, or the method's 90th percentile is over BACKLOG_TAIL times its median (or it has
        too few samples to tell)."""
        load = self._loads[actor]
        if (not self.pipeline_backlog or self.policy == "external" or load.tasks != 1
                or self.max_tasks < 2 or not load.alive or not load.known
                or not self._has_call_slot(actor)):
            return
        backlogged = [group for group in self._memberships[actor]
                      if not self._groups[group].holding and self._groups[group].queue
                      and len(self._groups[group].queue)
                      >= BACKLOG * sum(self._loads[a].alive for a in self._groups[group].members)]
        if not backlogged:
            return
        g = self._groups[min(backlogged, key=lambda i: self._groups[i].queue[0].ticket)]
        call = g.queue[0]
        if call.affinity is not None:
            return
        if not self._not_slower(g, actor):
            return
        if not (self.method_quantile_s(call.method, 0.9)
                <= BACKLOG_TAIL * self.method_quantile_s(call.method, 0.5)):
            return
        g.queue.popleft()
        del self._queued[call.ticket]
        dispatched.append(self._dispatch_queued(g, actor, call))

    def _dispatch_queued(self, g: Group, actor: int, call: Queued) -> Decision:
        """`call`, just taken out of `g`'s queue, opens a task on `actor` (with the calls that
        ride); a hold of `g` ends."""
        self._add_load(actor, 1, 1)
        budget = self._budget(g, actor)  # before the hold ends: the queue is what it was
        g.holding = False
        return self._batch(actor, call, budget)

    def _budget(self, g: Group, actor: int) -> tuple[float, int]:
        """The expected duration a task opened from `g`'s queue on `actor` may carry, and the
        calls it takes whatever their times: under a backlog of BACKLOG calls per live member
        (the first call included), on an actor measured not over BACKLOG_SLOWER times slower
        than the others and whose latest call did not fail, the budget times the backlog's depth (at most BACKLOG_BUDGETS) and two calls."""
        live = max(sum(self._loads[a].alive for a in g.members), 1)
        depth = (len(g.queue) + 1) / (BACKLOG * live)
        load = self._loads[actor]
        if depth < 1 or load.failures_in_a_row or not self._not_slower(g, actor):
            return self._budget_s, 1
        return self._budget_s * min(depth, BACKLOG_BUDGETS), 2

    def _not_slower(self, g: Group, actor: int) -> bool:
        others, rate, _ = self._others(g, actor)
        return others == 0 or self._loads[actor].low_s * rate <= BACKLOG_SLOWER * others

    def _batch(self, actor: int, first: Queued, allowed: tuple[float, int]) -> Decision:
        """The task `first` opens on `actor`, with the waiting calls that ride along."""
        tickets = [first.ticket]
        if self.coalesce == 1 or not self._may_ride(first) or not self._loads[actor].known:
            return Decision(first.ticket, actor)
        budget = allowed[0] - self._expected_s(first)
        while len(tickets) < self.coalesce and self._has_call_slot(actor):
            waiting = [self._groups[group] for group in self._memberships[actor]
                       if self._groups[group].queue]
            if not waiting:
                break
            g = min(waiting, key=lambda group: group.queue[0].ticket)
            mate = g.queue[0]
            if not self._may_ride(mate):
                break
            if self._expected_s(mate) > budget and len(tickets) >= allowed[1]:
                break
            budget -= self._expected_s(mate)
            g.queue.popleft()
            g.holding = False
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
        return load.tasks < self.max_tasks and (short or load.steady)

    def _eligible_members(self, g: Group) -> Sequence[int]:
        if self._blocked == 0:  # skips the scan in the common case, keeping pow2 O(1) here too
            return g.members
        return [a for a in g.members if self._eligible(a)]

    def _stale_after(self) -> float:
        return STALE_TASKS_PER_ACTOR * self.num_actors

    def _add_load(self, actor: int, calls: int, tasks: int) -> None:
        was = self._eligible(actor)
        self._loads[actor].in_flight += calls
        self._loads[actor].tasks += tasks
        if tasks > 0:
            if self._tasks_sent - self._loads[actor].last_task >= self._stale_after():
                self._loads[actor].stale = True
            self._tasks_sent += 1
            self._loads[actor].last_task = self._tasks_sent
        self._blocked += was - self._eligible(actor)

    def _set_alive(self, actor: int, alive: bool) -> None:
        was = self._eligible(actor)
        rating = self._rating(actor)
        self._loads[actor].alive = alive
        if alive:
            self._forget(self._loads[actor])
        self._blocked += was - self._eligible(actor)
        self._rerate(actor, rating)

    def _rating(self, actor: int) -> tuple[int, float, float]:
        """(1, its speed 1 / low_s, 1 / ewma_s) for an alive actor whose speed is known, else
        (0, 0.0, 0.0)."""
        load = self._loads[actor]
        if not (load.alive and load.known):
            return 0, 0.0, 0.0
        assert load.ewma_s is not None
        return 1, 1.0 / max(load.low_s, MIN_TIME), 1.0 / max(load.ewma_s, MIN_TIME)

    def _others(self, g: Group, actor: int) -> tuple[int, float, float]:
        """`g`'s rated members other than `actor`: how many, their summed speeds and summed
        mean speeds."""
        rated, rate, pace = self._rating(actor)
        return g.rated - rated, g.rate - rate, g.pace - pace

    def _rerate(self, actor: int, before: tuple[int, float, float]) -> None:
        """Carries a change of the actor's rating into its groups' sums, as the native core."""
        rated, rate, pace = self._rating(actor)
        for group in self._memberships[actor]:
            g = self._groups[group]
            g.rated += rated - before[0]
            g.rate = 0.0 if g.rated == 0 else g.rate + (rate - before[1])
            g.pace = 0.0 if g.rated == 0 else g.pace + (pace - before[2])

    def _see_time(self, now_s: float | None) -> None:
        if now_s is not None and now_s > self._clock:
            self._clock = now_s

    def _record(self, load: ActorLoad, started_s: float, ended_s: float, failed: int,
                calls: int, method: Method, busy_s: float = math.nan) -> None:
        """Service time per call: from the later of the task's start and the actor's previous
        completion, shared equally by its calls, each one sample. A start-up sample (the
        incarnation's first) may lower an estimate, never raise or make one. A failed call is
        no sample of its method, and for the actor a penalty: FAILURE_PENALTY times the larger
        of its share and the actor's estimate (the method's while it is unmeasured). The
        method's estimate learns from the actor's own `busy_s` when finite; its window of recent
        samples, like the actor, from the share."""
        share = (ended_s - max(started_s, load.last_end_s)) / calls
        load.last_end_s = max(load.last_end_s, ended_s)
        if share < 0:
            return
        startup, load.fresh = load.fresh, False
        stale = load.stale and not startup
        if not startup:
            load.stale = False
        succeeded = calls - failed
        if succeeded:
            self._learn(load, share, succeeded, startup, stale, method, busy_s / calls)
        for _ in range(failed):
            self._learn_failure(load, share, method)

    def _learn(self, load: ActorLoad, sample: float, calls: int, startup: bool, stale: bool,
               method: Method, busy_per_call: float = math.nan) -> None:
        """`sample` (the share) for the actor and the method's window; for the method's
        estimate the actor's report of its busy time (`busy_per_call`), as one sample (the first
        replaces the estimate), or, until an actor has reported, the share."""
        weight = self._alpha if calls == 1 else 1.0 - (1.0 - self._alpha) ** calls
        reported = math.isfinite(busy_per_call)
        method_sample, method_weight = ((max(busy_per_call, 0.0), self._alpha)
                                        if reported else (sample, weight))
        if load.ewma_s is None:  # the first sample moves the prior like any other
            if not startup:
                prior = self._prior_s if self._prior_s > 0 else self._mean_ewma_or(sample)
                load.ewma_s = prior + weight * (sample - prior)
                load.low_s = sample
                self._ewma_sum += load.ewma_s
                self._measured += 1
        elif stale:
            self._ewma_sum += sample - load.ewma_s
            load.ewma_s = sample
            load.low_s = sample
            load.latest.clear()
        elif not startup or sample < load.ewma_s:
            old = load.ewma_s
            if not startup:
                load.spread += weight * (abs(sample - old) / max(old, MIN_TIME) - load.spread)
            load.ewma_s = old + weight * (sample - old)
            low = lower(load.low_s, sample, weight)
            load.low_s = min(load.low_s, low) if startup else low
            self._ewma_sum += load.ewma_s - old
        if not startup:
            load.latest.append(sample)
        if reported:
            if method.unreported >= REPORT_LASTS:  # a first report: drop what the shares taught
                method.ewma_s = None
            method.unreported = 0
        elif method.unreported < REPORT_LASTS:
            method.unreported += 1
        if reported or method.unreported >= REPORT_LASTS:  # else a report stands
            if startup:
                if method.ewma_s is not None and method_sample < method.ewma_s:
                    method.ewma_s = lower(method.ewma_s, method_sample, method_weight)
            else:
                method.ewma_s = (method_sample if method.ewma_s is None
                                 else lower(method.ewma_s, method_sample, method_weight))
        if not startup:
            if len(method.recent) < RECENT:
                method.recent.append(sample)
            else:
                method.recent[method.next] = sample
            method.next = (method.next + 1) % RECENT

    def _learn_failure(self, load: ActorLoad, share: float, method: Method) -> None:
        reference = load.ewma_s if load.ewma_s is not None else (
            method.ewma_s if method.ewma_s is not None else share)
        sample = min(FAILURE_PENALTY * max(share, reference), MAX_TIME)
        if load.ewma_s is None:
            load.ewma_s = sample
            load.low_s = sample
            self._ewma_sum += sample
            self._measured += 1
        else:
            old = load.ewma_s
            load.spread += self._alpha * (abs(sample - old) / max(old, MIN_TIME) - load.spread)
            load.ewma_s = old + self._alpha * (sample - old)
            load.low_s += self._alpha * (sample - load.low_s)  # full weight: no driver delay
            self._ewma_sum += load.ewma_s - old
        load.latest.append(sample)

    def _forget(self, load: ActorLoad) -> None:
        """A new incarnation: its speed is to be measured again."""
        if load.ewma_s is not None:
            self._ewma_sum -= load.ewma_s
            self._measured -= 1
        if self._measured == 0:
            self._ewma_sum = 0.0
        load.ewma_s = None
        load.low_s = 0.0
        load.spread = 1.0
        load.stale = False
        load.latest.clear()

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
