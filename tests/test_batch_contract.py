"""Batching is invisible: a call that rides a Ray task with others gets exactly what it would get
alone (DESIGN.md), on a real Ray cluster. Calls are made to ride together by holding every actor
with a call blocked on a signal, queueing the calls, then releasing the actors."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import ray
from contract_workers import (
    Bounded,
    Counter,
    Flaky,
    Gated,
    Grouped,
    LoadsNowhere,
    Logged,
    Peaked,
    Restarting,
    Returns,
    Yields,
)
from workers import signal, wait_until, waiters

import actormesh as am

# One task per actor, so that calls wait behind it, and a budget that never splits a batch.
T = TypeVar("T")
ONE_TASK = am.Policy("adaptive", max_tasks=1, batch_budget_s=60.0)


def queued_behind_a_held_call(one: am.ActorMesh[Any], make: Callable[[], list[T]]) -> list[T]:
    """`make()`'s calls, made while `one`'s actor is held by a call blocked on a signal (so
    they wait and then ride together), the actor released once they are made."""
    sig = signal()
    blocked = one.methods.block.choose(sig)
    waiters(sig, 1)
    futures = make()
    sig.send.remote()
    blocked.get(timeout=60)
    return futures


@pytest.fixture(scope="module")
def pair(ray_cluster: None) -> Iterator[am.ActorMesh[Logged]]:
    with am.ActorMesh(Logged, shape=2, num_cpus=0.1, balancer=ONE_TASK) as mesh:
        counter = Counter.remote()
        for _ in range(2):  # every method measured (an actor's first call measures nothing)
            am.get([mesh.methods.logged.all(-1, counter), mesh.methods.value.all(0),
                    mesh.methods.aborting.all(0), mesh.methods.slow.all(-1, 0.0, counter)],
                   timeout=60)
        yield mesh


@pytest.mark.parametrize("retries", [0, 1])
def test_calls_that_finished_before_their_actor_died_later_in_the_task_return_once(
    ray_cluster: None, retries: int,
) -> None:
    with am.ActorMesh(Logged, shape=2, num_cpus=0.1, balancer=ONE_TASK,
                      max_restarts=0) as mesh:
        counter = Counter.remote()
        am.get([mesh.methods.logged.all(-1, counter)] * 2, timeout=60)
        held = [signal(), signal()]
        blocked = [mesh[r].methods.block.choose(held[r]) for r in range(2)]
        for sig in held:
            waiters(sig, 1)
        doomed = signal()
        calls = [mesh.methods.logged.options(retries=retries).choose(x, counter)
                 for x in range(5)]
        tail = mesh.methods.block.choose(doomed)  # rides last, never ends
        held[0].send.remote()  # actor 0 frees first: it takes every queued call, one task
        blocked[0].get(timeout=60)
        waiters(doomed, 1)  # the five calls ahead of it have run
        ray.kill(mesh.actors[0])
        assert am.get(calls, timeout=60) == list(range(5))
        with pytest.raises(am.ActorDiedError, match="rank 0"):
            tail.get(timeout=60)
        held[1].send.remote()
        blocked[1].get(timeout=60)
        assert [x for x in ray.get(counter.executions.remote()) if x >= 0] == list(range(5))


def test_calls_riding_a_task_that_outruns_its_expected_time_are_not_started_in_it(
    pair: am.ActorMesh[Logged],
) -> None:
    """A task expected to be short returns its calls together; when its first call takes far
    longer than its method's estimate said (60 ms, measured at ~0), the task starts no more
    calls: they go again, each run once, so an actor dying in it takes no more with it than
    a lone call's."""
    one = pair[0]
    counter = Counter.remote()
    futures = queued_behind_a_held_call(one, lambda: [
        one.methods.slow.choose(x, 0.06 if x == 0 else 0.0, counter) for x in range(5)])
    assert am.get(futures, timeout=60) == list(range(5))
    assert ray.get(counter.executions.remote(), timeout=60) == list(range(5))  # once each
    first = futures[0]._calls[0].task
    assert first is not None and len(first.results) == 5  # they rode one task,
    assert [type(r).__name__ for r in first.results[1:]] == ["Deferred"] * 4  # not started
    assert all(f._calls[0].task is not first for f in futures[1:])  # and went again


