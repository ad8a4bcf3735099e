"""Tensors over one collective group, from a sender's process to every engine worker.

A send is a stream of buckets. A bucket is a safetensors blob (whole tensors, cast to the
checkpoint's dtypes, at most `bucket_bytes` of tensor data unless one tensor is larger) that
the sender never builds: it broadcasts from group rank 0 the blob's header (after its two
lengths), then each tensor straight from its own memory; receivers allocate the blob once and
receive each tensor into its place in it. Lengths of 0 end the stream. Engines read the tensors
out of the received blob without a copy, one bucket at a time, so a receiver holds one bucket in
flight however large the model, and the sender copies nothing it need not cast.

The group is a bare `ProcessGroupGloo` (CPU tensors) or `ProcessGroupNCCL` (CUDA tensors) on a
`PrefixStore` of a `TCPStore` that the sender binds on a port the kernel picks: it belongs to no
torch world, so it never meets vLLM's own groups or the groups of a trainer's `TorchMesh`. Over
`ipc` (every member on the sender's host) the "group" is a `_shared.Channel` on that store: the
sender shares each blob's memory instead of broadcasting it, and receivers map it. Each
formation has an id; a process keeps one group per role and drops it when another formation
replaces it or a transfer on it fails (a failed collective leaves a group unusable); an ipc
formation serves one send. A gloo formation, and an ipc one of CPU tensors from the port's host,
has a keeper as its last rank: the pool's port, which keeps the blobs it receives.

Everything here runs in the sender's and the receivers' processes (engine workers, fake
engines, the port), never on the driver.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import struct
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import _shared

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Backend, TCPStore

    Group = Backend | _shared.Channel

BACKENDS = ("gloo", "nccl", "ipc")

_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U8": "uint8", "BOOL": "bool"}
_SAFETENSORS_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class Formation:
    """One group over the sender (rank 0) and the engines of `members` (ranks 1.., in order).

    Crosses vLLM's msgpack channel as a plain dict (`wire`)."""

    id: str
    host: str
    port: int
    members: tuple[int, ...]  # engine ranks
    backend: str
    timeout_s: float
    keeper: bool = False  # the pool's port receives too, as the last rank (it is on the host)

    @property
    def size(self) -> int:
        return len(self.members) + 1 + self.keeper

    @property
    def keeper_rank(self) -> int:
        return len(self.members) + 1

    def rank_of(self, engine: int) -> int:
        return self.members.index(engine) + 1

    def wire(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "members": list(self.members)}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Formation:
        return cls(str(raw["id"]), str(raw["host"]), int(raw["port"]),
                   tuple(int(m) for m in raw["members"]), str(raw["backend"]),
                   float(raw["timeout_s"]), bool(raw.get("keeper", False)))


# -- groups, one per role and process ---------------------------------------------------------
_lock = threading.Lock()
_groups: dict[str, tuple[str, Group]] = {}  # role -> (formation id, group)


def join(role: str, formation: Formation, rank: int, store: TCPStore | None = None) -> Group:
    """This process's group of `formation` at `rank` (formed on first use; blocks until every
    member joined, up to the formation's timeout; an ipc channel waits for no one). Rank 0
    passes its own store."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    with _lock:
        held = _groups.get(role)
    if held is not None and held[0] == formation.id:
        return held[1]
    drop(role)
    timeout = datetime.timedelta(seconds=formation.timeout_s)
    if store is None:
        store = TCPStore(formation.host, formation.port, is_master=False, timeout=timeout)
    prefixed = PrefixStore(f"actormesh.weights.{formation.id}", store)
    group: Group
    if formation.backend == "ipc":
        group = _shared.Channel(prefixed, rank, formation.size, formation.timeout_s,
                                _shared.files(role) if rank == 0 else None)
    elif formation.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, formation.size, options)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, formation.size, timeout)
    with _lock:
        _groups[role] = (formation.id, group)
    return group


def drop(role: str, formation_id: str | None = None) -> None:
    """Forget this process's group of `role` (its sockets close with it); with `formation_id`,
    only if it is that formation's (a late failure must not drop the group that replaced it)."""
    with _lock:
        held = _groups.get(role)
        if held is None or formation_id not in (None, held[0]):
            return
        del _groups[role]
    held[1].shutdown()


def formed(role: str) -> str | None:
    """The formation id of this process's group of `role`, if it holds one."""
    with _lock:
        held = _groups.get(role)
    return None if held is None else held[0]


# -- buckets ----------------------------------------------------------------------------------
def receive_device(backend: str) -> str:
    """Where a receiver takes a send's buckets: the CPU over gloo, or in a process without a
    GPU; else this process's current GPU (nccl receives there; ipc copies CUDA buckets there,
    and maps CPU ones wherever this says)."""
    import torch

    if backend == "gloo" or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"


def dtype_of(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r}: not a torch dtype")
    return dtype


