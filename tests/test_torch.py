"""The torch integration on real processes: gloo worlds of Ray actors, links, restarts, deaths.
(The DDP example runs with the other examples, in tests/test_examples.py.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from torch_workers import AsyncPlainWorker, PlainWorker, Signal, TorchWorker

import actormesh as am
from actormesh.integrations.torch import TorchMesh, TorchWorld, link
from actormesh.integrations.torch._rendezvous import (
    Arrival,
    Assignment,
    Rendezvous,
    Superseded,
    assign,
)
from actormesh.integrations.torch._world import dim_groups

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[TorchMesh[TorchWorker]]:
    with TorchMesh(TorchWorker, {"dp": 2, "tp": 2}, num_cpus=0.5, args=("tagged",)) as m:
        m.wait_ready(timeout=180)
        yield m


@pytest.fixture(scope="module")
def plain(ray_cluster: None) -> Iterator[am.ActorMesh[PlainWorker]]:
    with am.ActorMesh(PlainWorker, 3, num_cpus=0.5) as m:
        m.wait_ready(timeout=180)
        yield m


# -- the world ----------------------------------------------------------------------------------
def test_each_actor_is_in_the_world_with_torchrun_variables_before_init(
    mesh: TorchMesh[TorchWorker],
) -> None:
    joined = list(mesh.methods.joined.all().get(timeout=60))
    port = joined[0]["env"]["MASTER_PORT"]
    assert port.isdigit() and 0 < int(port) < 65536
    for rank, state in enumerate(joined):
        assert state["env"] == {
            "MASTER_ADDR": ray.util.get_node_ip_address(),  # rank 0's node: this one
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank),  # one node: local ranks are the ranks
            "LOCAL_WORLD_SIZE": "4",
        }
        assert (state["initialized"], state["rank"], state["world_size"]) == (True, rank, 4)
        assert (state["backend"], state["tag"]) == ("gloo", "tagged")


def test_a_torch_mesh_is_an_actor_mesh_with_its_views(mesh: TorchMesh[TorchWorker]) -> None:
    assert isinstance(mesh, am.ActorMesh)
    assert dict(mesh.shape) == {"dp": 2, "tp": 2}
    assert (mesh.backend, mesh.epoch) == ("gloo", 0)
    worlds = [w["world"] for w in mesh.slice(dp=1).methods.world.all().get(timeout=60)]
    assert [(w.rank, w.world_size, w.epoch) for w in worlds] == [(2, 4, 0), (3, 4, 0)]


def test_world_all_reduce_sums_over_every_actor(mesh: TorchMesh[TorchWorker]) -> None:
    assert list(mesh.methods.world_sum.all(1.5).get(timeout=60)) == [15.0] * 4  # 1.5 * (1+2+3+4)


def test_each_dim_has_the_group_of_actors_sharing_the_other_coordinates(
    mesh: TorchMesh[TorchWorker],
) -> None:
    dp = list(mesh.methods.dim_sum.all("dp").get(timeout=60))
    assert dp == [(2.0, [0, 2]), (4.0, [1, 3]), (2.0, [0, 2]), (4.0, [1, 3])]
    tp = list(mesh.methods.dim_sum.all("tp").get(timeout=60))
    assert tp == [(1.0, [0, 1]), (1.0, [0, 1]), (5.0, [2, 3]), (5.0, [2, 3])]


def test_an_unknown_group_name_is_an_error_naming_the_known_ones(
    mesh: TorchMesh[TorchWorker],
) -> None:
    with pytest.raises(am.ActorError) as info:
        mesh.methods.group_of.choose("weights").get(timeout=60)
    assert isinstance(info.value.cause, KeyError)
    assert "no process group 'weights'" in str(info.value)
    assert "dims ['dp', 'tp'], links []" in str(info.value)


# -- links --------------------------------------------------------------------------------------
def test_a_link_joins_a_torch_rank_and_plain_meshes_for_a_broadcast(
    mesh: TorchMesh[TorchWorker], plain: am.ActorMesh[PlainWorker],
) -> None:
    with am.ActorMesh(AsyncPlainWorker, 1, num_cpus=0.5) as async_plain:
        weights = link(mesh[1, 1], plain, async_plain, name="weights")
        try:
            assert weights.size == 5
            # World rank 3 is link rank 0: torch translates through the link's own ranks.
            assert list(mesh[1, 1].methods.link_rank.all("weights").get(timeout=60)) == [
                (0, 5, 0)]
            assert list(plain.methods.link_rank.all("weights").get(timeout=60)) == [
                (1, 5, None), (2, 5, None), (3, 5, None)]
            values = [float(v) for v in range(1000)]
            sent = mesh[1, 1].methods.broadcast.all("weights", values)
            received = plain.methods.broadcast.all("weights", [0.0] * 1000)
            received_async = async_plain.methods.broadcast.all("weights", [0.0] * 1000)
            assert list(received.get(timeout=60)) == [values] * 3
            assert list(received_async.get(timeout=60)) == [values]
            assert list(sent.get(timeout=60)) == [values]
            assert list(plain.methods.in_world.all().get(timeout=60)) == [False] * 3
            with pytest.raises(ValueError, match="link 'weights' already exists"):
                link(mesh[0, 0], plain, name="weights")
        finally:
            weights.close()
    with pytest.raises(am.ActorError, match="no process group 'weights'"):
        plain.methods.link_rank.choose("weights").get(timeout=60)


def test_a_link_named_like_a_dim_is_refused(
    mesh: TorchMesh[TorchWorker], plain: am.ActorMesh[PlainWorker],
) -> None:
    with pytest.raises(ValueError, match="link name 'tp' is a dim of"):
        link(mesh[0, 0], plain, name="tp")


def test_a_link_over_overlapping_actors_is_refused(mesh: TorchMesh[TorchWorker]) -> None:
    with pytest.raises(ValueError, match="the meshes overlap: rank 0"):
        link(mesh[0, :], mesh[:, 0], name="overlap")


def test_a_link_with_nccl_needs_gpus(
    mesh: TorchMesh[TorchWorker], plain: am.ActorMesh[PlainWorker],
) -> None:
    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this cluster has GPUs")
    with pytest.raises(ValueError, match="backend='nccl' needs GPUs"):
        link(mesh[0, 0], plain, name="nccl", backend="nccl")


# -- bad input, refused before anything starts ---------------------------------------------------
@pytest.fixture
def nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if an actor (the rendezvous or the mesh's) is started."""
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("an actor was started")

    monkeypatch.setattr(ray, "remote", started)
    monkeypatch.setattr(am.ActorMesh, "__init__", started)