def test_a_value_that_cannot_be_pickled_fails_its_own_call_only(
    pair: am.ActorMesh[Logged],
) -> None:
    one = pair[0]
    futures = queued_behind_a_held_call(
        one, lambda: [one.methods.value.choose(x) for x in (1, -1, 3)])
    assert futures[0].get(timeout=60) == 1 and futures[2].get(timeout=60) == 3
    with pytest.raises(am.ActorError, match="cannot be serialized"):
        futures[1].get(timeout=60)
    assert len({id(f._calls[0].task) for f in futures}) == 1  # they rode one task


def test_the_traceback_of_a_call_that_raised_in_a_task_of_several_names_no_frame_of_the_library(
    pair: am.ActorMesh[Logged],
) -> None:
    futures = queued_behind_a_held_call(pair[0], lambda: [pair[0].methods.aborting.choose(x)
                                                          for x in (1, -1, 3)])
    with pytest.raises(am.ActorError) as raised:
        futures[1].get(timeout=60)
    assert 'contract_workers.py", line' in str(raised.value)  # the method's own frame
    assert "_runner.py" not in str(raised.value)  # as alone: no frame of the library's


def test_a_base_exception_of_the_users_own_fails_its_own_call_only(
    pair: am.ActorMesh[Logged],
) -> None:
    one = pair[0]
    futures = queued_behind_a_held_call(
        one, lambda: [one.methods.aborting.choose(x) for x in (1, 2, -1, 4)])
    assert [futures[i].get(timeout=60) for i in (0, 1, 3)] == [1, 2, 4]
    with pytest.raises(am.ActorError, match="Abort: abort -1"):
        futures[2].get(timeout=60)
    assert len({id(f._calls[0].task) for f in futures}) == 1  # they rode one task
    assert not any(actor.ejected for actor in pair.load().actors)


def test_an_argument_the_actor_cannot_load_fails_its_own_call_only(
    pair: am.ActorMesh[Logged],
) -> None:
    """The calls of a task travel as one argument: when the actor cannot load it, no call has
    run, and each goes again alone, where it gets what it would have got alone."""
    one = pair[0]
    bad: Any = LoadsNowhere(7)
    with pytest.raises(am.MeshError) as alone:
        one.methods.value.choose(bad).get(timeout=60)
    futures = queued_behind_a_held_call(
        one, lambda: [one.methods.value.choose(x) for x in (1, bad, 3, 4)])
    assert [futures[i].get(timeout=60) for i in (0, 2, 3)] == [1, 3, 4]
    with pytest.raises(type(alone.value), match="cannot be loaded"):
        futures[1].get(timeout=60)
    assert not any(actor.ejected for actor in pair.load().actors)
    assert pair.load() == [0, 0]


def test_an_asyncio_actor_made_elsewhere_keeps_its_max_concurrency(ray_cluster: None) -> None:
    actor = Bounded.remote()
    mesh = am.ActorMesh.from_actors([actor], max_in_flight=8, balancer=ONE_TASK)
    try:
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        futures = [mesh.methods.work.choose(x) for x in range(6)]
        sig.send.remote()
        blocked.get(timeout=60)
        assert am.get(futures, timeout=60) == list(range(6))
        assert ray.get(actor.peak_seen.remote(), timeout=60) <= 2
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_an_asyncio_mesh_actor_runs_calls_that_ride_together_within_its_max_concurrency(
    ray_cluster: None,
) -> None:
    with am.ActorMesh(Peaked, shape=1, num_cpus=0.1, max_in_flight=8,
                      balancer=am.Policy("adaptive", max_tasks=1, batch_budget_s=60.0),
                      ray_actor_options={"max_concurrency": 2}) as mesh:
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        futures = [mesh.methods.work.choose(x) for x in range(6)]  # they ride one task
        sig.send.remote()
        blocked.get(timeout=60)
        assert am.get(futures, timeout=60) == list(range(6))
        assert mesh.methods.peak_seen.choose().get(timeout=60) == 2


