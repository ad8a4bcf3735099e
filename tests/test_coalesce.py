"""Coalescing on real actors: calls that wait for an actor ride one Ray task, and each keeps its
own value or error, cancellation, retries and count in the load table.

To make calls wait deterministically, each test first holds the actors it uses with a call
blocked on a signal (meshes here allow one Ray task per actor), queues its calls, then sends the
signal: the slot that frees takes the waiting calls as one batch. The budget of expected service
time is made large, and the methods measured first (an unmeasured method starts with small
batches), so that batch sizes depend on the calls queued, not on timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import ray
from coalesce_workers import AsyncBatched, Batched, PlainAsync, PlainSync
from workers import signal, wait_until, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")

R = TypeVar("R")
ONE_TASK = am.Policy("adaptive", max_tasks=1, batch_budget_s=60.0)


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[am.ActorMesh[Batched]]:
    with am.ActorMesh(Batched, shape=2, num_cpus=0.1, balancer=ONE_TASK) as m:
        measured(m)
        yield m


def measured(mesh: am.ActorMesh[Batched]) -> am.ActorMesh[Batched]:
    """`mesh`, its methods' service times measured (a call on every actor, twice: an actor's
    first call may have waited for its start-up, and measures nothing)."""
    for _ in range(2):
        am.get([mesh.methods.where.all(-1), mesh.methods.checked.all(0),
                mesh.methods.echo.all(0), mesh.methods.counted.all(-1)], timeout=60)
    return mesh


def hold(mesh: am.ActorMesh[Any]) -> tuple[Any, list[am.MeshFuture[Any]]]:
    """Occupy every actor of `mesh` with a call blocked on a new signal; returns the signal and
    the blocked calls. Calls made next wait in the mesh's queue until the signal is sent."""
    sig = signal()
    views = [mesh[rank] for rank in range(mesh.size)] if mesh.dims else [mesh]
    blocked = [view.methods.block.choose(sig) for view in views]
    waiters(sig, mesh.size)
    return sig, blocked


def sent_signal() -> Any:
    sig = signal()
    sig.send.remote()
    return sig


def release(sig: Any, blocked: list[am.MeshFuture[Any]]) -> None:
    sig.send.remote()
    am.get(blocked, timeout=60)


def ride(mesh: am.ActorMesh[Any], make: Callable[[], list[am.MeshFuture[R]]]) -> list[R]:
    """The values of the calls `make()` makes while every actor of `mesh` is held: they wait,
    then ride together when the actors are released."""
    sig, blocked = hold(mesh)
    futures = make()
    release(sig, blocked)
    return am.get(futures, timeout=60)


def tasks_of(results: list[tuple[int, str, str]]) -> set[str]:
    return {task_id for _, task_id, _ in results}


def test_calls_that_wait_ride_one_task_and_each_keeps_its_value(
    mesh: am.ActorMesh[Batched],
) -> None:
    one = mesh[0]
    sig, blocked = hold(one)
    futures = [one.methods.where.choose(x) for x in range(10)]
    assert mesh._root.router.scheduler.queued() == 10
    release(sig, blocked)
    results = am.get(futures, timeout=60)
    assert [x for x, _, _ in results] == list(range(10))
    assert len(tasks_of(results)) == 1
    assert {name for _, _, name in results} == {"where"}  # the dashboard shows the method
    assert one.methods.ran_in_order.choose().get(timeout=60)[-10:] == list(range(10))


def test_a_lone_call_under_light_load_is_its_own_task(mesh: am.ActorMesh[Batched]) -> None:
    results = [mesh.methods.where.choose(x).get(timeout=60) for x in range(3)]
    assert len(tasks_of(results)) == 3
    assert {name for _, _, name in results} == {"Batched.where"}


def test_a_call_that_raises_in_a_batch_fails_alone_and_as_it_would_alone(
    mesh: am.ActorMesh[Batched],
) -> None:
    one = mesh[0]
    alone = one.methods.checked.choose(-7)
    with pytest.raises(am.ActorError) as lone_error:
        alone.get(timeout=60)
    sig, blocked = hold(one)
    futures = [one.methods.checked.choose(x) for x in (1, -7, 3)]
    release(sig, blocked)
    assert futures[0].get(timeout=60) == 1 and futures[2].get(timeout=60) == 3
    with pytest.raises(am.ActorError) as batched_error:
        futures[1].get(timeout=60)
    for error in (lone_error.value, batched_error.value):
        assert str(error).splitlines()[0] == \
            "checked on rank 0 (rank=0) raised ValueError: negative: -7"
        assert type(error.cause) is ValueError


