"""Data-parallel training of a small MLP across 2 JAX processes, each a Ray actor, on the CPU.

    python examples/jax_data_parallel.py

Every process holds the same parameters. The driver sends each step's whole batch to both
processes (`all` puts it in the object store once); each process takes its half as its shard of
one global array, and the jitted step averages the gradients across processes, so the parameters
stay identical. At the end one process per file system saves them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import ray
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import actormesh as am
from actormesh.integrations.jax import JaxMesh, checkpoint

Params = dict[str, jax.Array]


def init_params(key: jax.Array, sizes: tuple[int, ...] = (16, 64, 1)) -> Params:
    params: Params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in)
        params[f"b{i}"] = jnp.zeros((n_out,))
    return params


def predict(params: Params, x: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w0"] + params["b0"])
    return (hidden @ params["w1"] + params["b1"])[:, 0]


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((predict(params, x) - y) ** 2)


class Trainer:
    """One JAX process. `jax.distributed` is up when `__init__` runs."""

    def __init__(self, learning_rate: float, seed: int) -> None:
        mesh = jax.make_mesh((jax.device_count(),), ("data",))
        self.replicated = NamedSharding(mesh, P())
        self.by_rows = NamedSharding(mesh, P("data"))
        host = jax.device_get(init_params(jax.random.key(seed)))  # the same seed everywhere
        self.params = {k: self.global_array(v, self.replicated) for k, v in host.items()}

        def step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)  # a mean over all processes
            return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads), loss

        self.step_fn = jax.jit(step, out_shardings=(self.replicated, self.replicated))

    @staticmethod
    def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
        """This process's part of a global array whose full value every process has."""
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    @am.method
    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        xs, ys = self.global_array(x, self.by_rows), self.global_array(y, self.by_rows)
        self.params, loss = self.step_fn(self.params, xs, ys)
        return float(loss.addressable_data(0))

    def host_params(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v.addressable_data(0)) for k, v in self.params.items()}

    @am.method
    def digest(self) -> str:
        """A hash of this process's parameters, to compare across processes."""
        digest = hashlib.sha256()
        for name, value in sorted(self.host_params().items()):
            digest.update(name.encode() + value.tobytes())
        return digest.hexdigest()[:16]

    @am.method
    def save(self, path: str) -> bool:
        return checkpoint.save(path, lambda file: np.savez(file, **self.host_params()))


def make_data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 16)).astype(np.float32)
    y = (np.sin(x[:, 0]) + 0.5 * x[:, 1]).astype(np.float32)
    return x, y


def main(steps: int = 60, batch_size: int = 4096) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    with JaxMesh(Trainer, 2, platforms="cpu", args=(0.2, 0)) as mesh:
        mesh.wait_ready(timeout=300)
        print(f"2 JAX processes joined at {mesh.coordinator_address}")
        losses = []
        for step in range(steps):
            x, y = make_data(rng, batch_size)  # 256 KiB: put in the object store once per step
            per_process = list(mesh.methods.step.all(x, y).get(timeout=120))
            assert per_process[0] == per_process[1], per_process
            losses.append(per_process[0])
            if step % 10 == 0 or step == steps - 1:
                print(f"step {step:3d}  loss {losses[-1]:.4f}")
        digests = list(mesh.methods.digest.all().get(timeout=60))
        print(f"parameter digests per process: {digests}")
        path = os.path.join(tempfile.mkdtemp(), "params.npz")
        wrote = list(mesh.methods.save.all(path).get(timeout=60))
        print(f"checkpoint {path}: written by processes {[r for r, w in enumerate(wrote) if w]}")
    assert losses[-1] < 0.25 * losses[0], "the loss did not fall"
    assert digests[0] == digests[1], "the processes' parameters differ"
    return {"losses": losses, "digests": digests, "writers": wrote}


if __name__ == "__main__":
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        main()
    finally:
        ray.shutdown()
