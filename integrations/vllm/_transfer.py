"""Tensors over one collective group, from a sender's process to every engine worker.

A send is a stream of buckets. A bucket is one safetensors blob (whole tensors, cast to the
checkpoint's dtypes, at most `bucket_bytes` unless one tensor is larger), broadcast from group
rank 0 (the sender) as a uint8 tensor after its length; a length of 0 ends the stream.
Receivers read the tensors out of the received buffer without a copy, one bucket at a time, so
a send holds one bucket in flight however large the model.

The group is a bare `ProcessGroupGloo` (CPU tensors) or `ProcessGroupNCCL` (CUDA tensors) on a
`PrefixStore` of a `TCPStore` that the sender binds on a port the kernel picks: it belongs to no
torch world, so it never meets vLLM's own groups or the groups of a trainer's `TorchMesh`. Each
formation has an id; a process keeps one group per role and drops it when another formation
replaces it or a transfer on it fails (a failed collective leaves a group unusable).

Everything here runs in the sender's and the receivers' processes (engine workers, fake
engines), never on the driver.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import struct
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Backend, TCPStore

BACKENDS = ("gloo", "nccl")

_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U8": "uint8", "BOOL": "bool"}


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

    @property
    def size(self) -> int:
        return len(self.members) + 1

    def rank_of(self, engine: int) -> int:
        return self.members.index(engine) + 1

    def wire(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "members": list(self.members)}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Formation:
        return cls(str(raw["id"]), str(raw["host"]), int(raw["port"]),
                   tuple(int(m) for m in raw["members"]), str(raw["backend"]),
                   float(raw["timeout_s"]))


# -- groups, one per role and process ---------------------------------------------------------
_lock = threading.Lock()
_groups: dict[str, tuple[str, Backend]] = {}  # role -> (formation id, group)


def join(role: str, formation: Formation, rank: int, store: TCPStore | None = None) -> Backend:
    """This process's group of `formation` at `rank` (formed on first use; blocks until every
    member joined, up to the formation's timeout). Rank 0 passes its own store."""
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
    group: Backend
    if formation.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, formation.size, options)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, formation.size, timeout)
    with _lock:
        _groups[role] = (formation.id, group)
    return group


def drop(role: str) -> None:
    """Forget this process's group of `role` (its sockets close with it)."""
    with _lock:
        held = _groups.pop(role, None)
    if held is not None:
        held[1].shutdown()


def formed(role: str) -> str | None:
    """The formation id of this process's group of `role`, if it holds one."""
    with _lock:
        held = _groups.get(role)
    return None if held is None else held[0]


# -- buckets ----------------------------------------------------------------------------------
def dtype_of(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r}: not a torch dtype")
    return dtype


def pack(tensors: Iterable[tuple[str, Any]], dtypes: dict[str, str],
         bucket_bytes: int) -> Iterator[tuple[list[str], bytes]]:
    """Safetensors blobs of at most `bucket_bytes` of tensor data each (a larger tensor goes
    alone), each tensor cast to `dtypes[name]` on the CPU; yields (names, blob) lazily."""
    from safetensors.torch import save

    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in tensors:
        cpu = as_tensor(tensor).detach().to("cpu", dtype_of(dtypes[name])).contiguous()
        nbytes = cpu.numel() * cpu.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield list(bucket), bytes(save(bucket))
            bucket, size = {}, 0
        bucket[name] = cpu
        size += nbytes
    if bucket:
        yield list(bucket), bytes(save(bucket))


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


def read(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors blob held in a uint8 tensor, as views of it (no copy)."""
    header_len = struct.unpack("<Q", bytes(buffer[:8].cpu().numpy()))[0]
    header = json.loads(bytes(buffer[8:8 + header_len].cpu().numpy()))
    base = 8 + header_len
    out: dict[str, torch.Tensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = dtype_of(_SAFETENSORS_DTYPES[meta["dtype"]])
        out[name] = buffer[base + start:base + end].view(dtype).view(meta["shape"])
    return out


# -- the stream -------------------------------------------------------------------------------
def send_bucket(group: Backend, blob: bytes, device: str) -> None:
    """Broadcast one blob from rank 0 (its length first)."""
    import torch

    _broadcast(group, torch.tensor([len(blob)], dtype=torch.int64, device=device))
    with warnings.catch_warnings():  # the root only reads the blob: it need not be writable
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(blob, dtype=torch.uint8)
    _broadcast(group, data if device == "cpu" else data.to(device))


def send_end(group: Backend, device: str) -> None:
    import torch

    _broadcast(group, torch.zeros(1, dtype=torch.int64, device=device))


def receive(group: Backend, device: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors rank 0 broadcasts, bucket by bucket, until it ends the stream."""
    import torch

    while True:
        length = torch.zeros(1, dtype=torch.int64, device=device)
        _broadcast(group, length)
        nbytes = int(length.item())
        if nbytes == 0:
            return
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        _broadcast(group, buffer)
        yield from read(buffer).items()


def _broadcast(group: Any, tensor: torch.Tensor) -> None:  # Backend: untyped in torch's stubs
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()