def test_a_method_in_a_concurrency_group_runs_in_its_group_when_calls_wait(
    ray_cluster: None,
) -> None:
    actor = Grouped.remote()
    mesh = am.ActorMesh.from_actors([actor], balancer=ONE_TASK)
    try:
        default_thread = ray.get(actor.thread.remote(), timeout=60)
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        futures = [mesh.methods.in_io.choose(x) for x in range(3)]  # they wait, then ride
        sig.send.remote()
        blocked.get(timeout=60)
        done = am.get(futures, timeout=60)
        assert [value.split(":")[0] for value in done] == ["0", "1", "2"]
        assert all(value.split(":")[1] != default_thread for value in done)  # in the io group
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_a_call_in_a_concurrency_group_is_not_held_behind_a_call_of_the_default_group(
    ray_cluster: None,
) -> None:
    """Ray runs a method of a concurrency group of its own beside the actor's other calls: a
    mesh over such an actor made elsewhere sends its call at once, as it does for an actor of
    its own made with `concurrency_groups`, not after the call that holds the default group."""
    actor = Grouped.remote()
    mesh = am.ActorMesh.from_actors([actor])
    try:
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        assert mesh.methods.in_io.choose(7).get(timeout=30).startswith("7:")
        sig.send.remote()
        blocked.get(timeout=60)
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_an_asyncio_mesh_actor_runs_as_many_tasks_at_once_as_max_tasks_allows(
    ray_cluster: None,
) -> None:
    """A task beyond an actor's first runs beside it on an actor that runs calls at once: it is
    not held back as one that would wait behind the first (whose calls are not measured yet)."""
    with am.ActorMesh(Peaked, shape=1, num_cpus=0.1,
                      balancer=am.Policy("adaptive", max_tasks=3)) as mesh:
        sig = signal()
        blocked = [mesh.methods.block.choose(sig) for _ in range(3)]
        waiters(sig, 3)  # all three started (one at a time before: the others held back)
        sig.send.remote()
        am.get(blocked, timeout=60)


def test_a_call_that_cannot_be_sent_is_counted_as_an_error(pair: am.ActorMesh[Logged]) -> None:
    before = pair.stats()["calls"].get("value", {}).get("error", 0)
    with pytest.raises(TypeError, match="pickle"):
        pair.methods.value.choose(threading.Lock()).get(timeout=60)  # alone: Ray refuses it
    assert pair.stats()["calls"]["value"]["error"] == before + 1


