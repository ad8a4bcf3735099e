"""A trainer's process for the weight-sender tests: it holds a `WeightSender` (pickled into it)
and sends from here, as a trainer's rank 0 does (importable by the actor processes)."""

from __future__ import annotations

import os
import pickle
from typing import Any

from workers import wait_until

import actormesh as am
from actormesh.integrations.vllm import EnginePool, WeightSender, _shared, _transfer


class Trainer:
    """Sends weights to a pool's engines from its own process."""

    def __init__(self, sender: WeightSender) -> None:
        self.sender = sender

    @am.method
    def send(self, weights: dict[str, Any], version: int | None = None,
             timeout: float | None = None) -> int:
        return self.sender.send(weights, version=version, timeout=timeout)

    @am.method
    def close_sender(self) -> None:
        self.sender.close()

    @am.method
    def send_from_gpu(self, weights: dict[str, Any]) -> int:
        """Send the weights from this process's GPU (as CUDA tensors)."""
        import torch

        return self.sender.send({name: torch.as_tensor(value).cuda()
                                 for name, value in weights.items()})

    @am.method
    def send_and_die(self, weights: dict[str, Any], after_buckets: int) -> int:
        """Send, and end this process once `after_buckets` buckets are out (mid-send)."""
        real = _transfer.send_bucket
        sent = 0

        def dying(*args: Any) -> None:
            nonlocal sent
            if sent == after_buckets:
                os._exit(1)
            sent += 1
            real(*args)

        _transfer.send_bucket = dying  # type: ignore[assignment]
        return self.sender.send(weights)

    @am.method
    def send_and_die_sharing(self, weights: dict[str, Any], bucket: int) -> int:
        """Send over ipc, and end this process while bucket `bucket` is shared: once every
        receiver has mapped it, before the sender lets go of it."""
        real = _shared.wait_acknowledged

        def dying(channel: _shared.Channel, keys: list[str]) -> None:
            real(channel, keys)
            if channel.bucket == bucket:
                os._exit(1)

        _shared.wait_acknowledged = dying  # type: ignore[assignment]
        return self.sender.send(weights)


def undone_since(pool: EnginePool, served: int, timeout_s: float) -> None:
    """The update a sender that died began after version `served` was reported, and undone: the
    pool still serves `served`."""
    wait_until(lambda: pool.stats()["weight_update"] is not None
               and pool.stats()["weight_update"].version > served, timeout=timeout_s)
    report = pool.stats()["weight_update"]
    assert report is not None and not report.committed
    assert pool.weight_version == served


def shm_names() -> set[str]:
    """The names in /dev/shm that a weight send could have left (ours, or torch's)."""
    return {n for n in os.listdir("/dev/shm") if "actormesh" in n or n.startswith("torch_")}


def shared_maps(_: Any = None) -> int:
    """How many shared weight buckets this process and its children (vLLM's EngineCore) map
    or hold open (run in an actor with `run_in_actors`)."""
    import psutil

    me = psutil.Process()
    return sum(_shared_in(p.pid) for p in [me, *me.children(recursive=True)])


def shared_here() -> int:
    """How many shared weight buckets this process alone maps or holds open. Not its children:
    a driver's children are the Ray cluster it started, whose pools' ports keep the buckets
    they were sent."""
    return _shared_in(os.getpid())


def _shared_in(pid: int) -> int:
    count = 0
    try:
        with open(f"/proc/{pid}/maps") as maps:
            count += sum("memfd:actormesh-weights" in line for line in maps)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # it ended meanwhile
        return count
    for fd in fds:
        try:
            count += "memfd:actormesh-weights" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # this descriptor closed while read (another thread's socket): the
            pass          # others still count
    return count


def cuda_receiver(wire: dict[str, Any], rank: int, out: Any) -> None:
    """A torch-only process, rank `rank` of the ipc formation `wire`: receive the buckets shared
    over CUDA IPC and put `(rank, their tensors on the CPU, pickled)` in `out`. Pickled, since a
    queue would share the tensors' memory, to be fetched from this process once it has ended."""
    plan = _transfer.Formation.from_wire(wire)
    group = _transfer.join("cuda-receiver", plan, rank)
    try:
        got = {name: tensor.cpu() for name, tensor in _transfer.receive(group, "cuda:0")}
    finally:
        _transfer.drop("cuda-receiver")
    out.put((rank, pickle.dumps(got)))
