"""Checked by pyright and mypy, never run: `JaxMesh` keeps the typing of `ActorMesh`.

Each `assert_type` must hold; each line marked `# type: ignore[...]` MUST be rejected.
"""

from __future__ import annotations

from typing_extensions import assert_type

import actormesh as am

# Type checkers read the source tree, where `actormesh.integrations` is the top-level integrations/
# folder (the mapping into the package exists only in the installed wheel and editable hook).
from integrations.jax import JaxMesh


class Trainer:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @am.method
    def step(self, batch: list[float]) -> float:
        return sum(batch) * self.lr


mesh = JaxMesh(Trainer, 2, args=(0.1,), num_cpus=1)
assert_type(mesh, JaxMesh[Trainer])
assert_type(mesh.methods.step.all([1.0]), am.MeshFuture[am.ValueMesh[float]])
assert_type(mesh.methods.step.choose([1.0]).get(), float)
assert_type(mesh[0], am.ActorMesh[Trainer])
assert_type(mesh.coordinator_address, str)
with JaxMesh(Trainer, 2, bundles=[{"CPU": 1}] * 2, args=(0.1,)) as entered:
    assert_type(entered, JaxMesh[Trainer])

# These MUST be rejected.
mesh.methods.step.all("not a batch")  # type: ignore[arg-type]
JaxMesh(Trainer)  # type: ignore[call-arg]
JaxMesh(Trainer, 2, shape=4)  # type: ignore[call-arg]
JaxMesh(Trainer, 2, num_cpus="one")  # type: ignore[arg-type]
