"""Shape math: named dims, row-major ranks and coordinates, and sub-mesh selection.

Nothing here knows about actors; the same selection serves a mesh of actors and a mesh of values
(`Selectable`, as Monarch's `MeshTrait`: one selection over one primitive each mesh implements).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

ShapeLike = int | Sequence[int] | Mapping[str, int]
IndexKey = int | slice | tuple[int | slice, ...]


class Shape(Mapping[str, int]):
    """An ordered, immutable mapping of dim name to size. Ranks are row-major over the dims."""

    __slots__ = ("_dims", "_sizes", "_strides")

    def __init__(self, dims: Mapping[str, int]) -> None:
        self._dims = tuple(dims)
        self._sizes = tuple(dims.values())
        strides, stride = [], 1
        for size in reversed(self._sizes):
            strides.append(stride)
            stride *= size
        self._strides = tuple(reversed(strides))

    @staticmethod
    def of(shape: ShapeLike) -> Shape:
        """Normalise an int, a tuple of ints or a mapping into a Shape, rejecting bad sizes."""
        if isinstance(shape, Shape):
            return shape
        if isinstance(shape, Mapping):
            dims = dict(shape)
            if not all(isinstance(d, str) and d for d in dims):
                raise ValueError(f"shape {shape!r}: dim names must be non-empty strings")
        elif isinstance(shape, bool):
            raise ValueError(f"shape {shape!r}: must be an int, a tuple of ints or a mapping")
        elif isinstance(shape, int):
            dims = {"rank": shape}
        elif isinstance(shape, (tuple, list)):
            dims = {f"d{i}": s for i, s in enumerate(shape)}
        else:
            raise ValueError(f"shape {shape!r}: must be an int, a tuple of ints or a mapping")
        if not dims:
            raise ValueError(f"shape {shape!r}: needs at least one dim")
        for size in dims.values():
            if isinstance(size, bool) or not isinstance(size, int):
                raise ValueError(f"shape {shape!r}: sizes must be ints, got {size!r}")
            if size <= 0:
                raise ValueError(f"shape {shape!r}: sizes must be > 0")
        return Shape(dims)

    @property
    def dims(self) -> tuple[str, ...]:
        return self._dims

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def size(self) -> int:
        """The number of points: the product of the sizes."""
        return math.prod(self._sizes)

    def coords(self, rank: int) -> dict[str, int]:
        """Row-major coordinates of a rank."""
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} out of range for shape {self}")
        return {d: (rank // st) % sz for d, st, sz in zip(self._dims, self._strides, self._sizes)}

    def rank(self, coords: Mapping[str, int]) -> int:
        """The rank of full coordinates."""
        if set(coords) != set(self._dims):
            raise KeyError(f"coordinates {dict(coords)} do not name exactly the dims of {self}")
        total = 0
        for d, st, sz in zip(self._dims, self._strides, self._sizes):
            i = coords[d]
            if not 0 <= i < sz:
                raise IndexError(f"index {d}={i} out of range for shape {self}")
            total += i * st
        return total

    def select(self, key: IndexKey) -> Selection:
        """Positional indexing (`mesh[1, :]`): an int drops its dim, a slice keeps it."""
        items = key if isinstance(key, tuple) else (key,)
        if len(items) > len(self._dims):
            raise IndexError(f"index {key!r} has {len(items)} entries; shape {self} has {len(self._dims)} dims")
        return self._select(dict(zip(self._dims, items)), key)

    def select_dims(self, **dims: int | slice) -> Selection:
        """Named indexing (`mesh.slice(dp=1)`)."""
        for name in dims:
            if name not in self._dims:
                raise KeyError(f"unknown dim {name!r} for shape {self}")
        return self._select(dims, dims)

    def _select(self, by_dim: Mapping[str, int | slice], key: object) -> Selection:
        kept: dict[str, int] = {}
        axes: list[list[int]] = []
        for d, size in zip(self._dims, self._sizes):
            item = by_dim.get(d, slice(None))
            if isinstance(item, slice):
                picked = list(range(size))[item]
                if not picked:
                    raise IndexError(f"index {key!r} selects no {d} of shape {self}")
                kept[d] = len(picked)
                axes.append(picked)
            elif isinstance(item, int) and not isinstance(item, bool):
                if not -size <= item < size:
                    raise IndexError(f"index {d}={item} out of range for shape {self}")
                axes.append([item % size])
            else:
                raise TypeError(f"index {key!r}: {d} must be an int or a slice, got {item!r}")
        positions = [0]
        for picked, st in zip(axes, self._strides):
            positions = [p + i * st for p in positions for i in picked]
        return Selection(Shape(kept), tuple(positions))

    def __getitem__(self, dim: str) -> int:
        try:
            return self._sizes[self._dims.index(dim)]
        except ValueError:
            raise KeyError(f"unknown dim {dim!r} for shape {self}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._dims)

    def __len__(self) -> int:
        return len(self._dims)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Shape):
            return self._dims == other._dims and self._sizes == other._sizes
        return isinstance(other, Mapping) and list(self.items()) == list(other.items())

    def __hash__(self) -> int:
        return hash((self._dims, self._sizes))

    def __repr__(self) -> str:
        return f"Shape({dict(self)})"

    def __str__(self) -> str:
        return "{" + ", ".join(f"{d}={s}" for d, s in self.items()) + "}"

    def env(self) -> str:
        """`dp=2,tp=2`, the form of ACTORMESH_SHAPE."""
        return ",".join(f"{d}={s}" for d, s in self.items())


class Selection:
    """A sub-shape and, for each of its points in row-major order, the position in the parent."""

    __slots__ = ("shape", "positions")

    def __init__(self, shape: Shape, positions: tuple[int, ...]) -> None:
        self.shape = shape
        self.positions = positions


S = TypeVar("S", bound="Selectable")


class Selectable(abc.ABC):
    """Selection shared by meshes of actors and meshes of values: `m[1]`, `m[:, 0]`, `m[0:2]`,
    `m.slice(dp=1)`. An int index drops its dim, a slice keeps it; out-of-range indices and
    unknown dims raise `IndexError` / `KeyError` naming the shape. A subclass gives its shape and
    how to make itself over a selection of its points (`_selected`)."""

    __slots__ = ()

    @property
    @abc.abstractmethod
    def shape(self) -> Shape: ...

    @abc.abstractmethod
    def _selected(self: S, selection: Selection) -> S: ...

    def _select(self: S, key: IndexKey) -> S:
        return self._selected(self.shape.select(key))

    def slice(self: S, **dims: int | slice) -> S:
        """`m.slice(dp=1)`, `m.slice(tp=slice(0, 1))`: selected by dim name."""
        return self._selected(self.shape.select_dims(**dims))


class Point:
    """One point of a mesh: its rank and coordinates within a shape."""

    __slots__ = ("rank", "shape")

    def __init__(self, rank: int, shape: Shape) -> None:
        self.rank = rank
        self.shape = shape

    @property
    def coords(self) -> dict[str, int]:
        return self.shape.coords(self.rank)

    @property
    def world_size(self) -> int:
        return self.shape.size

    def __getitem__(self, dim: str) -> int:
        return self.coords[dim]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.rank, self.shape) == (other.rank, other.shape)

    def __hash__(self) -> int:
        return hash((self.rank, self.shape))

    def __repr__(self) -> str:
        return f"Point(rank={self.rank}, {format_coords(self.coords)})"


def format_coords(coords: Mapping[str, int]) -> str:
    """`dp=1,tp=0`, the form of ACTORMESH_COORDS and of error messages."""
    return ",".join(f"{d}={i}" for d, i in coords.items())


def parse_coords(text: str) -> dict[str, int]:
    """Inverse of format_coords (and of Shape.env)."""
    if not text:
        return {}
    pairs = (item.split("=", 1) for item in text.split(","))
    return {name: int(value) for name, value in pairs}
