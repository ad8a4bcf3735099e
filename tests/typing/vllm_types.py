"""Checked by pyright and mypy, never run: the engine pool's public types.

Each `assert_type` must hold; each line marked `# type: ignore[...]` MUST be rejected.
"""

from __future__ import annotations

from typing_extensions import assert_type

import actormesh as am

# Type checkers read the source tree, where `actormesh.integrations` is the top-level integrations/
# folder (the mapping into the package exists only in the installed wheel and editable hook).
from integrations.vllm import (
    Engine,
    EnginePool,
    EngineStats,
    FakeEngine,
    Generation,
    Piece,
    PoolFuture,
    PoolStats,
)

pool = EnginePool("model-dir", 2, engine_args={"max_num_seqs": 8}, num_cpus=1, max_restarts=1)
assert_type(pool.mesh, am.ActorMesh[Engine])
assert_type(pool.generate([1, 2, 3], {"max_tokens": 8}), PoolFuture[Generation])
assert_type(pool.generate([1, 2], session="chat").get(timeout=5), Generation)
assert_type(pool.generate_group([1, 2], None, n=4), PoolFuture[list[Generation]])
assert_type(pool.pause("abort"), PoolFuture[None])
assert_type(pool.resume(), PoolFuture[None])
assert_type(pool.update_weights({"lm_head.weight": [0.0]}, version=3), PoolFuture[int])
assert_type(pool.stats(), PoolStats)
assert_type(pool.stats()["engines"][0], EngineStats)
assert_type(pool.weight_version, int)
assert_type(pool.mesh.methods.generate.choose([]).get(), list[Piece])
fake = EnginePool("fake", 8, engine_cls=FakeEngine, engine_args={"step_s": 0.001})


async def interruptible(p: EnginePool) -> None:
    await p.pause("keep")
    assert_type(await p.update_weights({}), int)
    await p.resume()
    assert_type(await p.generate([1]), Generation)
    async with EnginePool("model-dir") as entered:
        assert_type(entered, EnginePool)


# These MUST be rejected.
pool.pause("later")  # type: ignore[arg-type]
pool.generate_group([1, 2], None)  # type: ignore[call-arg]
EnginePool("model-dir", 2, shape=4)  # type: ignore[call-arg]
EnginePool("model-dir", 2, num_cpus="one")  # type: ignore[arg-type]
EnginePool("model-dir", engine_cls=dict)  # type: ignore[arg-type]