@pytest.mark.usefixtures("nothing_may_start")
@pytest.mark.parametrize(("options", "error", "match"), [
    ({"backend": "nccl"}, ValueError, r"backend='nccl' needs GPUs, and the actors ask for none"),
    ({"backend": "mpi"}, ValueError, r"backend='mpi': unknown; use one of \['gloo', 'nccl'\]"),
    ({"timeout_s": 0}, ValueError, r"timeout_s=0: must be a finite number of seconds > 0"),
    ({"timeout_s": float("inf")}, ValueError, r"timeout_s=inf"),
    ({"join_timeout_s": -1}, ValueError, r"join_timeout_s=-1"),
    ({"args": (1, 2)}, TypeError, r"TorchWorker.__init__.* does not take args=\(1, 2\)"),
])
def test_bad_input_is_refused_before_any_actor_starts(
    options: dict[str, Any], error: type[Exception], match: str,
) -> None:
    with pytest.raises(error, match=match):
        TorchMesh(TorchWorker, 2, **options)


def test_nccl_is_chosen_for_actors_with_gpus_only_when_the_cluster_has_them(
    nothing_may_start: None,
) -> None:
    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this cluster has GPUs")
    with pytest.raises(ValueError, match="this Ray cluster has none"):
        TorchMesh(TorchWorker, 2, num_gpus=1)  # backend=None: nccl, as the actors want GPUs


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks "
                    "on one GPU: 'invalid usage', an ActorError naming the rank)")
