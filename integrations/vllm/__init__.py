"""vLLM engines on an `ActorMesh`: routing, interruptible generation, weight updates, failover.

```python
from actormesh.integrations.vllm import EnginePool

with EnginePool("/path/to/model", num_engines=2) as pool:
    gen = pool.generate([1, 5, 9], {"max_tokens": 32, "temperature": 0}).get()
    gen.token_ids, gen.logprobs, gen.weight_versions, gen.engine, gen.interruptions
    # from async code: await pool.pause("abort"); await pool.update_weights({...}); ...
```

`EnginePool` runs one engine per actor of `pool.mesh` (dim `"engine"`); each request is one
`choose` on the mesh, so the native balancer (least loaded by default) counts the requests
outstanding per engine, and `session=` is the call's affinity key. A weight update lands on
every live engine or is undone (`WeightUpdateError`, with each engine's `EngineUpdate`); it
comes from the driver (`update_weights`) or, never through the driver, from a trainer's process
(`pool.weight_sender()`, a picklable `WeightSender` whose `send` streams the tensors over one
gloo or nccl group to every engine worker).

The engine protocol (`Engine`, an async actor class taking `(model, engine_args)`):
`generate(list[SubRequest]) -> list[Piece]` returns when every sub-request has finished or been
cut; `pause(mode)` returns once quiet; `resume()`; `stats() -> EngineStats`;
`weight_spec() -> WeightSpec`; `read_weights(names) -> bytes`,
`load_weights(version, blobs) -> int` (safetensors blobs or refs of them, whole modules) and
`receive_weights(formation, extra, version) -> int` (streamed by a sender); `restore(version,
paused, blobs)` after a restart. `VllmEngine` (vLLM's `AsyncLLM`, the default) and `FakeEngine`
(deterministic, no vLLM) implement it. Importing this package never imports vLLM.
"""

from ._engine import VllmEngine
from ._pool import DIM, EnginePool, MeshOptions, PoolFuture, PoolStats
from ._protocol import PAUSE_MODES, Engine, EngineStats, PauseMode, Piece, SubRequest, WeightSpec
from ._requests import SAMPLING_FIELDS, Generation
from ._sender import DEFAULT_BUCKET_BYTES, WeightSender
from ._updates import EngineUpdate, WeightUpdate, WeightUpdateError
from .fake import FakeEngine

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DIM",
    "PAUSE_MODES",
    "SAMPLING_FIELDS",
    "Engine",
    "EnginePool",
    "EngineStats",
    "EngineUpdate",
    "FakeEngine",
    "Generation",
    "MeshOptions",
    "PauseMode",
    "Piece",
    "PoolFuture",
    "PoolStats",
    "SubRequest",
    "VllmEngine",
    "WeightSender",
    "WeightSpec",
    "WeightUpdate",
    "WeightUpdateError",
]
