"""`@am.method` and `MeshMethod`: how `mesh.methods.f` gets the parameters and result of `f`.

`@am.method` turns a method into a `MethodDef` descriptor. A type checker reads
`mesh.methods.f` as instance access on the actor class, so `MethodDef.__get__` gives it a
`MeshMethod[P, R]` bound by `ParamSpec` to `f`'s own parameters and result. At run time the
descriptor hands an actor its plain bound method (so `self.f(1)` inside the actor is an ordinary
call), while `mesh.methods` builds the real `MeshMethod` over the mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable, Coroutine, Hashable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, TypeVar, overload

from typing_extensions import ParamSpec, Self

from .dispatch import Dispatch

if TYPE_CHECKING:
    from ._future import MeshFuture, ValueMesh
    from ._mesh import ActorMesh

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """Per-call settings, set with `MeshMethod.options(...)`."""

    affinity: Hashable | None = None
    timeout: float | None = None
    dispatch: Dispatch | None = None
    return_exceptions: bool = False
    retries: int = 0

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r}: must be > 0 seconds")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be an int >= 0")
        if self.dispatch is not None and not isinstance(self.dispatch, Dispatch):
            raise TypeError(f"dispatch={self.dispatch!r}: must be an am.Dispatch")
        if self.affinity is not None:
            hash(self.affinity)  # an unhashable key fails here, not inside the router


class MeshMethod(Generic[P, R_co]):
    """One method of the mesh's actor class, bound to a mesh: the verbs `all`, `choose`, `shard`."""

    __slots__ = ("_mesh", "_name", "_options")

    def __init__(self, mesh: ActorMesh[Any], name: str, options: CallOptions) -> None:
        self._mesh = mesh
        self._name = name
        self._options = options

    @property
    def name(self) -> str:
        return self._name

    def all(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[ValueMesh[R_co]]:
        """Call every actor of the mesh with the same arguments."""
        return self._mesh._call_all(self._name, args, kwargs, self._options)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[R_co]:
        """Call one actor, picked by the mesh's balancer."""
        return self._mesh._call_choose(self._name, args, kwargs, self._options)

    def shard(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[R_co]:
        """Split the arguments across the actors with the method's dispatch; collect the results."""
        return self._mesh._call_shard(self._name, args, kwargs, self._options)

    def options(
        self,
        *,
        affinity: Hashable | None = _UNSET,
        timeout: float | None = _UNSET,
        dispatch: Dispatch | None = _UNSET,
        return_exceptions: bool = _UNSET,
        retries: int = _UNSET,
    ) -> Self:
        """A copy of this method with some per-call settings changed."""
        given: dict[str, Any] = {
            "affinity": affinity,
            "timeout": timeout,
            "dispatch": dispatch,
            "return_exceptions": return_exceptions,
            "retries": retries,
        }
        changes = {k: v for k, v in given.items() if v is not _UNSET}
        return type(self)(self._mesh, self._name, dataclasses.replace(self._options, **changes))

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Direct calls are for the actor itself; from outside, pick a verb."""
        raise TypeError(
            f"mesh.methods.{self._name}(...) cannot be called directly; use "
            f".all(...), .choose(...) or .shard(...)"
        )

    def __repr__(self) -> str:
        return f"MeshMethod({self._name})"


class AsyncMeshMethod(MeshMethod[P, R_co]):
    """The `MeshMethod` of an `async def` method: inside the actor, a direct call is awaitable."""

    __slots__ = ()

    def __call__(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R_co]:
        return super().__call__(*args, **kwargs)  # type: ignore[return-value]


class MethodDef(Generic[P, R]):
    """What `@am.method` leaves on the class: the function and its default dispatch."""

    def __init__(self, fn: Callable[..., Any], dispatch: Dispatch | None) -> None:
        if not callable(fn):
            raise TypeError(f"@am.method needs a function, got {fn!r}")
        if dispatch is not None and not isinstance(dispatch, Dispatch):
            raise TypeError(f"@am.method(dispatch={dispatch!r}): must be an am.Dispatch")
        self.fn = fn
        self.dispatch = dispatch
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> MeshMethod[P, R]: ...
    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self.fn, instance)

    def __call__(self, instance: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """`Worker.f(worker, x)`, the unbound form, still calls the function."""
        result: R = self.fn(instance, *args, **kwargs)
        return result


class AsyncMethodDef(MethodDef[P, R]):
    """`MethodDef` of an `async def` method."""

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(
        self, instance: object, owner: type[Any] | None = None
    ) -> AsyncMeshMethod[P, R]: ...
    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any:
        return super().__get__(instance, owner)


class _Decorator:
    """`@am.method(dispatch=...)`: the decorator once its arguments are given."""

    def __init__(self, dispatch: Dispatch | None) -> None:
        self._dispatch = dispatch

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
    ) -> AsyncMethodDef[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R], /) -> MethodDef[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> MethodDef[Any, Any]:
        cls = AsyncMethodDef if inspect.iscoroutinefunction(fn) else MethodDef
        return cls(fn, self._dispatch)


@overload
def method(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
) -> AsyncMethodDef[P, R]: ...
@overload
def method(fn: Callable[Concatenate[Any, P], R], /) -> MethodDef[P, R]: ...
@overload
def method(*, dispatch: Dispatch | None = None) -> _Decorator: ...
def method(
    fn: Callable[..., Any] | None = None, /, *, dispatch: Dispatch | None = None
) -> MethodDef[Any, Any] | _Decorator:
    """Mark an actor method as callable through a mesh, optionally with a default dispatch.

    Works bare (`@am.method`) and with arguments (`@am.method(dispatch=am.dispatch.split())`),
    on `def` and `async def` methods.
    """
    decorator = _Decorator(dispatch)
    return decorator if fn is None else decorator(fn)
