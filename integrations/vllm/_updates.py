"""How a weight update went, engine by engine: what the pool reports and raises.

An update is all or nothing. Each engine's load ends one way (`Outcome`); unless every live
engine loaded, the update is undone: the engines that loaded, or tried to, load the weights
every engine served before, and an engine that cannot (its load timed out and may still land,
or its rollback failed) is restarted, to come back with those weights. No token carries the
version number the update was given, and the pool never hands that number out again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import actormesh as am

Outcome = Literal["loaded", "failed", "timed out", "dead"]
"""How one engine's load ended: it loaded; it raised; it did not finish within the timeout (and
may yet); it died or was restarting (a restarted engine gets the pool's weights anyway)."""

Restored = Literal["", "rolled back", "restarted", "removed"]
"""How an engine was brought back to the weights every engine serves after an update failed:
it loaded them again, it was restarted (and is restored as it comes back), or, for a mesh without
restarts, it was stopped for good. Empty: nothing to undo."""


@dataclasses.dataclass(frozen=True)
class EngineUpdate:
    """One engine's part in a weight update."""

    rank: int
    outcome: Outcome
    error: str = ""  # what went wrong, for "failed" and "timed out"
    restored: Restored = ""


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """A weight update's report (`pool.stats()["weight_update"]` holds the last one): the
    version it was given, whether every live engine loaded it, and each engine's part."""

    version: int
    committed: bool
    engines: tuple[EngineUpdate, ...]
    error: str = ""  # what failed beside the engines (the sender, the pool's copy)
    pause_s: float = 0.0  # from the pause ("keep") until every engine was quiet
    load_s: float = 0.0  # from then until every engine had loaded (and the copy was kept)

    def __str__(self) -> str:
        parts = []
        for e in self.engines:
            text = f"engine {e.rank} {e.outcome}" + (f" ({e.error})" if e.error else "")
            parts.append(text + (f", {e.restored}" if e.restored else ""))
        if self.error:
            parts.append(self.error)
        return f"weights version {self.version}: " + "; ".join(parts)


class WeightUpdateError(am.MeshError):
    """A weight update that not every live engine loaded: it was undone (every engine serves the
    weights it served before, with their version), and no token carries its version. `report`
    says what happened on each engine."""

    def __init__(self, report: WeightUpdate, serving: int) -> None:
        self.report = report
        self.version = report.version
        self.serving = serving
        super().__init__(f"{report}. The update was undone: every engine serves weights "
                         f"version {serving} again, and no token carries version "
                         f"{report.version}")

    def __reduce__(self) -> tuple[type[WeightUpdateError], tuple[WeightUpdate, int]]:
        return type(self), (self.report, self.serving)  # crosses to a sender's process


def outcome(rank: int, value: Any) -> EngineUpdate:
    """One engine's outcome from what its `load_weights` call gave (a value or an error)."""
    if isinstance(value, (am.ActorDiedError, am.NoLiveActorsError)):
        return EngineUpdate(rank, "dead", _describe(value))
    if isinstance(value, am.MeshTimeoutError):
        return EngineUpdate(rank, "timed out", str(value))
    if isinstance(value, BaseException):
        return EngineUpdate(rank, "failed", _describe(value))
    return EngineUpdate(rank, "loaded")


def landed(engines: Sequence[EngineUpdate]) -> bool:
    """Whether the update landed on every live engine (dead ones get it as they restart)."""
    return all(e.outcome in ("loaded", "dead") for e in engines)


def _describe(error: BaseException) -> str:
    cause = error.cause if isinstance(error, am.ActorError) else error
    return f"{type(cause).__name__}: {cause}"