def test_calls_of_a_method_declared_alone_are_never_batched(mesh: am.ActorMesh[Batched]) -> None:
    one = mesh[0]
    results = ride(one, lambda: [one.methods.alone.choose(x) for x in range(4)])
    assert len(tasks_of(results)) == 4
    assert {name for _, _, name in results} == {"Batched.alone"}


def test_coalesce_1_sends_every_call_alone() -> None:
    with am.ActorMesh(Batched, num_cpus=0.1, balancer=ONE_TASK, coalesce=1) as one:
        measured(one)
        results = ride(one, lambda: [one.methods.where.choose(x) for x in range(4)])
        assert len(tasks_of(results)) == 4


def test_a_call_cancelled_while_it_waits_never_runs_and_the_others_ride(
    mesh: am.ActorMesh[Batched],
) -> None:
    one = mesh[0]
    sig, blocked = hold(one)
    futures = [one.methods.where.choose(x) for x in range(5)]
    futures[2].cancel()
    release(sig, blocked)
    with pytest.raises(cf.CancelledError):
        futures[2].get(timeout=60)
    results = am.get([f for i, f in enumerate(futures) if i != 2], timeout=60)
    assert [x for x, _, _ in results] == [0, 1, 3, 4] and len(tasks_of(results)) == 1
    assert 2 not in one.methods.ran_in_order.choose().get(timeout=60)[-4:]


def test_an_object_ref_argument_is_resolved_as_for_a_lone_call(
    mesh: am.ActorMesh[Batched],
) -> None:
    one = mesh[0]
    ref = ray.put([1, 2, 3])
    values = ride(one, lambda: [one.methods.echo.choose(5), one.methods.echo.choose(ref),
                                one.methods.echo.choose(value=ref)])
    assert values == [5, [1, 2, 3], [1, 2, 3]]


def test_a_batched_call_has_an_object_ref_of_its_own_value(mesh: am.ActorMesh[Batched]) -> None:
    one = mesh[0]
    sig, blocked = hold(one)
    futures = [one.methods.checked.choose(x) for x in (4, -4)]
    sig.send.remote()  # the calls may still wait for a slot: `.ref` waits for them
    assert ray.get(futures[0].ref, timeout=60) == 4
    with pytest.raises(ValueError, match="negative: -4"):
        ray.get(futures[1].ref, timeout=60)
    assert len(futures[0]._calls[0].task.results) == 2  # they rode one task
    am.get(blocked, timeout=60)


@pytest.mark.parametrize("retries", [0, 1])
def test_a_batch_on_an_actor_that_dies_fails_or_reroutes_each_call_and_runs_none_twice(
    retries: int,
) -> None:
    with am.ActorMesh(Batched, shape=2, num_cpus=0.1, balancer=ONE_TASK) as pair:
        measured(pair)
        sig, blocked = hold(pair)
        doomed = signal()
        first = pair.methods.block.choose(doomed)  # heads the batch: the others wait behind it
        calls = [pair.methods.counted.options(retries=retries).choose(x) for x in range(6)]
        sig.send.remote()
        waiters(doomed, 1)
        victim = first._calls[0].actor  # the actor whose slot freed first took the batch
        survivor_pid = pair[1 - victim].methods.counted.choose(-2).get(timeout=60)[1]
        ray.kill(pair.actors[victim])
        with pytest.raises(am.ActorDiedError, match=f"rank {victim}"):
            first.get(timeout=60)
        if retries:
            assert [c.get(timeout=60) for c in calls] == [(x, survivor_pid) for x in range(6)]
            counts = pair[1 - victim].methods.execution_counts.choose().get(timeout=60)
            assert counts == {-1: 2, -2: 1, **{x: 1 for x in range(6)}}  # -1: `measured`, twice
        else:
            for call in calls:
                with pytest.raises(am.ActorDiedError):
                    call.get(timeout=60)
        assert pair.load()[victim] == 0


def test_an_asyncio_actor_runs_a_batch_concurrently() -> None:
    with am.ActorMesh(AsyncBatched, num_cpus=0.1, balancer=ONE_TASK) as one:
        for _ in range(2):  # measured: the first call may have waited for the start-up
            one.methods.gate.all(sent_signal(), 0).get(timeout=60)
        sig, blocked = hold(one)
        gate = signal()
        futures = [one.methods.gate.choose(gate, x) for x in range(5)]
        release(sig, blocked)
        waiters(gate, 5)  # every call of the batch is waiting at once
        gate.send.remote()
        results = am.get(futures, timeout=60)
        assert [x for x, _, _ in results] == list(range(5)) and len(tasks_of(results)) == 1


