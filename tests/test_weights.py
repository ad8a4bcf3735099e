"""Weights from a trainer's process straight to the engines (`WeightSender`), and what every
weight update promises, on `FakeEngine`s: one pool of two engines shared by the module, and one
trainer actor per backend (every test of a sender runs over gloo and over ipc). Faults are
armed in the engines (tests/vllm_faults.py) or the trainer (tests/weights_workers.py); waits
are on signals, never on sleeps."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch
from vllm_faults import HOLD_GATE, FlakyEngine, arm_receive, fail_next_resume, process_of
from weights_workers import Trainer, shared_maps, shm_names, undone_since
from workers import Signal, wait_until, waiters

import actormesh as am
from actormesh.integrations.vllm import EnginePool, FakeEngine, WeightSender, WeightUpdateError
from actormesh.integrations.vllm import _sender as sender_mod
from actormesh.integrations.vllm import _weights as weights_mod
from actormesh.integrations.vllm._requests import Sequence, check_sampling
from actormesh.integrations.vllm._sender import Place
from actormesh.integrations.vllm.fake import fake_checkpoint, fake_spec, reference

pytestmark = pytest.mark.usefixtures("ray_cluster")

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
BUCKET_BYTES = 8 * 1024  # the fake model is ~70 KB: a send streams several buckets
CHECKPOINT = fake_checkpoint(fake_spec())


@pytest.fixture(scope="module")
def pool(ray_cluster: None) -> Iterator[EnginePool]:
    with EnginePool("fake", 2, engine_cls=FlakyEngine, num_cpus=0.25, max_restarts=-1,
                    engine_args={"step_s": 0.004}) as p:
        p.wait_ready(timeout=120)
        yield p


@pytest.fixture(scope="module", params=["gloo", "ipc"])
def sender(pool: EnginePool, request: pytest.FixtureRequest) -> WeightSender:
    return pool.weight_sender(backend=request.param, bucket_bytes=BUCKET_BYTES)


@pytest.fixture(scope="module")
def trainer(sender: WeightSender) -> Iterator[am.ActorMesh[Trainer]]:
    with am.ActorMesh(Trainer, 1, args=(sender,), num_cpus=0) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def restorer(pool: EnginePool) -> Iterator[am.ActorMesh[Trainer]]:
    with am.ActorMesh(Trainer, 1, args=(pool.weight_sender(),), num_cpus=0) as mesh:
        yield mesh


@pytest.fixture(autouse=True)
def checkpoint_weights_after(pool: EnginePool,
                             restorer: am.ActorMesh[Trainer]) -> Iterator[None]:
    """Every test leaves the engines on the checkpoint's weights, as it found them."""
    yield
    wait_until(lambda: all(pool.mesh.load().alive), timeout=120)
    restorer.methods.send.choose(CHECKPOINT).get(timeout=120)


def ipc_trainer(pool: EnginePool) -> am.ActorMesh[Trainer]:
    return am.ActorMesh(Trainer, 1, args=(pool.weight_sender(backend="ipc",
                                                             bucket_bytes=BUCKET_BYTES),),
                        num_cpus=0)



def rigged(value: float) -> dict[str, Any]:
    return {**CHECKPOINT, "lm_head.weight": np.full((1000, 8), value, np.float32)}


def served_by_each(pool: EnginePool, max_tokens: int = 6) -> list[tuple[list[int], list[int]]]:
    """(tokens, weight versions) of one greedy request sent to each engine directly."""
    request = Sequence(PROMPT, check_sampling({"max_tokens": max_tokens})).request("direct")
    pieces = [pool.mesh[rank].methods.generate.choose([request]).get(timeout=120)[0]
              for rank in range(pool.mesh.size)]
    return [(p.token_ids, p.versions) for p in pieces]