def test_ray_task_retries_of_an_actor_made_elsewhere_hold_for_calls_that_wait(
    ray_cluster: None,
) -> None:
    """An actor made with Ray's `max_task_retries`: Ray runs again the call its process died
    in, and only that one, once the actor is back. Calls that waited behind a busy actor get
    the same, each its own Ray task (a task of several would fail or run again as a whole)."""
    actor = Restarting.remote()
    mesh = am.ActorMesh.from_actors([actor], balancer=ONE_TASK)
    try:
        counter = Counter.remote()
        for _ in range(2):  # the method measured: its calls would ride one short task
            mesh.methods.logged.choose(-1, counter, 3).get(timeout=60)
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        futures = [mesh.methods.logged.choose(x, counter, 3) for x in range(4)]  # 3 kills it
        sig.send.remote()
        blocked.get(timeout=60)
        assert am.get(futures, timeout=60) == [0, 1, 2, 3]
        assert [x for x in ray.get(counter.executions.remote()) if x >= 0] == [0, 1, 2, 3, 3]
        assert len({id(f._calls[0].task) for f in futures}) == 4  # each went alone
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_a_method_with_ray_retry_options_keeps_them_when_calls_wait(ray_cluster: None) -> None:
    actor = Flaky.remote()
    mesh = am.ActorMesh.from_actors([actor], balancer=ONE_TASK)
    try:
        for x in (100, 101):  # the method measured
            assert mesh.methods.flaky.choose(x).get(timeout=60) == x
        sig = signal()
        blocked = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        futures = [mesh.methods.flaky.choose(x) for x in range(3)]
        sig.send.remote()
        blocked.get(timeout=60)
        assert am.get(futures, timeout=60) == [0, 1, 2]  # each raised once, and Ray retried it
        attempts = ray.get(actor.attempts_made.remote(), timeout=60)
        assert [attempts[x] for x in range(3)] == [2, 2, 2]
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_generators_and_methods_of_several_returns_give_their_values_and_hold_their_slot(
    ray_cluster: None,
) -> None:
    """A method Ray runs as a generator, or with `num_returns=2`, goes alone (its own Ray call):
    `get()` gives the list of the values it yielded, or the tuple of its returns, alone
    or after waiting for a slot; its slot is held until the Ray call ends."""
    actor = Returns.remote()
    mesh = am.ActorMesh.from_actors([actor], balancer=ONE_TASK, max_in_flight=1)
    try:
        assert list(mesh.methods.counted.choose(3).get(timeout=60)) == [0, 1, 2]
        assert mesh.methods.pair.choose(5).get(timeout=60) == (5, -5)
        sig = signal()
        running = mesh.methods.held.choose(sig)
        waiters(sig, 1)
        assert mesh.load() == [1]  # running: its slot held
        waiting = [mesh.methods.counted.choose(2), mesh.methods.pair.choose(6)]
        sig.send.remote()
        assert list(running.get(timeout=60)) == [1, 2]
        assert list(waiting[0].get(timeout=60)) == [0, 1]
        assert waiting[1].get(timeout=60) == (6, -6)
        assert mesh.load() == [0]
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_a_generator_call_gives_every_reader_all_its_values(ray_cluster: None) -> None:
    with am.ActorMesh(Yields, shape=1, num_cpus=0.1) as mesh:
        future = mesh.methods.counted.choose(3)
        assert ray.get(future.ref, timeout=60) == [0, 1, 2]
        assert future.get(timeout=60) == [0, 1, 2]
        assert future.get(timeout=60) == [0, 1, 2]  # every reader gets them all


def test_a_method_that_returns_nothing_ray_can_wait_on_is_refused_by_name(
    ray_cluster: None,
) -> None:
    actor = Returns.remote()
    mesh = am.ActorMesh.from_actors([actor])
    try:
        with pytest.raises(TypeError, match="fire_and_forget is a Ray method with num_returns=0"):
            mesh.methods.fire_and_forget.choose()
        assert mesh.load() == [0]
    finally:
        mesh.shutdown()
        ray.kill(actor)


def test_a_generator_method_of_a_mesh_class_gives_its_values_to_choose_and_all(
    ray_cluster: None,
) -> None:
    with am.ActorMesh(Yields, shape=2, num_cpus=0.1) as mesh:
        assert list(mesh.methods.counted.choose(3).get(timeout=60)) == [0, 1, 2]
        every = mesh.methods.counted.all(2).get(timeout=60)
        assert [list(every[rank]) for rank in range(2)] == [[0, 1], [0, 1]]


def test_a_raising_call_in_a_coalesced_map_never_ejects_a_healthy_actor(
    pair: am.ActorMesh[Logged],
) -> None:
    items = [-1 if x % 10 == 0 else x for x in range(200)]  # one call in ten fails
    results: list[Any] = list(pair.methods.value.options(return_exceptions=True).map(items))
    assert sum(isinstance(r, am.ActorError) for r in results) == 20
    assert [r for r in results if not isinstance(r, am.ActorError)] == \
        [x for x in items if x >= 0]
    assert pair._root.router.scheduler.ejected() == [False, False]