def test_asyncio_actors_get_no_task_bound_by_default() -> None:
    """A call to an asyncio actor may wait for a later one: a bound on its tasks would hold the
    later one back for ever."""
    with am.ActorMesh(AsyncBatched, num_cpus=0.1) as one:
        gate = signal()
        futures = [one.methods.gate.choose(gate, x) for x in range(3)]
        waiters(gate, 3)  # all three run at once
        gate.send.remote()
        assert [x for x, _, _ in am.get(futures, timeout=60)] == [0, 1, 2]


def test_actors_made_elsewhere_run_batches_through_ray_call_unless_they_run_calls_at_once(
) -> None:
    actors = [PlainSync.remote(), PlainAsync.remote()]  # type: ignore[attr-defined]
    sync_mesh = am.ActorMesh.from_actors(actors[:1], balancer=ONE_TASK)
    async_mesh = am.ActorMesh.from_actors(actors[1:], balancer=ONE_TASK)
    try:
        am.get([sync_mesh.methods.where.all(0), sync_mesh.methods.checked.all(0),
                async_mesh.methods.gate.all(sent_signal(), 0), async_mesh.methods.plain.all(0)],
               timeout=60)
        sig, blocked = hold(sync_mesh)
        futures = [sync_mesh.methods.where.choose(x) for x in range(4)]
        failing = sync_mesh.methods.checked.choose(-2)
        release(sig, blocked)
        results = am.get(futures, timeout=60)
        assert [x for x, _, _ in results] == list(range(4)) and len(tasks_of(results)) == 1
        assert {name for _, _, name in results} == {"where+checked"}  # after its methods
        with pytest.raises(am.ActorError, match="negative: -2"):
            failing.get(timeout=60)

        gate, later = signal(), signal()
        held = async_mesh.methods.gate.choose(gate, -1)
        waiters(gate, 1)
        futures = [async_mesh.methods.gate.choose(later, x) for x in range(3)]
        plain = async_mesh.methods.plain.choose(7)
        gate.send.remote()
        held.get(timeout=60)
        later.send.remote()
        results = am.get(futures, timeout=60)
        # an asyncio actor made elsewhere has no runner of the library's (to bound and cancel
        # its calls): each call is its own Ray task
        assert [x for x, _, _ in results] == [0, 1, 2] and len(tasks_of(results)) == 3
        assert plain.get(timeout=60) == 7
    finally:
        sync_mesh.shutdown()
        async_mesh.shutdown()
        for actor in actors:
            ray.kill(actor)


def test_map_batches_and_keeps_order_and_errors(mesh: am.ActorMesh[Batched]) -> None:
    results = list(mesh.methods.where.map(range(300)))
    assert [x for x, _, _ in results] == list(range(300))
    assert len(tasks_of(results)) < 300
    out = list(mesh.methods.checked.options(return_exceptions=True).map([1, -2, 3] * 20))
    assert out[0::3] == [1] * 20 and out[2::3] == [3] * 20
    assert all(isinstance(e, am.ActorError) and "negative: -2" in str(e) for e in out[1::3])


def test_load_counts_each_call_of_a_batch_and_returns_to_zero(
    mesh: am.ActorMesh[Batched],
) -> None:
    one = mesh[0]
    ride(one, lambda: [one.methods.where.choose(x) for x in range(8)])
    scheduler = mesh._root.router.scheduler
    wait_until(lambda: mesh.load() == [0, 0] and scheduler.tasks() == [0, 0])


def test_futures_of_batched_calls_can_be_awaited(mesh: am.ActorMesh[Batched]) -> None:
    one = mesh[0]
    sig, blocked = hold(one)
    futures = [one.methods.checked.choose(x) for x in (1, -1, 2)]
    release(sig, blocked)

    async def read() -> list[Any]:
        return list(await asyncio.gather(*futures, return_exceptions=True))

    values = asyncio.run(read())
    assert values[0] == 1 and values[2] == 2 and isinstance(values[1], am.ActorError)


def test_bad_coalesce_settings_are_refused_before_any_actor_starts() -> None:
    for bad in (0, -1, 1.5, True, "64"):
        with pytest.raises(ValueError, match=f"coalesce={bad!r}"):
            am.ActorMesh(Batched, coalesce=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="coalesce='no'"):
        am.method(coalesce="no")  # type: ignore[arg-type]
