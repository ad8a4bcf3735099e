"""Invariants of the native scheduler under arbitrary event sequences (hypothesis, no Ray).

- in_flight always equals the calls dispatched or acquired and not yet completed: never negative,
  and an extra complete raises without changing anything;
- a dispatch (by submit or by a drain) never takes an actor above max_in_flight;
- every ticket is dispatched exactly once, or handed back exactly once (cancel, mark_dead, a
  failed pick), with the payload it was queued with, and queued() counts the rest;
- a restarting actor takes no call but keeps calls that only it can serve waiting; an ejected
  actor takes a call only when no other eligible member can; a deferred drain loses nothing;
- once every call has completed, every count is back to zero and nothing is queued.
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actormesh import _native

POLICIES = ["random", "round_robin", "pow2", "least_loaded", "pull", "sed", "external"]


def picker(ranks: list[int], in_flight: list[int], latency: list[float], key: int | None,
           payload: object = None) -> int:
    """Least loaded, except that key 0 makes it fail: picks fail inside submits and drains."""
    if key == 0:
        raise LookupError("no actor for key 0")
    return in_flight.index(min(in_flight))


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_actors=st.integers(1, 6),
        policy=st.sampled_from(POLICIES),
        max_in_flight=st.integers(0, 3),
        seed=st.integers(0, 2**64 - 1),
    )
    def create(self, num_actors: int, policy: str, max_in_flight: int, seed: int) -> None:
        self.scheduler = _native.Scheduler(
            num_actors,
            policy,
            max_in_flight=max_in_flight,
            seed=seed,
            affinity_capacity=4,
            eject_after=2,
            eject_base_s=0.05,
            eject_max_s=0.2,
            picker=picker if policy == "external" else None,
        )
        self.num_actors = num_actors
        self.slots = self.scheduler.max_in_flight
        self.groups = [0]
        self.users: dict[int, int] = {}  # add_group calls per group, not yet removed
        self.running = [0] * num_actors  # calls dispatched or acquired, not completed
        self.alive = [True] * num_actors
        self.status = ["alive"] * num_actors
        self.queued: set[int] = set()
        self.payloads: dict[int, object] = {}  # ticket -> what it was queued with
        self.outcome: dict[int, str] = {}  # ticket -> how it left: each at most once
        self.clock = 0.0

    def settle(self, ticket: int, how: str) -> None:
        assert ticket not in self.outcome, f"ticket {ticket} {how} after {self.outcome[ticket]}"
        self.outcome[ticket] = how
        self.queued.discard(ticket)

    def handed_back(self, decision: _native.Decision, how: str) -> None:
        assert decision.ticket in self.queued
        assert decision.payload is self.payloads.pop(decision.ticket)
        self.settle(decision.ticket, how)

    def dispatched(self, decisions: list) -> None:
        for decision in decisions:
            assert self.status[decision.actor] == "alive"
            self.handed_back(decision, "dispatched")
            self.running[decision.actor] += 1
        self.check_slots({decision.actor for decision in decisions})

    def check_slots(self, actors: set[int]) -> None:
        if self.slots:
            loads = self.scheduler.in_flight()
            assert all(loads[a] <= self.slots for a in actors), (loads, self.slots)

    def drained(self, call) -> None:
        try:
            decisions = call()
        except _native.PickerError as err:
            assert isinstance(err.__cause__, LookupError)
            self.dispatched(err.dispatched)
            for decision in err.failed:
                self.handed_back(decision, "failed")
        else:
            self.dispatched(decisions)

    @rule(data=st.data(), affinity=st.none() | st.integers(-3, 3))
    def submit(self, data: st.DataObject, affinity: int | None) -> None:
        group = data.draw(st.sampled_from(self.groups))
        members = self.scheduler.group_members(group)
        payload = object()
        try:
            decision = self.scheduler.submit(group, affinity, payload, self.clock)
        except _native.NoLiveActors:
            assert all(self.status[a] == "dead" for a in members)
            return
        except LookupError:
            assert affinity == 0  # the picker failed; nothing was counted
            return
        assert decision.ticket not in self.outcome and decision.ticket not in self.queued
        if decision.actor < 0:
            self.queued.add(decision.ticket)
            self.payloads[decision.ticket] = payload
            return
        assert decision.actor in members and self.status[decision.actor] == "alive"
        ejected = self.scheduler.ejected()
        if ejected[decision.actor]:  # only when no member that is not ejected had a free slot
            loads = self.scheduler.in_flight()
            assert not any(
                self.status[a] == "alive" and not ejected[a] and a != decision.actor
                and (not self.slots or loads[a] < self.slots)
                for a in members
            )
        self.outcome[decision.ticket] = "dispatched"
        self.running[decision.actor] += 1
        self.check_slots({decision.actor})

    @precondition(lambda self: any(self.running))
    @rule(data=st.data(), failed=st.integers(0, 1), duration=st.floats(0.0, 0.1))
    def complete(self, data: st.DataObject, failed: int, duration: float) -> None:
        actor = data.draw(st.sampled_from([a for a in range(self.num_actors) if self.running[a]]))
        self.clock += 0.01
        self.running[actor] -= 1
        if data.draw(st.booleans()):
            self.drained(
                lambda: self.scheduler.complete(actor, self.clock - duration, self.clock, failed)
            )
        else:  # as with a Python Balancer: the drain comes later, from another thread
            assert self.scheduler.complete(actor, self.clock - duration, self.clock, failed,
                                           drain=False) == []
            self.drained(lambda: self.scheduler.drain(actor))

    @precondition(lambda self: any(self.running))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from([a for a in range(self.num_actors) if self.running[a]]))
        self.running[actor] -= 1
        self.drained(lambda: self.scheduler.release(actor))

    @rule(data=st.data())
    def complete_too_often(self, data: st.DataObject) -> None:
        idle = [a for a in range(self.num_actors) if not self.running[a]]
        if not idle:
            return
        actor = data.draw(st.sampled_from(idle))
        try:
            self.scheduler.complete(actor, 0.0, self.clock, 0)
        except RuntimeError:
            return
        raise AssertionError(f"an extra complete on actor {actor} was accepted")

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        actor = data.draw(st.integers(0, self.num_actors - 1))
        self.scheduler.acquire(actor)
        self.running[actor] += 1

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(
            st.sampled_from(sorted(self.queued)) if self.queued else st.integers(0, 50)
        )
        cancelled = self.scheduler.cancel(ticket)
        assert cancelled == (ticket in self.queued)
        if cancelled:
            self.payloads.pop(ticket)
            self.settle(ticket, "cancelled")

    @rule(data=st.data(), restarting=st.booleans())
    def mark_dead(self, data: st.DataObject, restarting: bool) -> None:
        actor = data.draw(st.integers(0, self.num_actors - 1))
        before = self.status[actor]
        orphaned = self.scheduler.mark_dead(actor, restarting)
        if before == "alive" or (before == "restarting" and not restarting):
            self.status[actor] = "restarting" if restarting else "dead"
        self.alive[actor] = self.status[actor] == "alive"
        if restarting:
            assert orphaned == []
        for decision in orphaned:
            self.handed_back(decision, "orphaned")

    @rule(data=st.data())
    def mark_alive(self, data: st.DataObject) -> None:
        actor = data.draw(st.integers(0, self.num_actors - 1))
        self.alive[actor] = True
        self.status[actor] = "alive"
        self.drained(lambda: self.scheduler.mark_alive(actor))

    @rule(data=st.data())
    def add_group(self, data: st.DataObject) -> None:
        members = data.draw(st.sets(st.integers(0, self.num_actors - 1), min_size=1))
        group = self.scheduler.add_group(sorted(members))
        self.users[group] = self.users.get(group, 0) + 1
        if group not in self.groups:
            self.groups.append(group)

    @precondition(lambda self: len(self.groups) > 1)
    @rule(data=st.data())
    def remove_group(self, data: st.DataObject) -> None:
        """A view goes: its group is freed (at once, or once the calls waiting in it are gone)."""
        group = data.draw(st.sampled_from(self.groups[1:]))
        self.scheduler.remove_group(group)
        self.users[group] = self.users.get(group, 1) - 1
        if self.users[group] == 0:
            del self.users[group]
            self.groups.remove(group)  # no call is submitted to it any more

    @invariant()
    def counts_match_the_calls_running(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        assert self.scheduler.in_flight() == self.running
        assert min(self.running, default=0) >= 0
        assert self.scheduler.queued() == len(self.queued)
        assert self.scheduler.alive() == self.alive
        assert self.scheduler.status() == self.status

    @invariant()
    def latencies_are_unset_or_non_negative(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        assert all(math.isnan(x) or x >= 0.0 for x in self.scheduler.mean_latency_s())

    def teardown(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        for actor in range(self.num_actors):
            self.alive[actor] = True
            self.status[actor] = "alive"
            self.drained(lambda actor=actor: self.scheduler.mark_alive(actor))
        while any(self.running):
            actor = next(a for a in range(self.num_actors) if self.running[a])
            self.running[actor] -= 1
            self.drained(lambda actor=actor: self.scheduler.complete(actor, 0.0, 1.0, 0))
        assert self.scheduler.in_flight() == [0] * self.num_actors
        assert self.scheduler.queued() == 0
        assert not self.queued and not self.payloads
        assert set(self.outcome) == set(range(1, max(self.outcome, default=0) + 1))


SchedulerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestSchedulerInvariants = SchedulerMachine.TestCase