def test_a_send_from_a_trainer_actor_is_served_by_every_engine(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    weights = rigged(0.5)
    version = trainer.methods.send.choose(weights).get(timeout=120)
    assert version == pool.weight_version
    want = reference(PROMPT, 6, weights)[0]
    assert served_by_each(pool) == [(want, [version] * 6)] * 2
    report = pool.stats()["weight_update"]
    assert report is not None and report.committed and report.version == version
    assert [e.outcome for e in report.engines] == ["loaded", "loaded"]


def test_a_given_version_is_the_one_served_and_an_older_one_is_refused(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    version = pool.weight_version + 10
    assert trainer.methods.send.choose(rigged(0.25), version).get(timeout=120) == version
    with pytest.raises(ValueError, match=f"version={version}: the engines serve weights version "
                                         f"{version}"):
        trainer.methods.send.choose(rigged(0.75), version).get(timeout=120)
    assert pool.weight_version == version


def test_a_partial_send_keeps_the_other_members_of_a_fused_module(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    q = "layers.0.self_attn.q_proj.weight"
    trainer.methods.send.choose({q: CHECKPOINT[q]}).get(timeout=120)  # k and v completed
    want = reference(PROMPT, 6)[0]
    assert [tokens for tokens, _ in served_by_each(pool)] == [want] * 2


def test_unknown_names_and_wrong_shapes_are_refused_before_anything_is_sent(
    pool: EnginePool, sender: WeightSender,
) -> None:
    version = pool.weight_version
    with pytest.raises(ValueError, match="lm_head.wieght"):
        sender.send({"lm_head.wieght": np.zeros((1000, 8), np.float32)})
    with pytest.raises(ValueError, match=r"lm_head.weight: \(8, 8\) instead of \(1000, 8\)"):
        sender.send({"lm_head.weight": np.zeros((8, 8), np.float32)})
    with pytest.raises(ValueError, match="'lm_head.weight' given twice"):
        sender.send([("lm_head.weight", CHECKPOINT["lm_head.weight"])] * 2)
    assert pool.weight_version == version
    assert pool.stats()["weight_update"] is None or pool.stats()["weight_update"].version <= version


def test_gpu_tensors_for_a_gloo_group_are_refused_naming_the_backend(pool: EnginePool) -> None:
    gloo = pool.weight_sender(backend="gloo")
    on_gpu = types.SimpleNamespace(shape=(1000, 8), device=types.SimpleNamespace(type="cuda"))
    with pytest.raises(ValueError, match=r"backend 'gloo' sends CPU tensors, and "
                                         r"\['lm_head.weight'\] are on a GPU"):
        gloo.send({"lm_head.weight": on_gpu})
    with pytest.raises(ValueError, match="backend='mpi'"):
        pool.weight_sender(backend="mpi")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA IPC)")
def test_cuda_tensors_reach_engines_on_the_senders_gpu_through_cuda_ipc() -> None:
    """Engines and the trainer share one GPU: the default backend shares each bucket as a CUDA
    IPC handle (nccl would refuse two ranks on one GPU), and both engines serve the weights."""
    with EnginePool("fake", 2, engine_cls=FakeEngine, num_cpus=0.25, num_gpus=0.25,
                    engine_args={"step_s": 0.004}) as on_gpu:
        on_gpu.wait_ready(timeout=120)
        sender = on_gpu.weight_sender(bucket_bytes=BUCKET_BYTES)
        with am.ActorMesh(Trainer, 1, args=(sender,), num_cpus=0, num_gpus=0.25) as trainer:
            weights = rigged(0.5)
            version = trainer.methods.send_from_gpu.choose(weights).get(timeout=120)
            assert version == on_gpu.weight_version
            assert served_by_each(on_gpu) == [(reference(PROMPT, 6, weights)[0],
                                               [version] * 6)] * 2


def test_a_sender_is_picklable_and_names_its_pool(sender: WeightSender) -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(sender))
    assert repr(copy) == repr(sender) and copy.bucket_bytes == BUCKET_BYTES


def test_a_sender_that_dies_mid_send_leaves_the_old_weights_and_the_next_send_works(
    pool: EnginePool, sender: WeightSender,
) -> None:
    served = pool.weight_version
    with am.ActorMesh(Trainer, 1, args=(sender,), num_cpus=0) as doomed:
        with pytest.raises(am.ActorDiedError):
            doomed.methods.send_and_die.choose(rigged(0.5), 2).get(timeout=120)
    undone_since(pool, served, timeout_s=120)
    want = reference(PROMPT, 6)[0]
    assert served_by_each(pool) == [(want, [served] * 6)] * 2
    # Another process sends next: the group forms again, with it.
    with am.ActorMesh(Trainer, 1, args=(sender,), num_cpus=0) as other:
        version = other.methods.send.choose(rigged(0.25)).get(timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6, rigged(0.25))[0], [version] * 6)] * 2


