"""Errors raised by mesh calls, and `from_ray`: what each of Ray's errors becomes.

An error of the user's (a method raised) is an `ActorError` that names the actor, carries the
user's exception as `__cause__` and `.cause`, is an instance of its class too (as Ray's own
`RayTaskError` is, so `except ValueError` catches it) and ends with the actor's traceback. An
actor that died is an `ActorDiedError`; one whose `__init__` raised says so, with that traceback.
Ray's own failures (shutting down, a lost object, a system error) are `MeshError`s: never the
actor's error, never a `SystemExit`.
"""

from __future__ import annotations

import concurrent.futures
import re
import weakref
from typing import Any

from ._shape import Point, format_coords

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str) -> str:
    """`text` without terminal colour codes (Ray colours the actor's name in its tracebacks)."""
    return _ANSI.sub("", text)


class MeshError(Exception):
    """Base class of the errors actormesh raises for a call."""


class _ActorFailure(MeshError):
    """A call failed on one actor: `point` (its rank and coordinates) and the method."""

    def __init__(self, point: Point, method: str, what: str) -> None:
        self.point = point
        self.method = method
        # Not super().__init__: in an ActorError that is also of the user's exception class,
        # that class's __init__ (whatever its parameters) must not run.
        Exception.__init__(self, f"{method} on rank {point.rank} "
                                 f"({format_coords(point.coords)}) {what}")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def rank(self) -> int:
        return self.point.rank

    @property
    def coords(self) -> dict[str, int]:
        return self.point.coords


class ActorError(_ActorFailure):
    """The actor's method raised. `cause` is the user's exception, also the `__cause__`; the
    error is an instance of the cause's class too where Python allows it, and its text ends
    with the traceback in the actor (`remote_traceback`)."""

    def __new__(cls, point: Point, method: str, cause: BaseException,
                remote_traceback: str = "") -> ActorError:
        if cls is ActorError:
            cls = _with_class_of(type(cause))
        error: ActorError = Exception.__new__(cls)
        return error

    def __init__(self, point: Point, method: str, cause: BaseException,
                 remote_traceback: str = "") -> None:
        self.cause = cause
        self.remote_traceback = remote_traceback
        what = f"raised {type(cause).__name__}: {cause}"
        if remote_traceback:
            what += f"\n\nTraceback in the actor:\n{remote_traceback}"
        super().__init__(point, method, what)
        self.__cause__ = cause

    def __getattr__(self, name: str) -> Any:
        # What the user's exception class would have set in its own __init__ (`err.errno`,
        # `err.code`, ...): read from the cause.
        if name.startswith("__") or name in ("cause", "point", "method", "remote_traceback"):
            raise AttributeError(name)
        return getattr(self.cause, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return ActorError, (self.point, self.method, self.cause, self.remote_traceback)


def _with_class_of(cause_cls: type[BaseException]) -> type[ActorError]:
    """`ActorError` that is also a `cause_cls`, as Ray's `RayTaskError(cause_cls)`; plain
    `ActorError` where Python cannot make one (a builtin layout such as OSError's)."""
    made = _classes.get(cause_cls)
    if made is not None:
        return made
    made = ActorError
    if not issubclass(ActorError, cause_cls) and issubclass(cause_cls, Exception):
        try:
            made = type(f"ActorError({cause_cls.__name__})", (ActorError, cause_cls),
                        {"__module__": __name__, "__qualname__": "ActorError"})
        except TypeError:  # an instance lay-out conflict, or a class that cannot be subclassed
            pass
    _classes[cause_cls] = made
    return made


# The ActorError class made for each exception class met (as Ray keeps one per class).
_classes: weakref.WeakKeyDictionary[type[BaseException], type[ActorError]] = \
    weakref.WeakKeyDictionary()


class ActorDiedError(_ActorFailure):
    """The actor died (or was unreachable) before it answered the call; if its `__init__`
    raised, `init_failed` is True and the text has the `__init__` traceback."""

    def __init__(self, point: Point, method: str, detail: str, *,
                 init_failed: bool = False) -> None:
        self.detail = detail
        self.init_failed = init_failed
        what = f"could not run: the actor's __init__ raised\n{detail}" if init_failed \
            else f"actor died: {detail}"
        super().__init__(point, method, what)

    def __reduce__(self) -> tuple[Any, ...]:
        return _died, (self.point, self.method, self.detail, self.init_failed)


def _died(point: Point, method: str, detail: str, init_failed: bool) -> ActorDiedError:
    return ActorDiedError(point, method, detail, init_failed=init_failed)


class NoLiveActorsError(MeshError):
    """`choose` has no live actor left in the (sub-)mesh to route to."""


class MeshTimeoutError(MeshError, TimeoutError):
    """A call set with `options(timeout=...)` did not finish in time."""


_INIT_PREFIX = "The actor died because of an error raised in its creation task, "


def from_ray(point: Point, method: str, error: BaseException) -> BaseException:
    """The error a call to the actor at `point` ended with, as actormesh raises it. Raised
    inside the `except` that caught Ray's error, it shows its own cause only (the user's
    exception), never Ray's error as the context."""
    mapped = _from_ray(point, method, error)
    mapped.__suppress_context__ = True
    return mapped


def _from_ray(point: Point, method: str, error: BaseException) -> BaseException:
    from ray.exceptions import (
        RayActorError,
        RayError,
        RayTaskError,
        TaskCancelledError,
        UnserializableException,
    )

    if isinstance(error, RayActorError):
        text = plain(str(getattr(error, "error_msg", "") or error)).strip()
        if getattr(error, "actor_init_failed", False):
            return ActorDiedError(point, method, text.removeprefix(_INIT_PREFIX),
                                  init_failed=True)
        return ActorDiedError(point, method, text.splitlines()[0] if text else "unreachable")
    if isinstance(error, TaskCancelledError):
        return concurrent.futures.CancelledError(f"{method} on rank {point.rank} was cancelled")
    if isinstance(error, RayTaskError):
        cause = error.cause if isinstance(error.cause, BaseException) else error
        return ActorError(point, method, cause, plain(str(error)).strip("\n"))
    if isinstance(error, UnserializableException):  # the method raised what cannot be unpickled
        return ActorError(point, method, error, plain(str(error)).strip("\n"))
    if isinstance(error, (RayError, SystemExit)):
        return ray_failure(f"{method} on rank {point.rank} ({format_coords(point.coords)})",
                           error)
    return ActorError(point, method, error)


def ray_failure(what: str, error: BaseException) -> MeshError:
    """A failure of Ray itself while `what` ran or was read (Ray shutting down, an object lost,
    a system error), as a `MeshError` naming both; the `SystemExit` Ray raises in a thread
    waiting for a value while it shuts down included."""
    if isinstance(error, SystemExit):
        reason = "Ray shut down while it waited (ray.shutdown(), or the cluster went away)"
    else:
        reason = f"Ray failed: {type(error).__name__}: {plain(str(error)).strip()}"
    mapped = MeshError(f"{what}: {reason}")
    mapped.__cause__ = error
    return mapped
