"""Buckets through memory shared on one host: the `ipc` backend of `_transfer`.

Over ipc no tensor byte crosses a socket. For each bucket the sender writes the bucket's
safetensors blob once into memory it shares and publishes a handle to it; every receiver maps
that memory and says so; then the sender lets go of it and goes on to the next bucket (one
bucket shared at a time). The handles and the acknowledgements travel as keys of the sender's
`TCPStore` (a new prefix per send):

    "<i>"          the pickled handle of bucket i, or b"" once the stream ended
    "<i>.<rank>"   receiver `rank` has mapped bucket i

CPU blobs live in an anonymous memory file (`memfd_create`); a receiver opens it as
`/proc/<pid>/fd/<fd>` (checked by inode, so a reused descriptor is never mistaken for it) and
maps it copy-on-write, so the blob's tensors reach the engine's load as views, without a copy.
Nothing is ever named in /dev/shm: the memory goes with its last mapping, so a sender that dies
mid-send leaves nothing behind. CUDA blobs are shared as CUDA IPC handles
(`torch.multiprocessing.reductions.reduce_tensor`, as verl and vLLM's `ipc` engine do); a
receiver finds the sender's GPU by UUID (device indices differ with CUDA_VISIBLE_DEVICES),
copies the blob into its own memory and only then says so, since the sender frees the bucket
once every receiver has.
"""

from __future__ import annotations

import datetime
import mmap
import os
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Store

_MEMFD_NAME = "actormesh-weights"


class Channel:
    """One send's keys on the sender's store, seen from `rank` (0 the sender) of `size`."""

    def __init__(self, store: Store, rank: int, size: int, timeout_s: float) -> None:
        self.store: Any = store  # torch's stubs say str values; it takes (and gives) bytes
        self.rank = rank
        self.size = size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bucket = 0  # the index of the bucket under way
        self._shared: _Shared | None = None  # the sender's bucket under way

    def shutdown(self) -> None:
        """Let go of the bucket this sender shares, if any (the receivers keep their maps)."""
        if self._shared is not None:
            self._shared.release()
            self._shared = None


# -- the sender -------------------------------------------------------------------------------
class _Shared:
    """A blob of `size` bytes in shareable memory: `tensor` to write it, `handle` to map it."""

    def __init__(self, size: int, device: str) -> None:
        import torch

        self._file: int | None = None
        self._map: mmap.mmap | None = None
        if device == "cpu":
            self._file = os.memfd_create(_MEMFD_NAME, os.MFD_CLOEXEC)
            try:
                os.posix_fallocate(self._file, 0, size)  # no room: an error now, not a SIGBUS
                self._map = mmap.mmap(self._file, size)
            except BaseException:
                os.close(self._file)
                raise
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
            self.handle: dict[str, Any] = {"pid": os.getpid(), "fd": self._file,
                                           "inode": os.fstat(self._file).st_ino, "size": size}
        else:
            from torch.multiprocessing import reductions

            self.tensor = torch.empty(size, dtype=torch.uint8, device=device)
            reduce: Any = reductions.reduce_tensor  # untyped in torch
            _, args = reduce(self.tensor)
            uuid = str(torch.cuda.get_device_properties(self.tensor.device).uuid)
            self.handle = {"cuda": uuid, "args": args}

    def release(self) -> None:
        del self.tensor  # the map cannot close while a tensor exports it
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view lives on (a failed send's traceback): it unmaps last
                pass
        if self._file is not None:
            os.close(self._file)
        self._map, self._file = None, None


def send(channel: Channel, head: bytes, tensors: list[torch.Tensor], device: str) -> None:
    """Share one bucket (its header, then each tensor's bytes, as `_transfer.layout` made them)
    until every receiver has mapped it."""
    import torch

    size = len(head) + sum(t.numel() * t.element_size() for t in tensors)
    shared = channel._shared = _Shared(size, device)
    blob = shared.tensor
    blob[:len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
    offset = len(head)
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        blob[offset:offset + nbytes].copy_(tensor.reshape(-1).view(torch.uint8))
        offset += nbytes
    del blob
    if device != "cpu":
        torch.cuda.current_stream(shared.tensor.device).synchronize()
    key = str(channel.bucket)
    channel.store.set(key, pickle.dumps(shared.handle))
    mapped = [f"{key}.{rank}" for rank in range(1, channel.size)]
    wait_mapped(channel, mapped)
    channel.shutdown()
    for done in (key, *mapped):
        channel.store.delete_key(done)
    channel.bucket += 1


def wait_mapped(channel: Channel, keys: list[str]) -> None:
    """Block until every receiver has mapped the bucket under way (the send's deadline)."""
    channel.store.wait(keys, channel.timeout)


def end(channel: Channel) -> None:
    channel.store.set(str(channel.bucket), b"")


# -- a receiver -------------------------------------------------------------------------------
def receive(channel: Channel, device: str) -> Iterator[torch.Tensor]:
    """Each bucket the sender shares, as its blob in a uint8 tensor (CPU: mapped, no copy;
    CUDA: copied onto `device`), until the sender ends the stream. Each wait for the next
    bucket has the send's deadline."""
    while True:
        key = str(channel.bucket)
        raw = channel.store.get(key)
        if not raw:
            return
        handle = pickle.loads(raw)
        blob = _map_cuda(handle, device) if "cuda" in handle else _map_cpu(handle)
        channel.store.set(f"{key}.{channel.rank}", b"1")
        channel.bucket += 1
        yield blob


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


def _map_cuda(handle: dict[str, Any], device: str) -> torch.Tensor:
    import torch
    from torch.multiprocessing import reductions

    uuid = handle["cuda"]
    index = next((i for i in range(torch.cuda.device_count())
                  if str(torch.cuda.get_device_properties(i).uuid) == uuid), None)
    if index is None or device == "cpu":
        raise RuntimeError(f"the sender's tensors are on GPU {uuid}, which this process does "
                           "not see: backend 'ipc' needs each engine to share the sender's GPU")
    args = list(handle["args"])
    args[6] = index  # the storage's device, as this process numbers it
    with torch.cuda.device(index):
        rebuild: Any = reductions.rebuild_cuda_tensor  # untyped in torch
        mapped = rebuild(*args)
        own = torch.empty_like(mapped, device=device).copy_(mapped)
        torch.cuda.current_stream(index).synchronize()
    del mapped
    return own