def test_an_engine_that_dies_mid_send_leaves_every_live_engine_on_one_weight_set(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    served = pool.weight_version
    survivor = pool.mesh[0].run_in_actors(process_of).get(timeout=60).item()
    pool.mesh[1].run_in_actors(arm_receive, "die").get(timeout=60)
    outcome: int | BaseException
    try:
        outcome = trainer.methods.send.choose(rigged(0.5), None, 10).get(timeout=120)
    except WeightUpdateError as err:
        outcome = err
    # The survivor learns of the death from the stream at once: it never waits out the send's
    # timeout, nor is it restarted for having waited.
    assert "timed out" not in str(outcome), outcome
    wait_until(lambda: all(pool.mesh.load().alive), timeout=120)  # restarted and restored
    assert pool.mesh[0].run_in_actors(process_of).get(timeout=60).item() == survivor
    served_now = served if isinstance(outcome, BaseException) else outcome
    weights = CHECKPOINT if isinstance(outcome, BaseException) else rigged(0.5)
    assert pool.weight_version == served_now
    want = reference(PROMPT, 6, weights)[0]
    assert served_by_each(pool) == [(want, [served_now] * 6)] * 2


def test_a_second_send_while_one_is_under_way_is_refused(
    pool: EnginePool, sender: WeightSender, trainer: am.ActorMesh[Trainer],
) -> None:
    gate = Signal.options(name=HOLD_GATE).remote()  # type: ignore[attr-defined]
    try:
        pool.mesh[0].run_in_actors(arm_receive, "hold").get(timeout=60)
        first = trainer.methods.send.choose(rigged(0.5))
        waiters(gate, 1)  # the first send is under way: engine 0 holds its receive
        with pytest.raises(RuntimeError, match="another send .* is under way"):
            sender.send(rigged(0.25))
    finally:
        ray.get(gate.send.remote(), timeout=60)
    version = first.get(timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6, rigged(0.5))[0], [version] * 6)] * 2
    ray.kill(gate)


def test_a_send_that_times_out_is_undone_and_nothing_hangs(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    served = pool.weight_version
    gate = Signal.options(name=HOLD_GATE).remote()  # type: ignore[attr-defined]
    try:
        pool.mesh[0].run_in_actors(arm_receive, "hold").get(timeout=60)
        with pytest.raises(WeightUpdateError, match="engine 0 timed out"):
            trainer.methods.send.choose(rigged(0.5), None, 2).get(timeout=120)
    finally:
        ray.get(gate.send.remote(), timeout=60)
    assert pool.weight_version == served
    wait_until(lambda: all(pool.mesh.load().alive), timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6)[0], [served] * 6)] * 2
    ray.kill(gate)


def test_a_restarted_engine_is_restored_with_the_sent_weights(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    weights = rigged(0.5)
    version = trainer.methods.send.choose(weights).get(timeout=120)
    ray.kill(pool.mesh.actors[1], no_restart=False)
    wait_until(lambda: not pool.mesh.load().alive[1])
    wait_until(lambda: all(pool.mesh.load().alive), timeout=120)
    want = reference(PROMPT, 6, weights)[0]
    assert served_by_each(pool) == [(want, [version] * 6)] * 2
    # The next send forms the group again, with the new process.
    assert trainer.methods.send.choose(rigged(0.25)).get(timeout=120) == pool.weight_version


def test_a_version_is_committed_once_every_engine_serves_it_whatever_fails_after(
    pool: EnginePool,
) -> None:
    """r21: every engine loaded, then resuming one failed: the version stays committed (and
    reported), and is never given to other weights."""
    pool.mesh[1].run_in_actors(fail_next_resume).get(timeout=60)
    before = pool.weight_version
    with pytest.raises(am.ActorError, match="could not resume"):
        pool.update_weights({"lm_head.weight": rigged(0.5)["lm_head.weight"]}).get(timeout=60)
    assert pool.weight_version > before
    report = pool.stats()["weight_update"]
    assert report is not None and report.committed and report.version == pool.weight_version
    with pytest.raises(ValueError, match=f"version={pool.weight_version}"):
        pool.update_weights({"lm_head.weight": CHECKPOINT["lm_head.weight"]},
                            version=pool.weight_version).get(timeout=60)
    pool.resume().get(timeout=60)


def test_an_object_ref_update_is_read_and_packed_off_the_driver(
    pool: EnginePool, trainer: am.ActorMesh[Trainer], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def on_the_driver(*args: Any) -> Any:
        raise AssertionError("the driver packed the weights of an ObjectRef update")

    monkeypatch.setattr(weights_mod, "pack", on_the_driver)
    weights = rigged(0.5)
    [made_elsewhere] = trainer.run_in_actors(lambda _: [ray.put(weights)]).get(timeout=60)[0]
    assert isinstance(made_elsewhere, ray.ObjectRef)
    version = pool.update_weights(made_elsewhere).get(timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6, weights)[0], [version] * 6)] * 2
    with pytest.raises(ValueError, match="lm_head.wieght"):
        pool.update_weights(ray.put({"lm_head.wieght": weights["lm_head.weight"]})).get(timeout=60)