def test_a_coalesced_map_with_most_calls_raising_but_never_five_in_a_row_ejects_no_actor(
    pair: am.ActorMesh[Logged],
) -> None:
    """Sent one by one, two failures then a success, over and over, never make five failures in
    a row: riding tasks of many calls (run in order), they never do either."""
    before = pair.stats()["batch_calls"]["value"]
    items = [x if x % 3 == 0 else -x for x in range(1, 601)]  # raise, raise, return, ...
    results: list[Any] = list(pair.methods.value.options(return_exceptions=True).map(items))
    assert sum(isinstance(r, am.ActorError) for r in results) == 400
    after = pair.stats()["batch_calls"]["value"]
    assert after["count"] - before["count"] < (after["sum"] - before["sum"]) / 4  # they rode
    assert pair._root.router.scheduler.ejected() == [False, False]


def test_cancelling_every_call_of_a_running_task_stops_it_and_frees_its_slot(
    ray_cluster: None,
) -> None:
    with am.ActorMesh(Gated, shape=1, num_cpus=0.1, balancer=ONE_TASK) as mesh:
        mesh.methods.cancelled_calls.choose().get(timeout=60)  # its start-up: then its speed
        held, never = signal(), signal()                      # is known, and calls ride
        blocked = mesh.methods.block.choose(held)
        waiters(held, 1)
        futures = [mesh.methods.gate.choose(never) for _ in range(3)]  # they ride one task
        held.send.remote()
        blocked.get(timeout=60)
        waiters(never, 3)
        for future in futures:
            future.cancel()
        assert mesh.methods.cancelled_calls.choose().get(timeout=60) == 3  # the slot is free
        assert mesh.load() == [0]


def test_a_call_riding_with_one_cancelled_returns_at_its_end_and_the_task_then_stops(
    ray_cluster: None,
) -> None:
    """On an asyncio actor, a call cancelled (or timed out) in a running task keeps running
    while a call riding with it runs: the rider's value reaches its caller when the rider ends,
    and once every call of the task is done the task is cancelled and its slot freed."""
    with am.ActorMesh(Gated, shape=1, num_cpus=0.1, balancer=ONE_TASK) as mesh:
        for _ in range(2):
            mesh.methods.cancelled_calls.choose().get(timeout=60)
        held, never, other = signal(), signal(), signal()
        blocked = mesh.methods.block.choose(held)
        waiters(held, 1)
        stuck = mesh.methods.gate.choose(never)
        rider = mesh.methods.block.choose(other)
        held.send.remote()
        blocked.get(timeout=60)
        waiters(never, 1)
        waiters(other, 1)
        assert stuck._calls[0].task is rider._calls[0].task  # they ride one task
        stuck.cancel()  # as a timeout does
        with pytest.raises(cf.CancelledError):
            stuck.get(timeout=60)
        other.send.remote()
        assert rider.get(timeout=30) is None  # though the call it rode with never ends
        wait_until(lambda: mesh.load() == [0])
        assert mesh.methods.cancelled_calls.choose().get(timeout=60) == 1


def test_calls_cancelled_in_a_task_whose_rider_ran_are_no_failures_of_the_actor(
    ray_cluster: None,
) -> None:
    with am.ActorMesh(Gated, shape=2, num_cpus=0.1, balancer=ONE_TASK) as mesh:
        for _ in range(2):
            mesh.methods.cancelled_calls.all().get(timeout=60)
        one = mesh[0]
        held, never, other = signal(), signal(), signal()
        blocked = one.methods.block.choose(held)
        waiters(held, 1)
        stuck = [one.methods.gate.choose(never) for _ in range(5)]
        rider = one.methods.block.choose(other)
        held.send.remote()
        blocked.get(timeout=60)
        waiters(never, 5)
        for call in stuck:
            call.cancel()
        other.send.remote()
        assert rider.get(timeout=30) is None
        wait_until(lambda: mesh.load() == [0, 0])  # the task was cancelled once the rider ran
        assert not any(actor.ejected for actor in mesh.load().actors)  # 5 cancels, no failure
        assert mesh.stats()["calls"]["gate"]["cancelled"] == 5


