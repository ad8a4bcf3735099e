"""Buckets through memory shared on one host: the `ipc` backend of `_transfer`.

Over ipc no tensor byte crosses a socket. The sender writes each bucket's safetensors blob once
into memory it shares and publishes a handle to it; every receiver maps that memory (CPU) or
copies out of it (CUDA) and says so. The handles and the acknowledgements travel as keys of the
sender's `TCPStore` (a new prefix per send), deleted once the sender has waited for them:

    "<i>"          the pickled handle of bucket i, b"" once the stream ended, or b"abort"
                   once the sender gave up (every receiver then fails at once)
    "<i>.<rank>"   receiver `rank` has mapped (CPU) or copied (CUDA) bucket i: b"1"; b"!"
                   if it failed there (the sender then fails at once)
    "pid.<rank>"   the process of receiver `rank` (every member is on this host)

Every wait, the sender's for acknowledgements and a receiver's for the next handle, has the
send's deadline, and no one waits for a member that is gone: a sender that dies takes its
store with it (the receivers' next read fails); a receiver that fails says so; the sender looks
at the receivers' processes between slices of its waits (`_SLICE_S`), so a receiver that dies
fails the send within a slice, and the sender's abort then wakes every other receiver.

CPU blobs are shared one bucket at a time: the sender lets go of a bucket once every receiver
has mapped it, then goes on to the next. A blob lives in an anonymous memory file
(`memfd_create`); a receiver opens it as `/proc/<pid>/fd/<fd>` (checked by inode, so a reused
descriptor is never mistaken for it) and maps it copy-on-write, so the blob's tensors reach the
engine's load as views, without a copy. Nothing is ever named in /dev/shm: the memory goes with
its last mapping, so a sender that dies mid-send leaves nothing behind.

CUDA blobs go through two slots, CUDA buffers the sender allocates once per send and writes in
turn (`Slots`): bucket i goes into slot i % 2 once every receiver has acknowledged bucket i - 2,
so the sender writes a bucket while the receivers copy the one before. A slot gets a new, larger
buffer (with a new id) when a bucket does not fit it. A buffer is shared with each receiver as a
CUDA IPC handle of its own (`torch.multiprocessing.reductions.reduce_tensor`, as verl and vLLM's
`ipc` engine do): torch counts each receiver's hold apart, and keeps a buffer the sender frees
until every receiver has closed it. A bucket's handle names the slot, its buffer's id, the bytes
used and the GPU's UUID (device indices differ with CUDA_VISIBLE_DEVICES). A receiver opens each
buffer once (opening is what costs) and keeps it open until the stream ends; it copies each
bucket into its own memory before it says so, since the sender writes over the slot once every
receiver has. The sender's end waits for the last two buckets' acknowledgements before it frees
the slots; torch hands them back to the allocator at its next collection once the receivers have
closed them (`torch.cuda.ipc_collect`: the sender runs one before each CUDA send, the allocator
when it runs short). A receiver that dies holding a buffer leaves it allocated until the sender
ends.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import mmap
import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Store

_MEMFD_NAME = "actormesh-weights"
SLOTS = 2  # the sender writes one while the receivers copy out of the other
SLOT_GRAIN = 2**20  # a slot's capacity, in whole MiB, so that buckets a little larger still fit
ABORT = b"abort"  # a bucket's handle once the sender gave up
_ACK, _FAILED = b"1", b"!"
_SLICE_S = 0.5  # the sender looks at the receivers' processes this often while it waits

T = TypeVar("T")


class Channel:
    """One send's keys on the sender's store, seen from `rank` (0 the sender) of `size`."""

    def __init__(self, store: Store, rank: int, size: int, timeout_s: float) -> None:
        self.store: Any = store  # torch's stubs say str values; it takes (and gives) bytes
        self.rank = rank
        self.size = size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bucket = 0  # the index of the bucket under way
        self.ended = False  # the stream ended (the sender's end, or a receiver saw it)
        self._shared: _Shared | None = None  # the sender's CPU bucket under way
        self._slots: Slots[_Exported] | None = None  # the sender's CUDA slots
        self._opened: dict[int, tuple[int, torch.Tensor]] = {}  # a receiver's: slot -> (id, map)
        self._pids: dict[int, int] = {}  # the sender's: the receivers' processes seen so far

    def shutdown(self) -> None:
        """Let go of what this end holds: the sender's shared bucket or slots, a receiver's open
        CUDA buffers (a receiver keeps its maps of CPU buckets). Before the stream ended, tell
        the others: the sender aborts, a receiver says it failed."""
        if self._shared is not None:
            self._shared.release()
            self._shared = None
        self._slots = None
        self._opened.clear()
        if not self.ended:
            self.ended = True
            try:
                if self.rank == 0:  # receivers wait on the key of the bucket under way or the next
                    self.store.multi_set([str(self.bucket), str(self.bucket + 1)], [ABORT] * 2)
                else:
                    self.store.set(f"{self.bucket}.{self.rank}", _FAILED)
            except Exception:  # noqa: BLE001 - the store went with the sender: no one to tell
                pass


# -- the CUDA slots ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Buffer(Generic[T]):
    """One allocation of slot `slot`: `id` (a new one for each allocation of a send), `capacity`
    bytes, and the `memory` itself."""

    slot: int
    id: int
    capacity: int
    memory: T


class Slots(Generic[T]):
    """The sender's slots, bookkept: bucket i goes into slot i % SLOTS (after `waits_for(i)`), in
    the slot's buffer, which `allocate(capacity)` makes on first use and makes again, under a new
    id, for a bucket that does not fit it."""

    def __init__(self, allocate: Callable[[int], T]) -> None:
        self._allocate = allocate
        self._held: list[Buffer[T] | None] = [None] * SLOTS
        self._ids = itertools.count()

    def take(self, bucket: int, size: int) -> Buffer[T]:
        """The buffer that bucket `bucket` of `size` bytes is written into."""
        slot = bucket % SLOTS
        held = self._held[slot]
        if held is None or held.capacity < size:
            self._held[slot] = held = None  # let go of the old one first (over CUDA IPC torch
            # frees it once every receiver closed it: a regrown slot briefly holds both)
            capacity = -(-size // SLOT_GRAIN) * SLOT_GRAIN
            held = self._held[slot] = Buffer(slot, next(self._ids), capacity,
                                             self._allocate(capacity))
        return held


def waits_for(bucket: int) -> int | None:
    """The bucket every receiver must have acknowledged before the sender writes `bucket`: the
    one before it in its slot, if any."""
    return bucket - SLOTS if bucket >= SLOTS else None


def unacknowledged(buckets: int) -> range:
    """The buckets still in the slots once `buckets` were sent: those the end waits for."""
    return range(max(0, buckets - SLOTS), buckets)


# -- the sender -------------------------------------------------------------------------------
class _Shared:
    """A CPU blob in an anonymous memory file, written once through the file (the header, then
    each tensor's bytes); `handle` lets a receiver map it."""

    def __init__(self, head: bytes, tensors: list[torch.Tensor]) -> None:
        import torch

        self._file: int | None = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)
        try:
            # Written, not mapped and copied into: a page written whole is never zeroed first
            # (a mapping would fault in each page, zeroed, then copy over it), and no room is
            # an OSError here, not a SIGBUS.
            size = _write_all(self._file, head)
            for tensor in tensors:
                if tensor.numel():
                    size += _write_all(self._file, tensor.reshape(-1).view(torch.uint8).numpy())
        except BaseException:
            os.close(self._file)
            raise
        self.handle: dict[str, Any] = {"pid": os.getpid(), "fd": self._file,
                                       "inode": os.fstat(self._file).st_ino, "size": size}

    def release(self) -> None:
        if self._file is not None:
            os.close(self._file)
        self._file = None