def test_a_bucket_reaches_each_receiver_as_the_safetensors_blob_of_its_tensors() -> None:
    """The sender broadcasts a bucket tensor by tensor from their own memory; an engine gets the
    tensors, the keeper the blob, which safetensors reads back."""
    import datetime
    import threading

    import torch
    import torch.distributed as dist
    from safetensors.torch import load
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    from actormesh.integrations.vllm import _transfer

    tensors = [("a", torch.randn(3, 5, dtype=torch.bfloat16)), ("b", torch.randn(7)),
               ("c", torch.zeros(0)), ("d", torch.arange(6).reshape(2, 3))]
    dtypes = {"a": "bfloat16", "b": "float32", "c": "float32", "d": "int64"}
    buckets = list(_transfer.buckets(tensors, dtypes, 40))
    assert [[name for name, _ in b] for b in buckets] == [["a"], ["b", "c"], ["d"]]
    timeout = datetime.timedelta(seconds=30)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    got: dict[int, Any] = {}

    def receiver(rank: int) -> None:
        client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timeout)
        group = dist.ProcessGroupGloo(PrefixStore("t", client), rank, 3, timeout)
        got[rank] = (dict(_transfer.receive(group, "cpu")) if rank == 1 else
                     [b.numpy().tobytes() for b in _transfer.receive_blobs(group, "cpu")])

    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    root = dist.ProcessGroupGloo(PrefixStore("t", store), 0, 3, timeout)
    for bucket in buckets:
        _transfer.send_bucket(root, bucket, "cpu")
    _transfer.send_end(root, "cpu")
    for thread in threads:
        thread.join(timeout=30)
    assert all(torch.equal(got[1][name], tensor) for name, tensor in tensors)
    assert got[2] == [_transfer.blob(b) for b in buckets]
    assert all(torch.equal(load(blob)[name], tensor)
               for blob, bucket in zip(got[2], buckets) for name, tensor in bucket)


def test_a_send_without_a_live_engine_is_refused() -> None:
    with EnginePool("fake", 1, engine_cls=FakeEngine, num_cpus=0.25) as lonely:
        lonely.wait_ready(timeout=120)
        sender = lonely.weight_sender()
        ray.kill(lonely.mesh.actors[0], no_restart=True)
        wait_until(lambda: not lonely.mesh.load().alive[0])
        with pytest.raises(am.MeshError, match="no live engine"):
            sender.send(rigged(0.5), timeout=10)


def test_the_port_holds_a_sends_buckets_only_while_the_pool_keeps_them() -> None:
    """The port keeps what it received for a send only if the pool keeps it when it declares
    the send over (`finish`); a failed send's buckets go, whether the port's receive ends
    before that declaration or after it. Here the test is the sender (rank 0) and the pool."""
    import datetime

    import torch
    from torch._C._distributed_c10d import TCPStore

    from actormesh.integrations.vllm import _transfer
    from actormesh.integrations.vllm._sender import Go, SendRequest, WeightPort

    port = ray.remote(WeightPort).options(num_cpus=0).remote()
    host = ray.util.get_node_ip_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=60))
    formation = _transfer.Formation("port-test", host, store.port, (), "gloo", 60.0, keeper=True)
    bucket = [("w", torch.arange(64, dtype=torch.float32))]
    blob_bytes = len(_transfer.blob(bucket))

    def begin(request_id: str) -> ray.ObjectRef[Any]:
        """Submit a send as a sender, take it and start the port's receive as the pool."""
        submitted = port.submit.remote(SendRequest(request_id, host, store.port, "gloo", "",
                                                   "cpu", ("w",), None, 60.0))
        assert ray.get(port.take.remote(60)).id == request_id
        keeping = port.keep.remote(request_id, formation)
        ray.get(port.go.remote(request_id, Go(formation, 1)))
        assert isinstance(ray.get(submitted, timeout=60), Go)
        return keeping

    def stream() -> None:
        group = _transfer.join("port-test-sender", formation, 0, store)
        _transfer.send_bucket(group, bucket, "cpu")
        _transfer.send_end(group, "cpu")

    def held() -> int:
        return ray.get(port.held_bytes.remote(), timeout=60)

    try:
        # Committed: the pool keeps the send's buckets, the port holds them.
        keeping = begin("kept")
        stream()
        keys = [key for key, _ in ray.get(keeping, timeout=60)]
        ray.get(port.finish.remote("kept", 1, keys), timeout=60)
        assert held() == blob_bytes
        # Failed, the receive ending first: the port lets go of it as the send ends.
        keeping = begin("failed-late")
        stream()
        assert ray.get(keeping, timeout=60) and held() == 2 * blob_bytes
        ray.get(port.finish.remote("failed-late", RuntimeError("undone"), keys), timeout=60)
        assert held() == blob_bytes
        # Failed, the send declared over before the receive ended: it keeps nothing.
        keeping = begin("failed-early")
        ray.get(port.finish.remote("failed-early", RuntimeError("undone"), keys), timeout=60)
        stream()
        assert ray.get(keeping, timeout=60) == []
        assert held() == blob_bytes
        # The pool keeps nothing any more: the port holds nothing.
        ray.get(port.retain.remote([]), timeout=60)
        assert held() == 0
    finally:
        _transfer.drop("port-test-sender")
        ray.kill(port)


