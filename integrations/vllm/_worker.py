"""Inside vLLM's EngineCore process: the worker extension that reads and loads weights.

vLLM mixes this class into its worker (`worker_extension_cls`), so `AsyncLLM.collective_rpc`
reaches these methods where the model lives. Arguments and results cross a msgpack channel:
weights travel as safetensors bytes. Loading goes through `model_runner.reload_weights`
(checkpoint format, whole modules): in float32 on the CPU, the model's own `load_weights`
changes nothing, since the CPU kernels repack weights when they are loaded.
"""

from __future__ import annotations

import glob
import os
from typing import Any

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

EXTENSION = "actormesh.integrations.vllm._worker.WeightLoader"


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

    def actormesh_load_weights(self, blob: bytes) -> int:
        """Load whole modules from safetensors bytes into the running model."""
        from safetensors.torch import load

        weights = load(blob)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()),
                                         is_checkpoint_format=True)
        return len(weights)