def _write_all(file: int, data: Any) -> int:
    """Write all of `data` (a buffer) at the file's end; its length."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.write(file, view[done:])
    return done


class _Exported:
    """A CUDA buffer of `capacity` bytes on `device`: `tensor` to write it, `args` (of
    `reduce_tensor`, receiver r's at r - 1) and `uuid` (its GPU's) to open it in another process.
    One handle per receiver: torch counts one hold per handle, and each receiver lets go of one
    (a handle shared by two would be let go of twice, and its buffer never freed)."""

    def __init__(self, capacity: int, device: str, receivers: int) -> None:
        import torch
        from torch.multiprocessing import reductions

        self.tensor = torch.empty(capacity, dtype=torch.uint8, device=device)
        reduce: Any = reductions.reduce_tensor  # untyped in torch
        self.args = [reduce(self.tensor)[1] for _ in range(receivers)]
        self.uuid = str(torch.cuda.get_device_properties(self.tensor.device).uuid)


def send(channel: Channel, head: bytes, tensors: list[torch.Tensor], device: str) -> None:
    """Share one bucket (its header, then each tensor's bytes, as `_transfer.layout` made them):
    a CPU bucket until every receiver has mapped it, a CUDA one in the next slot."""
    if device == "cpu":
        _send_cpu(channel, head, tensors)
    else:
        size = len(head) + sum(t.numel() * t.element_size() for t in tensors)
        _send_cuda(channel, head, tensors, device, size)
    channel.bucket += 1


def _send_cpu(channel: Channel, head: bytes, tensors: list[torch.Tensor]) -> None:
    shared = channel._shared = _Shared(head, tensors)
    channel.store.set(str(channel.bucket), pickle.dumps(shared.handle))
    acks = _acks(channel, channel.bucket)
    wait_acknowledged(channel, acks)
    shared.release()
    channel._shared = None
    _forget(channel, channel.bucket, acks)


def _send_cuda(channel: Channel, head: bytes, tensors: list[torch.Tensor], device: str,
               size: int) -> None:
    import torch

    bucket = channel.bucket
    previous = waits_for(bucket)
    if previous is not None:
        acks = _acks(channel, previous)
        wait_acknowledged(channel, acks)
        _forget(channel, previous, acks)
    if channel._slots is None:
        collect: Any = torch.cuda.ipc_collect  # untyped in torch
        collect()  # the slots of sends before, once their receivers closed them
        receivers = channel.size - 1
        channel._slots = Slots(lambda capacity: _Exported(capacity, device, receivers))
    buffer = channel._slots.take(bucket, size)
    exported = buffer.memory
    _write(exported.tensor, head, tensors)
    torch.cuda.current_stream(exported.tensor.device).synchronize()
    handle = {"cuda": exported.uuid, "slot": buffer.slot, "buffer": buffer.id, "size": size,
              "args": exported.args}
    channel.store.set(str(bucket), pickle.dumps(handle))


def _write(blob: torch.Tensor, head: bytes, tensors: list[torch.Tensor]) -> None:
    import torch

    blob[:len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
    offset = len(head)
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        blob[offset:offset + nbytes].copy_(tensor.reshape(-1).view(torch.uint8))
        offset += nbytes


def wait_acknowledged(channel: Channel, keys: list[str]) -> None:
    """Block until every receiver has acknowledged a bucket (the send's deadline); raise as soon
    as one says it failed, or within a slice once one's process is gone."""
    from torch.distributed import DistStoreError

    deadline = time.monotonic() + channel.timeout.total_seconds()
    while True:
        left = deadline - time.monotonic()
        try:
            channel.store.wait(keys, datetime.timedelta(seconds=max(0.0, min(_SLICE_S, left))))
            break
        except DistStoreError:  # this slice timed out
            if left <= _SLICE_S:
                raise
            _check_receivers(channel)
    failed = [key for key, ack in zip(keys, channel.store.multi_get(keys)) if ack != _ACK]
    if failed:
        ranks = ", ".join(key.rpartition(".")[2] for key in failed)
        raise RuntimeError(f"receiver rank {ranks} failed at bucket {channel.bucket}")


def _check_receivers(channel: Channel) -> None:
    """Raise if the process of a receiver that began to receive is gone."""
    for rank in range(1, channel.size):
        pid = channel._pids.get(rank)
        if pid is None:
            key = f"pid.{rank}"
            if not channel.store.check([key]):
                continue  # not receiving yet
            pid = channel._pids[rank] = int(channel.store.get(key))
        if not _alive(pid):
            raise RuntimeError(f"receiver rank {rank} (pid {pid}) died at bucket "
                               f"{channel.bucket}")


def _alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def end(channel: Channel) -> None:
    """End the stream: once every receiver has copied the buckets still in the CUDA slots (if
    any), free the slots, then say so."""
    if channel._slots is not None:
        pending = {bucket: _acks(channel, bucket) for bucket in unacknowledged(channel.bucket)}
        wait_acknowledged(channel, [key for acks in pending.values() for key in acks])
        for bucket, acks in pending.items():
            _forget(channel, bucket, acks)
        channel._slots = None
    channel.store.set(str(channel.bucket), b"")
    channel.ended = True


def _acks(channel: Channel, bucket: int) -> list[str]:
    return [f"{bucket}.{rank}" for rank in range(1, channel.size)]


def _forget(channel: Channel, bucket: int, acks: list[str]) -> None:
    for done in (str(bucket), *acks):
        channel.store.delete_key(done)


# -- a receiver -------------------------------------------------------------------------------
def receive(channel: Channel, device: str) -> Iterator[torch.Tensor]:
    """Each bucket the sender shares, as its blob in a uint8 tensor (CPU: mapped, no copy;
    CUDA: copied onto `device`), until the sender ends the stream. Each wait for the next
    bucket has the send's deadline. The CUDA buffers opened stay open until the stream ends."""
    channel.store.set(f"pid.{channel.rank}", str(os.getpid()).encode())
    try:
        while True:
            key = str(channel.bucket)
            raw = channel.store.get(key)
            if not raw:
                channel.ended = True
                return
            if raw == ABORT:
                raise RuntimeError(f"the sender gave up the send at bucket {channel.bucket}")
            handle = pickle.loads(raw)
            blob = _copy_cuda(channel, handle, device) if "cuda" in handle else _map_cpu(handle)
            channel.store.set(f"{key}.{channel.rank}", _ACK)
            channel.bucket += 1
            yield blob
    finally:
        channel._opened.clear()


def _map_cpu(handle: dict[str, Any]) -> torch.Tensor:
    import torch

    path = f"/proc/{handle['pid']}/fd/{handle['fd']}"
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_ino != handle["inode"]:
                raise RuntimeError(f"{path} is no longer the shared bucket")
            view = mmap.mmap(file.fileno(), handle["size"], access=mmap.ACCESS_COPY)
    except OSError as err:
        raise RuntimeError(f"cannot map the sender's shared bucket {path} ({err}): backend "
                           "'ipc' needs the sender on this host") from err
    return torch.frombuffer(view, dtype=torch.uint8)  # holds the map while any view lives


def _copy_cuda(channel: Channel, handle: dict[str, Any], device: str) -> torch.Tensor:
    """The bucket copied out of the sender's slot onto `device` (the slot's buffer opened on
    first sight of its id)."""
    import torch

    slot, size = handle["slot"], handle["size"]
    opened = channel._opened.get(slot)
    if opened is None or opened[0] != handle["buffer"]:
        channel._opened.pop(slot, None)  # closed first: torch must not find it for the new one
        channel._opened[slot] = (handle["buffer"], _open_cuda(handle, channel.rank, device))
    mapped = channel._opened[slot][1]
    with torch.cuda.device(mapped.device):
        own = torch.empty(size, dtype=torch.uint8, device=device).copy_(mapped[:size])
        torch.cuda.current_stream(mapped.device).synchronize()
    return own


def _open_cuda(handle: dict[str, Any], rank: int, device: str) -> torch.Tensor:
    import torch
    from torch.multiprocessing import reductions

    uuid = handle["cuda"]
    index = next((i for i in range(torch.cuda.device_count())
                  if str(torch.cuda.get_device_properties(i).uuid) == uuid), None)
    if index is None or device == "cpu":
        raise RuntimeError(f"the sender's tensors are on GPU {uuid}, which this process does "
                           "not see: backend 'ipc' needs each engine to share the sender's GPU")
    args = list(handle["args"][rank - 1])
    args[6] = index  # the storage's device, as this process numbers it
    with torch.cuda.device(index):
        rebuild: Any = reductions.rebuild_cuda_tensor  # untyped in torch
        mapped: torch.Tensor = rebuild(*args)
    return mapped