def test_an_ipc_sender_that_dies_with_a_bucket_shared_leaves_the_old_weights_and_nothing_shared(
    pool: EnginePool,
) -> None:
    """The sender dies after every receiver mapped its second bucket, before it let go of it:
    the update is undone, and no process maps a bucket or finds one in /dev/shm."""
    served = pool.weight_version
    before = shm_names()
    with ipc_trainer(pool) as doomed:
        with pytest.raises(am.ActorDiedError):
            doomed.methods.send_and_die_sharing.choose(rigged(0.5), 1).get(timeout=120)
    undone_since(pool, served, timeout_s=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6)[0], [served] * 6)] * 2
    assert list(pool.mesh.run_in_actors(shared_maps).get(timeout=60)) == [0, 0]
    assert shm_names() <= before


def test_an_ipc_sender_keeps_its_buckets_memory_for_the_next_send_until_it_is_closed(
    pool: EnginePool,
) -> None:
    """Between sends the sender's process keeps the memory of its buckets (the next send writes
    over it); `close` lets go of it, and the send after makes it anew."""
    with ipc_trainer(pool) as trainer:
        trainer.methods.send.choose(rigged(0.25)).get(timeout=120)
        assert list(trainer.run_in_actors(shared_maps).get(timeout=60)) > [0]
        trainer.methods.close_sender.choose().get(timeout=60)
        assert list(trainer.run_in_actors(shared_maps).get(timeout=60)) == [0]
        version = trainer.methods.send.choose(rigged(0.5)).get(timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6, rigged(0.5))[0], [version] * 6)] * 2


def another_host(_: Any = None) -> Place:
    return Place("another-node")


def test_an_ipc_send_is_refused_before_anything_is_sent_when_an_engine_is_on_another_host(
    pool: EnginePool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    served, report = pool.weight_version, pool.stats()["weight_update"]
    sender = pool.weight_sender(backend="ipc")
    with monkeypatch.context() as elsewhere:  # the sender runs on another host
        elsewhere.setattr(sender_mod, "place", another_host)
        with pytest.raises(ValueError, match=r"backend 'ipc' shares memory within one host, "
                                             r"and \['engine 0 on node .*', 'engine 1 on node "
                                             r".*'\] not on the sender's node another-node"):
            sender.send(rigged(0.5))
    # An engine that moved since the sender was made: the pool refuses it before pausing.
    monkeypatch.setitem(pool._places, 1, Place("another-node"))
    with pytest.raises(ValueError, match=r"\['engine 1 on node another-node'\] not on the "
                                         r"sender's node"):
        sender.send(rigged(0.5))
    assert pool.weight_version == served and pool.stats()["weight_update"] == report


def test_an_ipc_send_from_a_host_without_the_port_keeps_copies_that_restore_an_engine(
    pool: EnginePool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The port maps an ipc send's buckets only on its own host; from another host (as here,
    where the port is said to be elsewhere) the sender puts copies, which restore a restarted
    engine."""
    monkeypatch.setattr(pool, "_port_node", "another-node")
    weights = rigged(0.5)
    with ipc_trainer(pool) as trainer:
        version = trainer.methods.send.choose(weights).get(timeout=120)
    ray.kill(pool.mesh.actors[1], no_restart=False)
    wait_until(lambda: not pool.mesh.load().alive[1])
    wait_until(lambda: all(pool.mesh.load().alive), timeout=120)
    assert served_by_each(pool) == [(reference(PROMPT, 6, weights)[0], [version] * 6)] * 2


def test_a_sent_bucket_is_mapped_by_no_engine_once_the_send_is_over(
    pool: EnginePool, trainer: am.ActorMesh[Trainer],
) -> None:
    trainer.methods.send.choose(rigged(0.5)).get(timeout=120)
    assert list(pool.mesh.run_in_actors(shared_maps).get(timeout=60)) == [0, 0]
