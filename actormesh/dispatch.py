"""Dispatch: how one `shard` call becomes per-actor calls, and their results one value.

A dispatch maps the arguments of one call to the positions (0 … size-1, row-major) of the mesh
being called, and maps the results of those positions back to one value. `split()` covers the
common case, splitting a batch; anything else is a subclass of `Dispatch`::

    class OnePerActor(am.Dispatch):
        \"\"\"Item i of the first argument goes to position i; results come back as a list.\"\"\"

        def split(self, shape, args, kwargs):
            items, *rest = args
            if len(items) > shape.size:
                raise ValueError(f"{len(items)} items for a mesh of {shape.size} actors")
            return {i: ((item, *rest), kwargs) for i, item in enumerate(items)}

        def collect(self, results):
            return [results[i] for i in sorted(results)]

The mesh calls `Dispatch.plan` once per call. A dispatch whose `collect` needs what `split` saw
(the shape, the padding) overrides `plan` and keeps that per-call state in the `Plan`, never on
itself: one dispatch serves many concurrent calls.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import numpy as np

from actormesh._shape import Shape

__all__ = ["Call", "Dispatch", "Plan", "split"]

Call = tuple[tuple[Any, ...], dict[str, Any]]
"""One actor's arguments: positional args and keyword args."""

Uneven = Literal["allow", "pad", "error"]
_UNEVEN: tuple[Uneven, ...] = ("allow", "pad", "error")


class Plan:
    """One call, dispatched: the arguments per position, and how to collect their results."""

    __slots__ = ("calls", "_collect")

    def __init__(
        self, calls: Mapping[int, Call], collect: Callable[[Mapping[int, Any]], Any]
    ) -> None:
        self.calls = calls
        self._collect = collect

    def collect(self, results: Mapping[int, Any]) -> Any:
        """Combine the results of `calls` (position → result) into the call's result."""
        return self._collect(results)


