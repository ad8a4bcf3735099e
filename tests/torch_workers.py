"""Actor classes for the torch integration tests (imported by the actor processes)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import torch
import torch.distributed as dist

import actormesh as am
from actormesh.integrations.torch import current_world, process_group

TORCHRUN = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class LinkMember:
    """What any actor of a link does: report its link rank, send or receive a broadcast."""

    @am.method
    def link_rank(self, name: str) -> tuple[int, int, int | None]:
        """The rank in link `name`, its size, and the rank torch translates for a world member."""
        group = process_group(name)
        translated = dist.get_rank(group) if dist.is_initialized() else None
        return group.rank(), group.size(), translated

    @am.method
    def broadcast(self, name: str, values: list[float]) -> list[float]:
        """Link rank 0 sends `values`; the others receive into zeros of the same length."""
        group = process_group(name)
        tensor = torch.tensor(values) if group.rank() == 0 else torch.zeros(len(values))
        dist.broadcast(tensor, group=group, group_src=0)
        return [float(v) for v in tensor]


class TorchWorker(LinkMember):
    """A process of a TorchMesh world: reports how it joined and runs collectives."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        # Read in the user's __init__: the world is already formed.
        self.at_init = {
            "env": {name: os.environ.get(name) for name in TORCHRUN},
            "initialized": dist.is_initialized(),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
        }

    @am.method
    def joined(self) -> dict[str, Any]:
        return {**self.at_init, "tag": self.tag}

    @am.method
    def world(self) -> dict[str, Any]:
        """The current world, and the torchrun variables as set now."""
        return {"world": current_world(), "env": {name: os.environ.get(name) for name in TORCHRUN}}

    @am.method
    def world_sum(self, value: float) -> float:
        """The sum over the world of `value * (rank + 1)`."""
        tensor = torch.tensor([value * (dist.get_rank() + 1)])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @am.method
    def world_sums_on_both_devices(self, value: float) -> tuple[float, float]:
        """`world_sum` of a CPU tensor and of a CUDA tensor (an nccl world takes both)."""
        sums = []
        for device in ("cpu", "cuda"):
            tensor = torch.tensor([value * (dist.get_rank() + 1)], device=device)
            dist.all_reduce(tensor, group=process_group("rank"))
            dist.all_reduce(tensor)
            sums.append(float(tensor.item()))
        return sums[0], sums[1]

    @am.method
    def dim_sum(self, dim: str) -> tuple[float, list[int]]:
        """The sum of the world ranks in this actor's group along `dim`, and that group's ranks."""
        group = process_group(dim)
        tensor = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(tensor, group=group)
        return float(tensor.item()), dist.get_process_group_ranks(group)

    @am.method
    def group_of(self, name: str) -> str:
        return repr(process_group(name))

    @am.method
    def sum_after_signal(self, signal: Any) -> float:
        """Tell `signal` this actor is about to enter a world all_reduce, then enter it."""
        import ray

        ray.get(signal.arrive.remote(), timeout=60)
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        return float(tensor.item())


class PlainWorker(LinkMember):
    """An actor of a plain ActorMesh: in no torch world, reachable through links."""

    @am.method
    def in_world(self) -> bool:
        return dist.is_initialized()


class AsyncPlainWorker:
    """An async actor of a plain ActorMesh: set-up code runs on its event loop."""

    @am.method
    async def broadcast(self, name: str, values: list[float]) -> list[float]:
        group = process_group(name)
        tensor = torch.zeros(len(values))
        dist.broadcast(tensor, group=group, group_src=0)
        return [float(v) for v in tensor]


class Signal:
    """An async Ray actor counting arrivals, so a test waits for actors to reach a point."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def arrive(self) -> None:
        self.count += 1
        self.changed.set()

    async def wait_for(self, count: int) -> int:
        while self.count < count:
            self.changed.clear()
            await self.changed.wait()
        return self.count
