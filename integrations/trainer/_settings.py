"""A trainer's validated settings, shared by the async loop and the synchronous reference loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .._checks import check_int, check_optional_int, check_timeout
from ._ledger import Counters

__all__ = ["Settings", "check_callable", "check_int", "check_optional_int", "check_timeout"]

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


def check_callable(name: str, value: object, *, optional: bool = False) -> None:
    if not (callable(value) or (optional and value is None)):
        kind = "a callable or None" if optional else "a callable"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
