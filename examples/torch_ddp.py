"""Data-parallel training with DistributedDataParallel on 2 processes (gloo), each a Ray actor.

    python examples/torch_ddp.py

`TorchMesh` forms the torch world before `Trainer.__init__` runs, so the trainer wraps its model
in `DistributedDataParallel` as it would under torchrun. Each step the driver `shard`s one batch
(a dict of tensors) across the processes; DDP averages the gradients in `backward`, so the
parameters stay identical on every process, which the end of the run checks.
"""

from __future__ import annotations

import hashlib

import ray
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import actormesh as am
from actormesh.integrations.torch import TorchMesh


class Trainer:
    """One process of the data-parallel job. The torch world exists when `__init__` runs."""

    def __init__(self, learning_rate: float, seed: int) -> None:
        torch.manual_seed(seed)  # DDP also copies rank 0's parameters to the others here
        model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
        self.model = DistributedDataParallel(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=learning_rate)

    @am.method(dispatch=am.dispatch.split())
    def step(self, batch: dict[str, torch.Tensor]) -> list[float]:
        """One step on this process's rows of the batch; returns [its loss]."""
        self.optimizer.zero_grad()
        loss = nn.functional.mse_loss(self.model(batch["x"])[:, 0], batch["y"])
        loss.backward()  # DDP all-reduces the gradients across the processes
        self.optimizer.step()
        return [float(loss)]

    @am.method
    def digest(self) -> str:
        """A hash of this process's parameters, to compare across processes."""
        digest = hashlib.sha256()
        for name, value in sorted(self.model.module.state_dict().items()):
            digest.update(name.encode() + value.numpy().tobytes())
        return f"rank {dist.get_rank()}: {digest.hexdigest()[:16]}"


def make_batch(generator: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    x = torch.randn(n, 16, generator=generator)
    return {"x": x, "y": torch.sin(x[:, 0]) + 0.5 * x[:, 1]}


def main(steps: int = 60, batch_size: int = 512) -> tuple[list[float], list[str]]:
    generator = torch.Generator().manual_seed(0)
    with TorchMesh(Trainer, {"dp": 2}, args=(0.1, 0), num_cpus=1) as mesh:
        mesh.wait_ready(timeout=300)
        print(f"2 processes joined a {mesh.backend} world")
        losses = []
        for step in range(steps):
            per_process = mesh.methods.step.shard(make_batch(generator, batch_size)).get(timeout=120)
            losses.append(sum(per_process) / len(per_process))
            if step % 10 == 0 or step == steps - 1:
                print(f"step {step:3d}  loss {losses[-1]:.4f}")
        digests = list(mesh.methods.digest.all().get(timeout=60))
    print("parameters: " + ", ".join(digests))
    assert losses[-1] < 0.5 * losses[0], "the loss did not fall"
    assert len({d.split(": ")[1] for d in digests}) == 1, "the processes' parameters differ"
    print(f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}; parameters identical on every rank")
    return losses, digests


if __name__ == "__main__":
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        main()
    finally:
        ray.shutdown()
