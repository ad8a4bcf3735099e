"""Actor classes for the JAX integration tests (imported by the actor processes)."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import actormesh as am
from actormesh.integrations.jax import checkpoint


class JaxWorker:
    """One JAX process: reports how it joined, runs collectives, saves checkpoints."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        # Read in the user's __init__: jax.distributed is already up.
        self.joined = {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "rank": am.current_rank().rank,
            "local_devices": jax.local_device_count(),
            "devices": jax.device_count(),
            "platform": jax.devices()[0].platform,
        }

    @am.method
    def state(self) -> dict[str, Any]:
        return {**self.joined, "tag": self.tag}

    @am.method
    def allgather(self, value: int) -> list[int]:
        """`value + process_index` of every process, gathered across processes."""
        mine = np.array([value + jax.process_index()], dtype=np.int32)
        gathered = multihost_utils.process_allgather(mine)
        return [int(v) for v in np.asarray(gathered).reshape(-1)]

    @am.method
    def psum(self, value: float) -> float:
        """The sum over processes of `value * (process_index + 1)`, by a psum over all devices."""
        mesh = jax.make_mesh((jax.device_count(),), ("p",))
        mine = value * (jax.process_index() + 1) / jax.local_device_count()
        local = np.full((jax.local_device_count(),), mine, np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), local)
        summed = jax.jit(jax.shard_map(
            lambda a: jax.lax.psum(a, "p"), mesh=mesh, in_specs=P("p"), out_specs=P("p")
        ))(x)
        return float(summed.addressable_data(0)[0])

    @am.method
    def batch_sum(self, batch: np.ndarray) -> float:
        return float(jnp.sum(jnp.asarray(batch)))

    @am.method
    def save(self, path: str, payload: bytes) -> bool:
        """`checkpoint.save` of `payload`; `{rank}` in `path` gives each process its own path."""
        return checkpoint.save(path.format(rank=jax.process_index()), payload)

    @am.method
    def listdir(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))
