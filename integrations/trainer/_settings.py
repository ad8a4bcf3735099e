"""A trainer's validated settings, shared by the async loop and the synchronous reference loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from ._ledger import Counters

G = TypeVar("G")


@dataclasses.dataclass(frozen=True)
class Settings(Generic[G]):
    start: Callable[[int], Awaitable[G | None]]
    """uid -> the awaitable of `rollout(prompts[uid], uid)`."""
    num_prompts: int
    batch_size: int
    max_staleness: int
    max_concurrency: int | None
    epochs: int
    seed: int
    rollout_timeout_s: float | None
    rollout_retries: int
    on_transition: Callable[[Counters], None] | None


def check_int(name: str, value: object, minimum: int) -> int:
    """`value` if it is an int (not a bool) >= minimum, else a `ValueError` naming it."""
    if type(value) is not int or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an int >= {minimum}")
    return value


def check_optional_int(name: str, value: object, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def check_timeout(name: str, value: object) -> float | None:
    """`None`, or a finite number of seconds > 0."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name}={value!r}: must be None or a finite number of seconds > 0")
    return float(value)


def check_callable(name: str, value: object, *, optional: bool = False) -> None:
    if not (callable(value) or (optional and value is None)):
        kind = "a callable or None" if optional else "a callable"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
