"""The core contract on a real local Ray cluster: create, index, call, collect."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from workers import ENV_NAMES, AsyncWorker, Boxes, Worker, signal, wait_until

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[am.ActorMesh[Worker]]:
    with am.ActorMesh(Worker, shape={"dp": 2, "tp": 2}, args=(3,), num_cpus=0.5) as m:
        yield m


@pytest.fixture(scope="module")
def boxes(ray_cluster: None) -> Iterator[am.ActorMesh[Boxes]]:
    with am.ActorMesh(Boxes, shape=1, num_cpus=0.1) as m:
        yield m


@pytest.fixture(scope="module")
def async_mesh(ray_cluster: None) -> Iterator[am.ActorMesh[AsyncWorker]]:
    with am.ActorMesh(AsyncWorker, shape=2, num_cpus=0.5) as m:
        yield m


# -- creation -------------------------------------------------------------------------------
def test_shape_dims_size_and_actors(mesh: am.ActorMesh[Worker]) -> None:
    assert dict(mesh.shape) == {"dp": 2, "tp": 2}
    assert mesh.dims == ("dp", "tp")
    assert mesh.size == len(mesh) == 4
    assert len(mesh.actors) == 4


def test_each_actor_knows_its_rank_and_environment_before_init(mesh: am.ActorMesh[Worker]) -> None:
    identities = mesh.methods.identity.all().get(timeout=60)
    for rank, (env, point) in enumerate(identities):
        coords = {"dp": rank // 2, "tp": rank % 2}
        assert env == {
            "ACTORMESH_RANK": str(rank),
            "ACTORMESH_WORLD_SIZE": "4",
            "ACTORMESH_COORDS": f"dp={coords['dp']},tp={coords['tp']}",
            "ACTORMESH_SHAPE": "dp=2,tp=2",
            "RAY_ACTOR_MESH_RANK": str(rank),
        }
        assert set(env) == set(ENV_NAMES)
        assert point == (rank, coords, {"dp": 2, "tp": 2}, 4)


def test_current_rank_outside_an_actor_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="only available inside an actor"):
        am.current_rank()


# -- the verbs --------------------------------------------------------------------------------
def test_all_calls_every_actor_and_lays_results_on_the_shape(mesh: am.ActorMesh[Worker]) -> None:
    values = mesh.methods.rank.all().get(timeout=60)
    assert list(values) == [0, 1, 2, 3]
    assert values[1, 0] == 2
    assert values.item(dp=0, tp=1) == 1
    assert [(p.rank, p.coords) for p, _ in values.items()][3] == (3, {"dp": 1, "tp": 1})


def test_choose_calls_one_actor(mesh: am.ActorMesh[Worker]) -> None:
    assert mesh.methods.f.choose(2).get(timeout=60) == 6


def test_shard_splits_the_batch_and_concatenates_in_rank_order(mesh: am.ActorMesh[Worker]) -> None:
    assert mesh.methods.process.shard([1, 2, 3, 4, 5, 6], 5).get(timeout=60) == [6, 7, 8, 9, 10, 11]


def test_shard_without_dispatch_is_a_clear_error(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(TypeError, match="Worker.f has no dispatch"):
        mesh.methods.f.shard(1)


def test_options_dispatch_enables_shard(mesh: am.ActorMesh[Worker]) -> None:
    method = mesh.methods.double.options(dispatch=am.dispatch.split())
    assert method.shard([1, 2, 3, 4, 5]).get(timeout=60) == [2, 4, 6, 8, 10]


def test_decorated_method_called_inside_the_actor_runs_plainly(mesh: am.ActorMesh[Worker]) -> None:
    assert mesh.methods.f_plus_one.choose(1).get(timeout=60) == 4


def test_async_methods_yield_the_awaited_value(async_mesh: am.ActorMesh[AsyncWorker]) -> None:
    assert list(async_mesh.methods.g.all(1).get(timeout=60)) == ["g1", "g1"]
    assert async_mesh.methods.twice.choose(2).get(timeout=60) == "g2g2"


def test_futures_can_be_awaited(mesh: am.ActorMesh[Worker]) -> None:
    async def both() -> tuple[int, am.ValueMesh[int]]:
        return await mesh.methods.f.choose(1), await mesh.methods.f.all(1)

    one, every = asyncio.run(both())
    assert one == 3 and list(every) == [3, 3, 3, 3]


def test_results_as_completed_keep_their_coordinates(mesh: am.ActorMesh[Worker]) -> None:
    seen = {point.rank: value for point, value in mesh.methods.rank.all().as_completed(timeout=60)}
    assert seen == {0: 0, 1: 1, 2: 2, 3: 3}


def test_results_async_for_keep_their_coordinates(mesh: am.ActorMesh[Worker]) -> None:
    async def collect() -> dict[int, int]:
        return {p.rank: v async for p, v in mesh.methods.rank.all()}

    assert asyncio.run(collect()) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_future_exposes_object_refs_and_done(mesh: am.ActorMesh[Worker]) -> None:
    import ray

    future = mesh.methods.f.all(1)
    assert len(future.refs) == 4
    assert ray.get(future.refs) == [3, 3, 3, 3]
    future.get(timeout=60)
    assert future.done()
    one = mesh.methods.f.choose(1)
    assert ray.get(one.ref) == 3


def test_get_timeout_raises_timeout_error(mesh: am.ActorMesh[Worker]) -> None:
    sig = signal()
    future = mesh[0, 0].methods.block.choose(sig)
    with pytest.raises(TimeoutError, match="did not finish within 0.01 s"):
        future.get(timeout=0.01)
    sig.send.remote()
    assert future.get(timeout=60) == 0


def test_option_timeout_fails_the_call(mesh: am.ActorMesh[Worker]) -> None:
    sig = signal()
    future = mesh[0, 1].methods.block.options(timeout=0.05).choose(sig)
    with pytest.raises(am.MeshTimeoutError, match="timeout=0.05"):
        future.get(timeout=60)
    sig.send.remote()


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, -2.0])
def test_a_timeout_must_be_finite_and_positive(mesh: am.ActorMesh[Worker], bad: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        mesh.methods.f.options(timeout=bad)
    sig = signal()
    future = mesh[0, 1].methods.block.options(timeout=0.05).choose(sig)  # timers still run
    with pytest.raises(am.MeshTimeoutError):
        future.get(timeout=60)
    sig.send.remote()


def test_a_finished_call_with_a_long_timeout_keeps_nothing_alive(
        boxes: am.ActorMesh[Boxes]) -> None:
    future = boxes.methods.box.options(timeout=600).choose(7)
    value = future.get(timeout=60)
    assert value.payload == 7
    alive = weakref.ref(value)
    del future, value
    gc.collect()
    assert alive() is None


# -- errors ---------------------------------------------------------------------------------
def test_an_actor_error_names_rank_and_coordinates(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(am.ActorError, match=r"rank 3 \(dp=1,tp=1\) raised ValueError: boom") as info:
        mesh[1, 1].methods.fail.choose("boom").get(timeout=60)
    assert info.value.rank == 3 and info.value.coords == {"dp": 1, "tp": 1}
    assert isinstance(info.value.cause, ValueError)


def test_return_exceptions_puts_errors_in_the_value_mesh(mesh: am.ActorMesh[Worker]) -> None:
    values = mesh.methods.fail.options(return_exceptions=True).all("x").get(timeout=60)
    assert all(isinstance(v, am.ActorError) for v in values)
    assert [v.rank for v in values if isinstance(v, am.ActorError)] == [0, 1, 2, 3]


def test_unknown_method_is_an_attribute_error(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(AttributeError, match="Worker has no method 'nope'"):
        mesh.methods.nope  # type: ignore[attr-defined]  # noqa: B018


def test_calling_a_mesh_method_directly_is_a_clear_error(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(TypeError, match="choose"):
        mesh.methods.f(1)


def test_bad_shape_fails_before_any_actor_starts() -> None:
    with pytest.raises(ValueError, match=r"shape \{'dp': 0\}"):
        am.ActorMesh(Worker, shape={"dp": 0})


def test_bundle_count_mismatch_names_both_numbers() -> None:
    placement = am.Placement(bundles=[{"CPU": 0.1}] * 3)
    with pytest.raises(ValueError, match="3 bundles but the mesh has 4 actors"):
        am.ActorMesh(Worker, shape=(2, 2), placement=placement)


def test_unknown_balancer_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'fastest'"):
        am.ActorMesh(Worker, shape=2, balancer="fastest")  # type: ignore[arg-type]


# -- sub-meshes -------------------------------------------------------------------------------
def test_int_index_drops_a_dim_and_slices_keep_it(mesh: am.ActorMesh[Worker]) -> None:
    row = mesh[1]
    assert dict(row.shape) == {"tp": 2}
    assert list(row.methods.rank.all().get(timeout=60)) == [2, 3]
    column = mesh[:, 0]
    assert dict(column.shape) == {"dp": 2}
    assert list(column.methods.rank.all().get(timeout=60)) == [0, 2]
    assert list(mesh[1, :].methods.rank.all().get(timeout=60)) == [2, 3]
    assert list(mesh[0:2].methods.rank.all().get(timeout=60)) == [0, 1, 2, 3]


def test_full_index_is_a_mesh_of_one_actor(mesh: am.ActorMesh[Worker]) -> None:
    one = mesh[1, 0]
    assert one.size == 1
    assert [one.methods.rank.choose().get(timeout=60) for _ in range(3)] == [2, 2, 2]


def test_slice_by_dim_name(mesh: am.ActorMesh[Worker]) -> None:
    assert list(mesh.slice(dp=1).methods.rank.all().get(timeout=60)) == [2, 3]
    assert list(mesh.slice(tp=slice(0, 1)).methods.rank.all().get(timeout=60)) == [0, 2]


def test_bad_indices_name_the_mesh_shape(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(IndexError, match=r"\{dp=2, tp=2\}"):
        mesh[2]
    with pytest.raises(KeyError, match=r"\{dp=2, tp=2\}"):
        mesh.slice(pp=0)


def test_views_share_load_state(mesh: am.ActorMesh[Worker]) -> None:
    sig = signal()
    busy = mesh[0, 0].methods.block.choose(sig)
    try:
        assert mesh.load()[0] == 1  # the parent sees the view's call in flight
        picks = [mesh[0].methods.rank.choose().get(timeout=60) for _ in range(4)]
        assert picks == [1, 1, 1, 1]  # the view's pow2 avoids the busy actor
    finally:
        sig.send.remote()
        busy.get(timeout=60)


def test_load_returns_to_zero(mesh: am.ActorMesh[Worker]) -> None:
    futures = [mesh.methods.f.choose(i) for i in range(50)]
    for future in futures:
        future.get(timeout=60)
    mesh.methods.f.all(1).get(timeout=60)
    assert mesh.load() == [0, 0, 0, 0]


def test_dropped_choose_futures_still_free_their_slots(mesh: am.ActorMesh[Worker]) -> None:
    """Fire and forget: the count drops when the call ends, not when somebody reads it."""
    for i in range(40):
        mesh.methods.f.choose(i)
    gc.collect()
    wait_until(lambda: mesh.load() == [0, 0, 0, 0])


def test_a_choose_slot_is_freed_before_its_value_is_read(mesh: am.ActorMesh[Worker]) -> None:
    future = mesh[0, 0].methods.f.choose(2)
    wait_until(lambda: future.done())
    assert mesh.load()[0] == 0  # freed by the end of the call, the value still unread
    assert future.get(timeout=60) == 6


def test_a_ready_value_read_by_many_threads_is_read_once_and_agrees(
        mesh: am.ActorMesh[Worker]) -> None:
    future = mesh.methods.scaled.choose(np.arange(100_000.0))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda _: future.get(timeout=60), range(8)))
    assert all(v is values[0] for v in values)
    assert float(values[0].sum()) == float(np.arange(100_000.0).sum())


def test_many_threads_waiting_on_one_future_all_wake(mesh: am.ActorMesh[Worker]) -> None:
    sig = signal()
    future = mesh[0, 0].methods.block.choose(sig)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        waits = [pool.submit(future.get, 60) for _ in range(6)]
        with pytest.raises(TimeoutError):
            future.get(timeout=0.0)
        sig.send.remote()
        assert [w.result(timeout=60) for w in waits] == [0] * 6


def test_an_error_read_late_still_names_the_actor(mesh: am.ActorMesh[Worker]) -> None:
    """A `choose` value is read when asked for; its error is mapped then, awaited or not."""
    failing = mesh[1, 0].methods.fail.choose("late")
    wait_until(failing.done)

    async def read() -> None:
        await failing

    with pytest.raises(am.ActorError, match=r"rank 2 \(dp=1,tp=0\) raised ValueError: late"):
        asyncio.run(read())
    caught = mesh[1, 0].methods.fail.options(return_exceptions=True).choose("kept").get(timeout=60)
    assert isinstance(caught, am.ActorError) and caught.rank == 2


def test_arguments_are_released_once_sent(mesh: am.ActorMesh[Worker]) -> None:
    """Ray holds what it sent; a pending future does not keep the caller's arguments alive."""
    sig = signal()
    batch = np.zeros(1_000_000, dtype=np.uint8)
    alive = weakref.ref(batch)
    future = mesh[0, 0].methods.block_then_length.choose(sig, batch)
    del batch
    gc.collect()
    assert alive() is None and not future.done()
    sig.send.remote()
    assert future.get(timeout=60) == 1_000_000