def test_a_call_of_all_on_an_asyncio_actor_whose_argument_it_cannot_load_fails_as_alone(
    ray_cluster: None,
) -> None:
    """A task that failed before running its calls sends each again alone, to its own actor
    for a call of `all`."""
    with am.ActorMesh(Peaked, shape=2, num_cpus=0.1) as mesh:
        bad: Any = LoadsNowhere(1)
        with pytest.raises(am.MeshError, match="cannot be loaded"):
            mesh.methods.work.all(bad).get(timeout=60)
        assert list(mesh.methods.work.all(3).get(timeout=60)) == [3, 3]
        assert mesh.load() == [0, 0]


def test_cancelling_the_task_that_awaits_a_call_cancels_the_call_in_its_actor(
    ray_cluster: None,
) -> None:
    """As for an asyncio future (issue 33): `asyncio.wait_for` timing out cancels the call, and
    an asyncio actor sees its coroutine cancelled; `asyncio.shield` keeps a call running."""
    with am.ActorMesh(Gated, shape=1, num_cpus=0.1) as mesh:
        never, later = signal(), signal()

        async def impatient() -> None:
            gated = mesh.methods.gate.choose(never)
            waiters(never, 1)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(gated, 0.5)
            shielded = mesh.methods.gate.choose(later)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(shielded), 0.5)
            later.send.remote()
            await shielded  # still running, and it ends

        asyncio.run(impatient())
        # Ray delivers a cancel to the actor when it can, as it does for `ray.cancel`: under load
        # it may land after the calls that follow it.
        wait_until(lambda: mesh.methods.cancelled_calls.choose().get(timeout=60) == 1)
        assert mesh.methods.cancelled_calls.choose().get(timeout=60) == 1  # once, never twice
        assert mesh.load() == [0]


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_calls_cancelled_or_timed_out_on_an_asyncio_mesh_actor_never_eject_it(
    ray_cluster: None, how: str,
) -> None:
    """A cancel is the caller's doing, not a failure of the actor: six in a row (five failures
    in a row eject an actor) leave it in the mesh, and each is counted as what it was."""
    with am.ActorMesh(Gated, shape=2, num_cpus=0.1) as mesh:
        for _ in range(2):
            mesh.methods.cancelled_calls.all().get(timeout=60)
        for _ in range(6):
            never = signal()
            gate = mesh[0].methods.gate
            if how == "cancel":
                call = gate.choose(never)
                waiters(never, 1)  # it runs
                call.cancel()
            else:  # running, or (on a loaded machine) not yet started when it times out
                gate.options(timeout=0.5).choose(never)
            wait_until(lambda: mesh.load()[0] == 0)
        assert not any(actor.ejected for actor in mesh.load().actors)
        assert mesh.stats()["calls"]["gate"]["cancelled" if how == "cancel" else "timeout"] == 6
        assert mesh.stats()["calls"]["gate"]["error"] == 0
        if how == "cancel":
            wait_until(lambda: mesh[0].methods.cancelled_calls.choose().get(timeout=60) == 6)


def test_the_mesh_counts_each_call_and_each_task_in_its_stats(
    pair: am.ActorMesh[Logged],
) -> None:
    before = pair.stats()["calls"].get("value", {"ok": 0, "error": 0})
    one = pair[0]
    sig = signal()
    blocked = one.methods.block.choose(sig)
    waiters(sig, 1)
    futures = [one.methods.value.choose(x) for x in (1, -1, 3, 4)]  # they ride one task
    sig.send.remote()
    blocked.get(timeout=60)
    assert [futures[i].get(timeout=60) for i in (0, 2, 3)] == [1, 3, 4]
    with pytest.raises(am.ActorError):
        futures[1].get(timeout=60)
    stats = pair.stats()
    assert stats["calls"]["value"]["ok"] - before["ok"] == 3
    assert stats["calls"]["value"]["error"] - before["error"] == 1
    assert stats["batch_calls"]["value"]["count"] >= 1
    assert stats["in_flight"] == 0 and stats["queued"] == 0