class Dispatch(ABC):
    """Splits one call's arguments across the positions of a mesh and collects the results.

    An argument object that appears in several positions' calls is put in the object store once
    (detected by identity), so a dispatch passes shared arguments through without copying them.
    """

    @abstractmethod
    def split(
        self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Mapping[int, Call]:
        """Position (0 … shape.size-1) → that actor's `(args, kwargs)`; positions left out are not called.

        Raise a ValueError or TypeError naming the bad value when the arguments cannot be split.
        """

    @abstractmethod
    def collect(self, results: Mapping[int, Any]) -> Any:
        """Position → that actor's result, for every position `split` returned; returns one value."""

    def plan(self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan:
        """Split one call and check the positions and arguments before any actor is called."""
        calls = self.split(shape, args, kwargs)
        # Typed as objects: a user's split may return anything, whatever its annotation says.
        returned: list[tuple[object, object]] = list(calls.items())
        for position, call in returned:
            if (
                isinstance(position, bool)
                or not isinstance(position, int)
                or not 0 <= position < shape.size
            ):
                raise ValueError(
                    f"{self!r}.split returned position {position!r}; "
                    f"positions are ints in 0..{shape.size - 1} for shape {shape}"
                )
            if not (
                isinstance(call, tuple)
                and len(call) == 2
                and isinstance(call[0], tuple)
                and isinstance(call[1], dict)
            ):
                raise TypeError(
                    f"{self!r}.split returned {call!r} for position {position}; expected (args tuple, kwargs dict)"
                )
        return Plan(calls, self.collect)


def split(axis: int = 0, *, dim: str | None = None, uneven: Uneven = "allow") -> Dispatch:
    """Split the first positional argument along `axis`; concatenate the results in rank order.

    The first argument may be a list or tuple (axis 0 only), a numpy array, a torch tensor, a jax
    array, or a dict or dataclass of these, whose values are split together and must agree in
    length. Every other argument reaches every actor as the same object. Results are concatenated
    along the same axis into the same type; results that are all None give None.

    Without `dim`, chunk i goes to position i. With `dim`, the batch is split over that named dim
    of the shape and replicated over the others: chunk k goes, as one shared object, to every
    position whose `dim` coordinate is k, and only the position whose other coordinates are all 0
    contributes chunk k's result.

    `uneven` says what happens when the length does not divide into equal chunks:
    - "allow": chunk sizes differ by at most one, like numpy.array_split. A batch shorter than the
      number of chunks leaves the trailing positions out (they are not called); an empty batch
      goes to chunk 0 alone, so its result still comes from an actor.
    - "pad": every chunk gets the same size, the last ones padded by repeating the last row, and
      the padding rows are stripped from the collected result. This assumes each actor returns
      one result row per input row, and raises a ValueError when the row count disagrees.
    - "error": a ValueError naming the length and the number of chunks.
    """
    if type(axis) is not int:
        raise TypeError(f"split(axis={axis!r}): axis must be an int")
    if dim is not None and (type(dim) is not str or not dim):
        raise TypeError(f"split(dim={dim!r}): dim must be a non-empty dim name or None")
    if uneven not in _UNEVEN:
        raise ValueError(
            f"split(uneven={uneven!r}): uneven must be one of {', '.join(map(repr, _UNEVEN))}"
        )
    return _Split(axis, dim, uneven)


class _Split(Dispatch):
    def __init__(self, axis: int, dim: str | None, uneven: Uneven) -> None:
        self._axis = axis
        self._dim = dim
        self._uneven: Uneven = uneven

    def __repr__(self) -> str:
        dim = f", dim={self._dim!r}" if self._dim is not None else ""
        return f"split(axis={self._axis}{dim}, uneven={self._uneven!r})"

    def split(
        self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Mapping[int, Call]:
        return self.plan(shape, args, kwargs).calls

    def collect(self, results: Mapping[int, Any]) -> Any:
        # Without the plan, only a flat unpadded split knows which results to keep and how many rows.
        if self._dim is not None or self._uneven == "pad":
            raise RuntimeError(
                f"{self!r} collects with the shape and padding of the call it split; "
                "use plan(shape, args, kwargs).collect(results)"
            )
        return self._gather(results, sorted(results), None)

    def plan(self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan:
        if not args:
            raise TypeError(
                f"{self!r} splits the first positional argument, but the call has none "
                f"(keyword arguments: {sorted(kwargs)}); pass the batch positionally"
            )
        batch, rest = args[0], args[1:]
        length = _length(batch, self._axis, "args[0]")
        if self._dim is None:
            shards = shape.size
            of = f"{shards} actors of shape {shape}"
        elif self._dim in shape.dims:
            shards = shape[self._dim]
            of = f"{shards} chunks over dim {self._dim!r} of shape {shape}"
        else:
            raise KeyError(f"{self!r}: unknown dim {self._dim!r} for shape {shape}")
        chunks = self._chunks(batch, length, shards, of)

        calls: dict[int, Call] = {}
        if self._dim is None:
            for position, chunk in enumerate(chunks):
                if chunk is not None:
                    calls[position] = ((chunk, *rest), dict(kwargs))
            collected = [position for position, chunk in enumerate(chunks) if chunk is not None]
        else:
            for position in range(shape.size):
                chunk = chunks[shape.coords(position)[self._dim]]
                if chunk is not None:
                    calls[position] = ((chunk, *rest), dict(kwargs))
            lead = {d: 0 for d in shape.dims}
            collected = [
                shape.rank({**lead, self._dim: k})
                for k, chunk in enumerate(chunks)
                if chunk is not None
            ]
        rows = length if self._uneven == "pad" else None
        return Plan(calls, partial(self._gather, order=collected, rows=rows))

    def _chunks(self, batch: Any, length: int, shards: int, of: str) -> list[Any | None]:
        """Chunk k of the batch, or None where chunk k is empty and its positions are left out."""
        axis = self._axis
        if self._uneven == "error" and (length % shards or length < shards):
            raise ValueError(
                f"{self!r}: args[0] has {length} rows along axis {axis}, "
                f"which cannot be split into equal non-empty chunks across {of}"
            )
        if self._uneven == "pad":
            if length == 0:
                raise ValueError(
                    f"{self!r}: args[0] is empty along axis {axis}; there is no row to pad with"
                )
            size = -(-length // shards)
            last = _slice(batch, axis, length - 1, length)
            filler: Any = None  # a chunk of padding only, shared by every position that gets one
            chunks: list[Any | None] = []
            for k in range(shards):
                start, stop = min(k * size, length), min((k + 1) * size, length)
                if stop - start == size:
                    chunks.append(_slice(batch, axis, start, stop))
                elif start < length:
                    real = _slice(batch, axis, start, stop)
                    chunks.append(
                        _concat([real] + [last] * (size - (stop - start)), axis, "args[0]")
                    )
                else:
                    if filler is None:
                        filler = _concat([last] * size, axis, "args[0]")
                    chunks.append(filler)
            return chunks
        if length == 0:
            return [batch] + [None] * (shards - 1)
        base, extra = divmod(length, shards)
        chunks = []
        start = 0
        for k in range(shards):
            stop = start + base + (1 if k < extra else 0)
            chunks.append(_slice(batch, axis, start, stop) if stop > start else None)
            start = stop
        return chunks

    def _gather(self, results: Mapping[int, Any], order: Sequence[int], rows: int | None) -> Any:
        missing = [position for position in order if position not in results]
        if missing:
            raise ValueError(f"{self!r}: no results for positions {missing}")
        parts = [results[position] for position in order]
        if all(part is None for part in parts):
            return None
        names = [f"position {position}" for position in order]
        combined = _concat(parts, self._axis, "result", names)
        if rows is None:
            return combined
        padded = -(-rows // len(parts)) * len(parts)
        got = _length(combined, self._axis, "result")
        if got != padded:
            raise ValueError(
                f"{self!r}: the results have {got} rows along axis {self._axis} for {padded} padded input rows; "
                "uneven='pad' needs one result row per input row to strip the padding"
            )
        return _slice(combined, self._axis, 0, rows)


# --- batch values: lists, tuples, arrays, tensors, and dicts and dataclasses of them -------------

_SUPPORTED = "a list, tuple, numpy array, torch tensor, jax array, or a dict or dataclass of these"


def _kind(value: Any) -> str | None:
    """The batch kind of a value, without importing torch or jax."""
    if isinstance(value, np.ndarray):
        return "numpy"
    if isinstance(value, list):
        return "list"
    if isinstance(value, tuple):
        return "tuple"
    if isinstance(value, dict):
        return "dict"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "dataclass"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return "torch"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.Array):
        return "jax"
    return None


def _fields(value: Any) -> list[str]:
    """The init fields of a dataclass instance: the ones `dataclasses.replace` can rebuild."""
    return [field.name for field in dataclasses.fields(value) if field.init]


def _normal_axis(value: Any, axis: int, path: str) -> int:
    ndim = len(value.shape)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{path} has shape {tuple(value.shape)}, which has no axis {axis}")
    return axis % ndim


def _length(value: Any, axis: int, path: str) -> int:
    """The number of rows along `axis`, the same for every leaf of a dict or dataclass."""
    lengths: dict[str, int] = {}
    _leaf_lengths(value, axis, path, lengths)
    if not lengths:
        raise TypeError(f"{path} is an empty {type(value).__qualname__}; there is nothing to split")
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{leaf}: {n}" for leaf, n in lengths.items())
        raise ValueError(f"{path} values must have the same length along axis {axis}, got {listed}")
    return next(iter(lengths.values()))


def _leaf_lengths(value: Any, axis: int, path: str, into: dict[str, int]) -> None:
    kind = _kind(value)
    if kind == "dict":
        for key, item in value.items():
            _leaf_lengths(item, axis, f"{path}[{key!r}]", into)
    elif kind == "dataclass":
        for name in _fields(value):
            _leaf_lengths(getattr(value, name), axis, f"{path}.{name}", into)
    elif kind in ("list", "tuple"):
        if axis != 0:
            raise TypeError(f"{path} is a {kind}, which splits only along axis 0, not axis {axis}")
        into[path] = len(value)
    elif kind is not None:
        into[path] = value.shape[_normal_axis(value, axis, path)]
    else:
        raise TypeError(f"{path} is a {type(value).__qualname__}; split() takes {_SUPPORTED}")


def _slice(value: Any, axis: int, start: int, stop: int) -> Any:
    """Rows start:stop along `axis`, of the same type (the value itself when that is all of it)."""
    kind = _kind(value)
    if kind == "dict":
        return {key: _slice(item, axis, start, stop) for key, item in value.items()}
    if kind == "dataclass":
        return dataclasses.replace(
            value,
            **{name: _slice(getattr(value, name), axis, start, stop) for name in _fields(value)},
        )
    if kind in ("list", "tuple"):
        return value if (start, stop) == (0, len(value)) else value[start:stop]
    axis = axis % len(value.shape)
    if (start, stop) == (0, value.shape[axis]):
        return value
    if kind == "torch":
        # A torch view pickles its whole storage, so every actor would receive the full batch.
        return value.narrow(axis, start, stop - start).clone()
    return value[(slice(None),) * axis + (slice(start, stop),)]


def _concat(parts: Sequence[Any], axis: int, path: str, names: Sequence[str] | None = None) -> Any:
    """Join same-typed values along `axis`; `names` label the parts in error messages."""
    labels = list(names) if names is not None else [f"part {i}" for i in range(len(parts))]
    kind = _kind(parts[0])
    if kind is None:
        raise TypeError(
            f"cannot concatenate {path} of {labels[0]}: a {type(parts[0]).__qualname__} is not {_SUPPORTED}"
        )
    for label, part in zip(labels[1:], parts[1:], strict=True):
        if _kind(part) != kind or (kind == "dataclass" and type(part) is not type(parts[0])):
            raise TypeError(
                f"cannot concatenate {path}: {labels[0]} gave a {type(parts[0]).__qualname__}, "
                f"{label} a {type(part).__qualname__}"
            )
    if kind == "dict":
        keys = list(parts[0])
        for label, part in zip(labels[1:], parts[1:], strict=True):
            if set(part) != set(keys):
                raise ValueError(
                    f"cannot concatenate {path}: {labels[0]} has keys {sorted(map(str, keys))}, "
                    f"{label} has {sorted(map(str, part))}"
                )
        return {
            key: _concat([part[key] for part in parts], axis, f"{path}[{key!r}]", labels)
            for key in keys
        }
    if kind == "dataclass":
        return dataclasses.replace(
            parts[0],
            **{
                name: _concat(
                    [getattr(part, name) for part in parts], axis, f"{path}.{name}", labels
                )
                for name in _fields(parts[0])
            },
        )
    if kind in ("list", "tuple"):
        if axis != 0:
            raise TypeError(
                f"cannot concatenate {path}: a {kind} joins only along axis 0, not axis {axis}"
            )
        joined = [row for part in parts for row in part]
        return joined if kind == "list" else tuple(joined)
    for label, part in zip(labels, parts, strict=True):
        _normal_axis(part, axis, f"{path} of {label}")
    if len(parts) == 1:
        return parts[0]
    if kind == "numpy":
        return np.concatenate(parts, axis=axis)
    if kind == "torch":
        return sys.modules["torch"].cat(list(parts), dim=axis)
    return importlib.import_module("jax.numpy").concatenate(list(parts), axis=axis)
