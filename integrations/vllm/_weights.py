"""The pool's side of a weight update: check names and shapes, complete fused modules, pack.

Engines load whole modules only (see `WeightSpec`), so a partial update is completed with the
current value of every other member of each module it touches: the value the pool was given
last for that name, or else the checkpoint's, which an engine reads once. The packed blob is
safetensors bytes: a tensor passed to vLLM's `collective_rpc` would arrive as a list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._protocol import WeightSpec


def shape_of(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        raise TypeError(f"a weight must be an array or a tensor, got {type(value).__name__}")
    return tuple(int(d) for d in shape)


def check(weights: Mapping[str, Any], spec: WeightSpec) -> None:
    """Raise a ValueError naming every unknown name and every wrong shape, before any load."""
    if not weights:
        raise ValueError("update_weights got no weights")
    unknown = sorted(n for n in weights if n not in spec.shapes)
    if unknown:
        close = sorted(spec.shapes)[:5]
        raise ValueError(
            f"unknown weight name(s) {unknown}: not parameters of the engines' model "
            f"(its checkpoint names, e.g. {close})"
        )
    wrong = [f"{n}: {shape_of(v)} instead of {spec.shapes[n]}"
             for n, v in weights.items() if shape_of(v) != spec.shapes[n]]
    if wrong:
        raise ValueError(f"wrong weight shape(s): {'; '.join(sorted(wrong))}")


def missing_members(names: set[str], spec: WeightSpec) -> set[str]:
    """The names an update of `names` must also carry so that every module it touches is whole."""
    modules = {spec.groups[n] for n in names}
    return {n for n, module in spec.groups.items() if module in modules} - names


def pack(weights: Mapping[str, Any], spec: WeightSpec) -> bytes:
    """Safetensors bytes of `weights`, each cast to the checkpoint's dtype (torch if any value
    is a torch tensor or the dtype needs it, numpy otherwise)."""
    uses_torch = any(type(v).__module__.startswith("torch") for v in weights.values()) or any(
        spec.dtypes[n] == "bfloat16" for n in weights
    )
    if uses_torch:
        import numpy as np
        import torch
        from safetensors.torch import save as save_torch

        def tensor(value: Any) -> Any:  # a copy of an array: it may be read-only (from Ray)
            return value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(
                np.array(value))

        tensors = {n: tensor(v).to("cpu", getattr(torch, spec.dtypes[n])).contiguous()
                   for n, v in weights.items()}
        return bytes(save_torch(tensors))
    import numpy as np
    from safetensors.numpy import save as save_numpy

    arrays = {n: np.ascontiguousarray(np.asarray(v), dtype=spec.dtypes[n])
              for n, v in weights.items()}
    return bytes(save_numpy(arrays))


def unpack(blob: bytes) -> dict[str, Any]:
    """The tensors of a safetensors blob, as torch tensors when torch is there, else numpy."""
    try:
        from safetensors.torch import load as load_torch
    except ImportError:
        from safetensors.numpy import load as load_numpy

        return dict(load_numpy(blob))
    return dict(load_torch(blob))