# -- arguments ---------------------------------------------------------------------------------
def test_large_argument_to_all_is_put_once(mesh: am.ActorMesh[Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    puts: list[int] = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    batch = np.zeros(1_000_000, dtype=np.uint8)
    assert list(mesh.methods.length.all(batch).get(timeout=60)) == [1_000_000] * 4
    assert len(puts) == 1


def test_calls_after_shutdown_fail_at_once(ray_cluster: None) -> None:
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1) as m:
        pass
    for verb in (m.methods.f.all, m.methods.f.choose, m.methods.process.shard):
        with pytest.raises(am.MeshError, match="shut down"):
            verb([1])  # type: ignore[arg-type]


def test_prototype_example(ray_cluster: None) -> None:
    """The example of Ray's ActorMesh prototype (PR #54760), written for this API."""
    with am.ActorMesh(Worker, shape=(2, 3), num_cpus=0.1) as m:
        assert m.size == 6  # the product of the sizes, not their sum
        assert list(m.methods.f.all(1).get(timeout=60)) == [1] * 6
        assert m.methods.f.choose(1).get(timeout=60) == 1
        assert m.methods.add.choose(1, 2).get(timeout=60) == 3
        assert m.methods.process.shard([1, 2, 3, 4, 5, 6], 5).get(timeout=60) == [6, 7, 8, 9, 10, 11]


# -- running set-up code inside the actors ------------------------------------------------------
def _scaled_rank(worker: Worker, x: int) -> tuple[int, int]:
    return worker.scale * x, am.current_rank().rank


async def _plus_one(_: object, x: int) -> int:
    return x + 1


def test_run_in_actors_runs_a_function_on_each_actor_instance(mesh: am.ActorMesh[Worker]) -> None:
    assert list(mesh.run_in_actors(_scaled_rank, 2).get(timeout=60)) == [(6, r) for r in range(4)]
    assert list(mesh.slice(dp=1).run_in_actors(_plus_one, 1).get(timeout=60)) == [2, 2]


def test_run_in_actors_awaits_coroutines_in_async_actors(
    async_mesh: am.ActorMesh[AsyncWorker],
) -> None:
    assert list(async_mesh.run_in_actors(_plus_one, 4).get(timeout=60)) == [5, 5]


# -- how the library runs the actors and the callbacks ------------------------------------------
def test_a_sync_actor_runs_its_methods_on_its_init_thread(mesh: am.ActorMesh[Worker]) -> None:
    """As in a plain Ray actor: thread-local state set in __init__ (a CUDA device) is seen."""
    assert list(mesh.methods.threading_seen.all().get(timeout=60)) == [(True, True)] * 4


def test_an_actor_whose_only_async_methods_are_am_methods_is_async(
    async_mesh: am.ActorMesh[AsyncWorker],
) -> None:
    """Two calls on one actor at once: the second opens what the first waits for."""
    one = async_mesh[0]
    waiting = one.methods.wait_open.choose()
    one.methods.open_gate.choose().get(timeout=60)
    assert waiting.get(timeout=60) == "opened"


def test_a_done_callback_that_raises_is_logged_and_does_not_stop_the_others(
    mesh: am.ActorMesh[Worker], caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import threading

    future = mesh.methods.f.choose(2)
    later = threading.Event()

    def bad(_: am.MeshFuture[int]) -> None:
        raise KeyError("callback bug")

    with caplog.at_level(logging.ERROR, logger="actormesh"):
        future.add_done_callback(bad)
        future.add_done_callback(lambda f: later.set() if f.get(timeout=10) == 6 else None)
        assert later.wait(60)
    assert "callback bug" in caplog.text

    async def awaited() -> int:
        return await future

    assert asyncio.run(awaited()) == 6


def test_as_completed_on_a_call_that_was_never_sent_raises_its_error() -> None:
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1) as lonely:
        lonely.wait_ready(60)
        import ray

        ray.kill(lonely.actors[0])
        wait_until(lambda: lonely.load().actors[0].alive is False
                   and not lonely.load().actors[0].restarting)
        future = lonely.methods.rank.choose()
        with pytest.raises(am.NoLiveActorsError):
            list(future.as_completed(timeout=60))
