"""Errors raised by mesh calls. Each names the actor it came from: rank and coordinates."""

from __future__ import annotations

import concurrent.futures

from ._shape import Point, format_coords


class MeshError(Exception):
    """Base class of the errors actormesh raises for a call."""


class _ActorFailure(MeshError):
    """A call failed on one actor: `point` (its rank and coordinates) and the method."""

    def __init__(self, point: Point, method: str, what: str) -> None:
        self.point = point
        self.method = method
        super().__init__(f"{method} on rank {point.rank} ({format_coords(point.coords)}) {what}")

    @property
    def rank(self) -> int:
        return self.point.rank

    @property
    def coords(self) -> dict[str, int]:
        return self.point.coords


class ActorError(_ActorFailure):
    """The actor's method raised. `cause` is the original exception, also the `__cause__`."""

    def __init__(self, point: Point, method: str, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(point, method, f"raised {type(cause).__name__}: {cause}")


class ActorDiedError(_ActorFailure):
    """The actor died (or was unreachable) before it answered the call."""

    def __init__(self, point: Point, method: str, detail: str) -> None:
        super().__init__(point, method, f"actor died: {detail}")


class NoLiveActorsError(MeshError):
    """`choose` has no live actor left in the (sub-)mesh to route to."""


class MeshTimeoutError(MeshError, TimeoutError):
    """A call set with `options(timeout=...)` did not finish in time."""


def from_ray(point: Point, method: str, error: BaseException) -> BaseException:
    """The error a call to the actor at `point` ended with, as actormesh raises it."""
    from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError

    if isinstance(error, RayActorError):
        text = str(error).strip()
        return ActorDiedError(point, method, text.splitlines()[0] if text else "unreachable")
    if isinstance(error, TaskCancelledError):
        return concurrent.futures.CancelledError(f"{method} on rank {point.rank} was cancelled")
    cause = error.cause if isinstance(error, RayTaskError) and error.cause else error
    mapped = ActorError(point, method, cause)
    mapped.__cause__ = cause
    return mapped
