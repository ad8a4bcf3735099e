"""Inside vLLM's EngineCore process: the worker extension that reads and loads weights.

vLLM mixes this class into its worker (`worker_extension_cls`), so `AsyncLLM.collective_rpc`
reaches these methods where the model lives. Arguments and results cross a msgpack channel:
weights travel as safetensors bytes, or, from a `WeightSender`, over a collective group the
worker joins, or through memory the sender shares on this host (`_transfer`, `_shared`). Loading goes through `model_runner.reload_weights`
(checkpoint format, whole modules): in float32 on the CPU, the model's own `load_weights`
changes nothing, since the CPU kernels repack weights when they are loaded.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

EXTENSION = "actormesh.integrations.vllm._worker.WeightLoader"

ROLE = "engine"
"""The role of an engine worker's group in `_transfer` (one per process)."""


class WeightLoader:
    """Methods vLLM adds to its worker; `self` is the worker (it has `model_runner`)."""

    model_runner: Any

    def _checkpoint_files(self) -> list[str]:
        config = self.model_runner.model_config
        path = str(config.model)
        if not os.path.isdir(path):
            from huggingface_hub import snapshot_download

            path = snapshot_download(path, revision=config.revision, local_files_only=True)
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise RuntimeError(
                f"no *.safetensors checkpoint in {path}: weight updates need one to check names "
                "and shapes against"
            )
        return files

    def actormesh_weight_spec(self) -> dict[str, Any]:
        """Checkpoint names with shape, dtype and the model module each loads into."""
        from safetensors import safe_open

        packed: dict[str, list[str]] = dict(
            getattr(self.model_runner.get_model(), "packed_modules_mapping", {}) or {}
        )
        fused_of = {member: fused for fused, members in packed.items() for member in members}
        shapes: dict[str, list[int]] = {}
        dtypes: dict[str, str] = {}
        groups: dict[str, str] = {}
        for file in self._checkpoint_files():
            with safe_open(file, "pt") as f:
                for name in f.keys():
                    tensor = f.get_slice(name)
                    shapes[name] = list(tensor.get_shape())
                    dtype = str(tensor.get_dtype())
                    dtypes[name] = _DTYPES.get(dtype, dtype.lower())
                    module, _, _ = name.rpartition(".")
                    parent, _, leaf = module.rpartition(".")
                    fused = fused_of.get(leaf)
                    groups[name] = f"{parent}.{fused}" if fused else module
        return {"shapes": shapes, "dtypes": dtypes, "groups": groups}

    def actormesh_read_weights(self, names: list[str]) -> bytes:
        """The checkpoint's tensors of `names`, as safetensors bytes."""
        from safetensors import safe_open
        from safetensors.torch import save

        wanted = set(names)
        tensors = {}
        for file in self._checkpoint_files():
            with safe_open(file, "pt") as f:
                for name in wanted.intersection(f.keys()):
                    tensors[name] = f.get_tensor(name)
        missing = wanted - set(tensors)
        if missing:
            raise KeyError(f"not in the checkpoint: {sorted(missing)}")
        return bytes(save(tensors))

    def actormesh_load_weights(self, blobs: list[bytes]) -> int:
        """Load whole modules from safetensors blobs (a name in a later one wins) in one go."""
        from safetensors.torch import load

        weights: dict[str, Any] = {}
        for blob in blobs:
            weights.update(load(blob))
        self._reload(iter(weights.items()))
        return len(weights)

    def actormesh_receive_weights(self, formation: dict[str, Any], rank: int,
                                  extra: list[bytes]) -> int:
        """Join the sender's group (as `rank`), receive the buckets it broadcasts and load
        them as they arrive, after the `extra` blobs, in one reload: one bucket at a time."""
        import torch
        from safetensors.torch import load

        from ._transfer import Formation, drop, join, receive, receive_device

        spec = Formation.from_wire(formation)
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError(f"backend 'nccl' needs a GPU, and engine group rank {rank} "
                               "sees none")
        device = receive_device(spec.backend)
        received: list[str] = []

        def stream(group: Any) -> Iterator[tuple[str, Any]]:
            for blob in extra:
                yield from load(blob).items()
            for name, tensor in receive(group, device):
                received.append(name)
                yield name, tensor

        try:
            self._reload(stream(join(ROLE, spec, rank)))
        except BaseException:
            drop(ROLE)  # a cut collective leaves the group unusable: the next send forms anew
            raise
        return len(received)

    def _reload(self, weights: Any) -> None:
        """`reload_weights` in checkpoint format; if it fails half-way (a stream cut), finish
        the reload so that no parameter is left on the meta device (each layer that got none of
        its tensors keeps its old ones): the pool then loads the old weights back."""
        try:
            self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        except BaseException:
            from vllm.model_executor.model_loader.reload import layerwise

            finish: Any = layerwise.finalize_layerwise_reload
            finish(self.model_runner.get_model(), self.model_runner.model_config)
            raise
