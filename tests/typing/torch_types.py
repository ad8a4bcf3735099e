"""Checked by pyright and mypy, never run: `TorchMesh` keeps the typing of `ActorMesh`, and the
helpers used inside the actors give torch's own types.

Each `assert_type` must hold; each line marked `# type: ignore[...]` MUST be rejected.
"""

from __future__ import annotations

from torch.distributed import ProcessGroup
from typing_extensions import assert_type

import actormesh as am

# Type checkers read the source tree, where `actormesh.integrations` is the top-level integrations/
# folder (the mapping into the package exists only in the installed wheel and editable hook).
from integrations.torch import Link, TorchMesh, TorchWorld, current_world, link, process_group


class Trainer:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @am.method
    def step(self, batch: list[float]) -> float:
        assert_type(process_group("dp"), ProcessGroup)
        assert_type(current_world(), TorchWorld)
        assert_type(current_world().local_rank, int)
        return sum(batch) * self.lr


def on_restart(view: am.ActorMesh[Trainer]) -> None:
    view.methods.step.all([0.0]).get(timeout=60)


mesh = TorchMesh(Trainer, {"dp": 2}, args=(0.1,), num_cpus=1)
assert_type(mesh, TorchMesh[Trainer])
assert_type(mesh.methods.step.all([1.0]), am.MeshFuture[am.ValueMesh[float]])
assert_type(mesh.methods.step.choose([1.0]).get(), float)
assert_type(mesh[0], am.ActorMesh[Trainer])
assert_type(mesh.backend, str)
assert_type(mesh.epoch, int)
with TorchMesh(Trainer, 2, backend="gloo", timeout_s=30, max_restarts=1, on_restart=on_restart,
               args=(0.1,)) as entered:
    assert_type(entered, TorchMesh[Trainer])
weights = link(mesh[0], mesh[1], name="weights", timeout_s=30)
assert_type(weights, Link)
assert_type(weights.size, int)


def other_restart(view: am.ActorMesh[int]) -> None: ...


# These MUST be rejected.
mesh.methods.step.all("not a batch")  # type: ignore[arg-type]
TorchMesh(Trainer, 2, num_cpus="one")  # type: ignore[arg-type]
TorchMesh(Trainer, 2, timeout_s="60")  # type: ignore[arg-type]
TorchMesh(Trainer, 2, backend=1)  # type: ignore[arg-type]
TorchMesh(Trainer, 2, max_restarts=1, on_restart=other_restart)  # type: ignore[arg-type]
link(mesh, name=1)  # type: ignore[arg-type]
link(mesh, mesh[0], "weights")  # type: ignore[call-arg, arg-type]
process_group(0)  # type: ignore[arg-type]