def buckets(tensors: Iterable[tuple[str, Any]], dtypes: dict[str, str], bucket_bytes: int,
            device: str = "cpu") -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The tensors in buckets of at most `bucket_bytes` of data (a larger tensor goes alone),
    each cast to `dtypes[name]` on `device` and contiguous (no copy where it already is);
    lazily, so that a cast copy lives no longer than its bucket."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in tensors:
        tensor = as_tensor(value).detach().to(device, dtype_of(dtypes[name])).contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def layout(bucket: list[tuple[str, torch.Tensor]]) -> tuple[bytes, list[torch.Tensor]]:
    """A bucket's safetensors header (its length first, padded to 8 bytes) and its tensors in
    the order of their data, widest dtype first, so that every tensor is aligned."""
    ordered = sorted(bucket, key=lambda item: -item[1].element_size())
    meta: dict[str, Any] = {}
    offset = 0
    for name, tensor in ordered:
        nbytes = tensor.numel() * tensor.element_size()
        meta[name] = {"dtype": _SAFETENSORS_NAMES[str(tensor.dtype).removeprefix("torch.")],
                      "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, [tensor for _, tensor in ordered]


def blob(bucket: list[tuple[str, torch.Tensor]]) -> bytes:
    """The bucket as safetensors bytes (the blob its receivers get), on the CPU."""
    head, tensors = layout(bucket)
    return head + b"".join(_as_bytes(t).cpu().numpy().tobytes() for t in tensors)


def as_tensor(value: Any) -> torch.Tensor:
    """A torch tensor of `value` (numpy arrays are wrapped without a copy when they can be)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if not array.flags.writeable:  # an array from Ray's object store: torch wants writable
        array = array.copy()
    return torch.from_numpy(array)


def header(buffer: torch.Tensor) -> tuple[int, dict[str, Any]]:
    """Where the data of a safetensors blob (held in a uint8 tensor) starts, and its tensors'
    entries in the order of their data."""
    header_len = struct.unpack("<Q", bytes(buffer[:8].cpu().numpy()))[0]
    entries = json.loads(bytes(buffer[8:8 + header_len].cpu().numpy()))
    entries.pop("__metadata__", None)
    ordered = dict(sorted(entries.items(), key=lambda item: item[1]["data_offsets"][0]))
    return 8 + header_len, ordered


def read(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors blob held in a uint8 tensor, as views of it (no copy)."""
    base, entries = header(buffer)
    out: dict[str, torch.Tensor] = {}
    for name, meta in entries.items():
        start, end = meta["data_offsets"]
        dtype = dtype_of(_SAFETENSORS_DTYPES[meta["dtype"]])
        out[name] = buffer[base + start:base + end].view(dtype).view(meta["shape"])
    return out


# -- the stream -------------------------------------------------------------------------------
def send_bucket(group: Group, bucket: list[tuple[str, torch.Tensor]], device: str) -> None:
    """Broadcast one bucket from rank 0: the lengths of its header and data, the header, then
    each tensor from its own memory (tensors on `device`); over ipc, share it."""
    import torch

    head, tensors = layout(bucket)
    if isinstance(group, _shared.Channel):
        _shared.send(group, head, tensors, device)
        return
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    _broadcast(group, torch.tensor([len(head), nbytes], dtype=torch.int64, device=device))
    _broadcast(group, torch.frombuffer(bytearray(head), dtype=torch.uint8).to(device))
    for tensor in tensors:
        if tensor.numel():
            _broadcast(group, _as_bytes(tensor))


def send_end(group: Group, device: str) -> None:
    import torch

    if isinstance(group, _shared.Channel):
        _shared.end(group)
        return
    _broadcast(group, torch.zeros(2, dtype=torch.int64, device=device))


def receive_blobs(group: Group, device: str) -> Iterator[torch.Tensor]:
    """The buckets rank 0 broadcasts (or shares, over ipc), each as one safetensors blob in a
    uint8 tensor, until it ends the stream."""
    import torch

    if isinstance(group, _shared.Channel):
        yield from _shared.receive(group, device)
        return
    while True:
        lengths = torch.zeros(2, dtype=torch.int64, device=device)
        _broadcast(group, lengths)
        head_len, nbytes = (int(n) for n in lengths.tolist())
        if head_len == 0:
            return
        buffer = torch.empty(head_len + nbytes, dtype=torch.uint8, device=device)
        _broadcast(group, buffer[:head_len])
        base, entries = header(buffer)
        for meta in entries.values():
            start, end = meta["data_offsets"]
            if end > start:
                _broadcast(group, buffer[base + start:base + end])
        yield buffer


def receive(group: Group, device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors rank 0 broadcasts, bucket by bucket, until it ends the stream."""
    for buffer in receive_blobs(group, device):
        yield from read(buffer).items()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view: no copy)."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


def _broadcast(group: Any, tensor: torch.Tensor) -> None:  # Backend: untyped in torch's stubs
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()
