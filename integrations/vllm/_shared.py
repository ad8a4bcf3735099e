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

CPU blobs live in anonymous memory files (`memfd_create`), one per bucket; a receiver opens one
as `/proc/<pid>/fd/<fd>` (checked by inode, so a reused descriptor is never mistaken for it) and
maps it copy-on-write, so the blob's tensors reach the engine's load as views, without a copy.
The sender shares the next bucket once every receiver has mapped the one before. It keeps the
files from send to send (`Files`) and writes the next send's buckets over them through a mapping
of its own: that costs a copy, where a new file costs the kernel a fresh page per 4 KiB as well,
and the freeing of them all once the engines let go (224 MiB: 0.02 s of CPU against 0.09 s on
the reference machine; a send of the 200 MiB model to two engines, taking turns with the old
way, 0.92× the time). A receiver holds a shared lock (`flock`) on each file for as long as it
maps it, and the sender writes only over a file no one holds: the buckets the pool's port keeps
(the weights it restores a restarted engine with), or any an engine still holds, are never
written over; the sender takes a file no one holds, or makes one. It keeps the files of its
last two sends (so twice the bytes it sends: the port holds one send's, the next send writes
the other's), until `release_files` (`WeightSender.close`) or its process ends; older ones
are closed on a thread of their own, since freeing them is not the send's to wait for. Nothing
is ever named in /dev/shm: the memory goes with its last descriptor and mapping, so a sender or a
receiver that dies leaves nothing behind.

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
import fcntl
import itertools
import mmap
import os
import pickle
import threading
import time
import weakref
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

    def __init__(self, store: Store, rank: int, size: int, timeout_s: float,
                 files: Files | None = None) -> None:
        self.store: Any = store  # torch's stubs say str values; it takes (and gives) bytes
        self.rank = rank
        self.size = size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bucket = 0  # the index of the bucket under way
        self.ended = False  # the stream ended (the sender's end, or a receiver saw it)
        self._files = files  # the sender's memory files for CPU buckets (this send's first)
        if files is not None:
            files.begin()
        self._slots: Slots[_Exported] | None = None  # the sender's CUDA slots
        self._opened: dict[int, tuple[int, torch.Tensor]] = {}  # a receiver's: slot -> (id, map)
        self._pids: dict[int, int] = {}  # the sender's: the receivers' processes seen so far

    def shutdown(self) -> None:
        """Let go of what this end holds: the sender's slots and the files of sends before the
        last (it keeps the rest for the next send), a receiver's open CUDA buffers (a receiver
        keeps its maps of CPU buckets). Before the stream ended, tell the others: the sender
        aborts, a receiver says it failed."""
        if self._files is not None:
            self._files.settle()
            self._files = None
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
class _File:
    """One memory file of the sender's: `capacity` bytes, written whole when made, then over
    through a mapping of its own."""

    def __init__(self, head: bytes, tensors: list[torch.Tensor]) -> None:
        import torch

        self.fd = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)
        try:
            # Written, not mapped and copied into: a page written whole is never zeroed first
            # (a mapping would fault in each page, zeroed, then copy over it), and no room is
            # an OSError here, not a SIGBUS.
            size = _write_all(self.fd, head)
            for tensor in tensors:
                if tensor.numel():
                    size += _write_all(self.fd, tensor.reshape(-1).view(torch.uint8).numpy())
            # Populated at once: the next send's copy into it then faults in no page.
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = size
        self.inode = os.fstat(self.fd).st_ino
        self.send = -1  # the last send that wrote it (`Files`)

    def held(self) -> bool:
        """Whether a receiver holds this file (it maps it, or is about to)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def write(self, head: bytes, tensors: list[torch.Tensor]) -> None:
        """Write a bucket over the file's first bytes (no receiver holds it)."""
        import torch

        _write(torch.frombuffer(self._map, dtype=torch.uint8), head, tensors)

    def handle(self, size: int) -> dict[str, Any]:
        return {"pid": os.getpid(), "fd": self.fd, "inode": self.inode, "size": size}

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # a buffer of it is still exported: the map goes with the last one
            pass
        os.close(self.fd)