def test_actors_with_gpus_form_an_nccl_world() -> None:
    with TorchMesh(TorchWorker, 2, num_gpus=1, num_cpus=0.5) as gpu_mesh:
        gpu_mesh.wait_ready(timeout=180)
        assert gpu_mesh.backend == "nccl"
        # CPU and CUDA tensors, on the world's group and on a dim group (reduced over both)
        assert list(gpu_mesh.methods.world_sums_on_both_devices.all(1.0).get(timeout=60)) == [
            (6.0, 6.0), (6.0, 6.0)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_an_nccl_world_on_one_gpu_reduces_cpu_and_cuda_tensors() -> None:
    """One rank: the world's backend takes CPU tensors (gloo) beside CUDA ones (nccl), on the
    world's group and on a dim group, as on many GPUs (a plain 'nccl' world refuses CPU ones)."""
    with TorchMesh(TorchWorker, 1, num_gpus=1, num_cpus=0.5) as gpu_mesh:
        gpu_mesh.wait_ready(timeout=180)
        assert gpu_mesh.backend == "nccl"
        assert list(gpu_mesh.methods.world_sums_on_both_devices.all(1.0).get(timeout=60)) == [
            (1.0, 1.0)]


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_two_nccl_ranks_on_one_gpu_fail_as_an_actor_error_naming_the_rank() -> None:
    with TorchMesh(TorchWorker, 2, num_gpus=0.5, num_cpus=0.5, timeout_s=30) as shared_gpu:
        with pytest.raises(am.ActorError, match=r"rank [01]"):
            shared_gpu.wait_ready(timeout=180)
            shared_gpu.methods.world_sums_on_both_devices.all(1.0).get(timeout=90)


# -- restarts and deaths ------------------------------------------------------------------------
def test_a_restarted_actor_reforms_the_world_its_groups_and_links_then_on_restart_runs(
    plain: am.ActorMesh[PlainWorker],
) -> None:
    seen: list[tuple[int, list[TorchWorld]]] = []
    back = threading.Event()

    def on_restart(view: am.ActorMesh[TorchWorker]) -> None:
        # The world has formed again by now: the restarted actor's view can use it.
        seen.append((view.points[0].rank, [w["world"] for w in view.methods.world.all().get(60)]))
        back.set()

    with TorchMesh(TorchWorker, {"dp": 2}, num_cpus=0.5, max_restarts=1, timeout_s=20,
                   on_restart=on_restart) as restartable:
        restartable.wait_ready(timeout=180)
        sync = link(restartable[0], plain[0], name="sync")  # includes the actor that restarts
        kept = link(restartable[1], plain[1], name="kept")  # does not: it lives on untouched
        try:
            before = [w["world"] for w in restartable.methods.world.all().get(timeout=60)]
            ray.kill(restartable.actors[0], no_restart=False)  # rank 0: it hosts the store
            assert back.wait(timeout=180), "on_restart did not run"
            after = list(restartable.methods.world.all().get(timeout=60))
            assert restartable.epoch == 1
            assert [(rank, [w.epoch for w in worlds]) for rank, worlds in seen] == [(0, [1])]
            for rank, (old, new) in enumerate(zip(before, after)):
                assert (old.epoch, new["world"].epoch) == (0, 1)
                assert new["world"].rank == rank and new["env"]["RANK"] == str(rank)
                assert new["env"]["MASTER_PORT"] == str(new["world"].master_port)
            assert len({w["world"].master_port for w in after}) == 1
            assert list(restartable.methods.world_sum.all(1.0).get(timeout=60)) == [3.0, 3.0]
            assert list(restartable.methods.dim_sum.all("dp").get(timeout=60)) == [
                (1.0, [0, 1])] * 2
            for name, member in (("sync", 0), ("kept", 1)):
                sent = restartable[member].methods.broadcast.all(name, [4.0, 2.0])
                received = plain[member].methods.broadcast.all(name, [0.0, 0.0])
                assert list(received.get(timeout=60)) == [[4.0, 2.0]], name
                assert list(sent.get(timeout=60)) == [[4.0, 2.0]], name
        finally:
            sync.close()
            kept.close()


def test_a_collective_cut_by_a_death_fails_in_every_survivor() -> None:
    signal: Any = ray.remote(Signal).options(num_cpus=0).remote()
    # A survivor whose ring peer is alive but has failed learns of the cut only at timeout_s:
    # short, as the test waits it out, yet long enough to form the world on two loaded cores.
    with TorchMesh(TorchWorker, 3, num_cpus=0.5, timeout_s=5) as doomed:
        doomed.wait_ready(timeout=180)
        cut = doomed[0:2].methods.sum_after_signal.options(return_exceptions=True).all(signal)
        ray.get(signal.wait_for.remote(2), timeout=60)  # both survivors are entering all_reduce
        ray.kill(doomed.actors[2])
        outcomes = list(cut.get(timeout=120))  # gloo's own default timeout is 30 minutes
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert isinstance(outcome, am.ActorError), outcome
        assert isinstance(outcome.cause, RuntimeError)  # gloo's error (or timeout)


# -- pure logic: no Ray -------------------------------------------------------------------------
def test_dim_groups_are_the_actors_sharing_every_other_coordinate() -> None:
    shape = am.Shape({"dp": 2, "tp": 3})
    assert dim_groups(shape, "dp") == [[0, 3], [1, 4], [2, 5]]
    assert dim_groups(shape, "tp") == [[0, 1, 2], [3, 4, 5]]


def test_local_ranks_count_the_processes_of_each_node_in_rank_order() -> None:
    nodes = ["a", "b", "a", "b", "c"]
    arrivals = [Arrival(r, None, nodes[r], f"10.0.0.{r}", 1234 if r == 0 else None)
                for r in range(5)]
    assigned = assign(3, arrivals)
    assert [(a.local_rank, a.local_world_size, a.group_rank) for a in assigned] == [
        (0, 2, 0), (0, 2, 1), (1, 2, 0), (1, 2, 1), (0, 1, 2)]
    assert {(a.epoch, a.world_size, a.group_world_size, a.master_addr, a.master_port)
            for a in assigned} == {(3, 5, 3, "10.0.0.0", 1234)}


class Invitations:
    """A stand-in for inviting actors: records (actor, epoch) and lets a test wait for them."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self.changed = asyncio.Event()

    async def __call__(self, handle: str, epoch: int) -> None:
        self.sent.append((handle, epoch))
        self.changed.set()

    async def wait_for(self, count: int) -> list[tuple[str, int]]:
        while len(self.sent) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)
        return sorted(self.sent)


def arrival(rank: int, epoch: int | None, port: int = 1000) -> Arrival:
    return Arrival(rank, epoch, "node", "host", port if rank == 0 else None)


def test_a_rank_arriving_again_starts_a_new_epoch_and_invites_the_others() -> None:
    async def scenario() -> None:
        invitations = Invitations()
        rendezvous = Rendezvous(3, wait_s=30)
        await rendezvous.attach(["r0", "r1", "r2"], invitations)
        first = await asyncio.gather(*(rendezvous.arrive(arrival(r, None)) for r in range(3)))
        assert [a.epoch for a in first if isinstance(a, Assignment)] == [0, 0, 0]
        for rank in range(3):
            await rendezvous.formed(rank, 0)
        assert await rendezvous.settled() == 0

        restarted = asyncio.ensure_future(rendezvous.arrive(arrival(1, None)))  # rank 1 is back
        assert await invitations.wait_for(2) == [("r0", 1), ("r2", 1)]
        assert await rendezvous.epoch() == 1
        assert await rendezvous.arrive(arrival(0, 0)) == Superseded(1)  # a stale invitation
        rejoined = await asyncio.gather(rendezvous.arrive(arrival(0, 1, port=2000)),
                                        rendezvous.arrive(arrival(2, 1)), restarted)
        assert {(a.epoch, a.master_port) for a in rejoined if isinstance(a, Assignment)} == {
            (1, 2000)}

    asyncio.run(scenario())


def test_a_new_epoch_supersedes_the_gathering_in_progress_without_inviting_its_waiters() -> None:
    async def scenario() -> None:
        invitations = Invitations()
        rendezvous = Rendezvous(3, wait_s=30)
        await rendezvous.attach(["r0", "r1", "r2"], invitations)
        # Tasks start in the order they are made: ranks 0 and 2 wait, then rank 0 comes back.
        old = asyncio.ensure_future(rendezvous.arrive(arrival(0, None, port=7)))
        waiting = asyncio.ensure_future(rendezvous.arrive(arrival(2, None)))
        new = asyncio.ensure_future(rendezvous.arrive(arrival(0, None, port=8)))
        assert (await old, await waiting) == (Superseded(1), Superseded(1))
        assert await invitations.wait_for(1) == [("r1", 1)]  # rank 2 arrives by itself
        formed = await asyncio.gather(rendezvous.arrive(arrival(2, 1)),
                                      rendezvous.arrive(arrival(1, None)), new)
        assert {(a.epoch, a.master_port) for a in formed if isinstance(a, Assignment)} == {(1, 8)}

    asyncio.run(scenario())