class Files:
    """The memory files of one sender's CPU buckets (one per pool in a process), kept from send
    to send: a bucket goes into a file that this send has not written, that no receiver holds
    and that is large enough, else into a new one; once a send is over (`settle`), the files
    that neither it nor the send before wrote are let go of (the port holds the last committed
    send's, so the next send writes over the other's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: list[_File] = []
        self._send = 0
        self._closing: list[threading.Thread] = []  # closers of files let go of (`settle`)

    def begin(self) -> None:
        with self._lock:
            self._send += 1

    def put(self, head: bytes, tensors: list[torch.Tensor], size: int) -> _File:
        """A file holding the bucket `head` + `tensors`, `size` bytes (its data from byte 0)."""
        with self._lock:
            for file in self._files:
                if file.send != self._send and file.capacity >= size and not file.held():
                    file.write(head, tensors)
                    break
            else:
                file = _File(head, tensors)
                self._files.append(file)
            file.send = self._send
            return file

    def settle(self) -> None:
        """Let go of the files that neither this send nor the one before wrote, off the caller's
        thread: the kernel takes about ten milliseconds per hundred MiB to unmap and free them,
        which the send would otherwise wait for."""
        with self._lock:
            old = [f for f in self._files if f.send < self._send - 1]
            self._files = [f for f in self._files if f.send >= self._send - 1]
            if not old:
                return
            closer = threading.Thread(target=_close_all, args=(old,), daemon=True,
                                      name="actormesh-weights-files")
            self._closing = [t for t in self._closing if t.is_alive()] + [closer]
            closer.start()  # under the lock: `close` never finds it unstarted

    def close(self) -> None:
        """Let go of every file, and wait (up to _CLOSE_TIMEOUT_S) for those being let go of."""
        with self._lock:
            files, self._files = self._files, []
            closing, self._closing = self._closing, []
        _close_all(files)
        for closer in closing:
            closer.join(timeout=_CLOSE_TIMEOUT_S)

    def __len__(self) -> int:
        return len(self._files)


_files_lock = threading.Lock()
_files: dict[str, Files] = {}


# How long `Files.close` waits for files let go of earlier to be closed: a closer stuck this
# long is not waited for; its files go with the process.
_CLOSE_TIMEOUT_S = 60.0


def _close_all(files: list[_File]) -> None:
    for file in files:
        file.close()  # the memory goes once the receivers that hold it let go


def files(key: str) -> Files:
    """This process's files for the sends of `key` (a sender's role in `_transfer`)."""
    with _files_lock:
        return _files.setdefault(key, Files())


def release_files(key: str) -> None:
    """Let go of this process's files for the sends of `key`."""
    with _files_lock:
        held = _files.pop(key, None)
    if held is not None:
        held.close()


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
    size = len(head) + sum(t.numel() * t.element_size() for t in tensors)
    if device == "cpu":
        _send_cpu(channel, head, tensors, size)
    else:
        _send_cuda(channel, head, tensors, device, size)
    channel.bucket += 1


def _send_cpu(channel: Channel, head: bytes, tensors: list[torch.Tensor], size: int) -> None:
    if channel._files is None:
        raise RuntimeError("only the sender (rank 0) of an ipc channel sends")
    file = channel._files.put(head, tensors, size)
    channel.store.set(str(channel.bucket), pickle.dumps(file.handle(size)))
    acks = _acks(channel, channel.bucket)
    wait_acknowledged(channel, acks)
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
    """The sender's bucket, mapped copy-on-write; the file held (a shared lock on a descriptor
    of its own) for as long as the map lives, so the sender writes no other bucket over it."""
    import torch

    path = f"/proc/{handle['pid']}/fd/{handle['fd']}"
    try:
        file = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise RuntimeError(f"cannot map the sender's shared bucket {path} ({err}): backend "
                           "'ipc' needs the sender on this host") from err
    try:
        if os.fstat(file).st_ino != handle["inode"]:
            raise RuntimeError(f"{path} is no longer the shared bucket")
        fcntl.flock(file, fcntl.LOCK_SH)
        view = mmap.mmap(file, handle["size"], access=mmap.ACCESS_COPY)
    except BaseException:
        os.close(file)
        raise
    weakref.finalize(view, os.close, file)
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
