"""`@am.method` and `MeshMethod`: the verbs, and how `mesh.methods.f` gets `f`'s types.

`@am.method` turns a method into a `MethodDef` descriptor. A type checker reads
`mesh.methods.f` as instance access on the actor class, so `MethodDef.__get__` gives it a
`MeshMethod[P, R]` bound by `ParamSpec` to `f`'s own parameters and result. At run time the
descriptor hands an actor its plain bound method (so `self.f(1)` inside the actor is an ordinary
call), while `mesh.methods` builds the real `MeshMethod` over the mesh.

The verbs (`all`, `choose`, `shard`) are written here, once, over a narrow `Target`: what a mesh
or view gives them (its shape, the actor behind each position, its scheduler group, the router).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import weakref
from collections.abc import Callable, Coroutine, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Protocol, TypeVar, cast, overload

import ray
from typing_extensions import ParamSpec, Self

from . import _hedge, _loop, _ray, _share
from ._calls import Call, Result, Router
from ._future import MeshFuture, ValueMesh
from ._map import MeshMap
from ._shape import Point, Shape
from .dispatch import Dispatch

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """Per-call settings, set with `MeshMethod.options(...)`."""

    affinity: Hashable | None = None
    timeout: float | None = None
    dispatch: Dispatch | None = None
    return_exceptions: bool = False
    retries: int = 0
    hedge: bool | float | None = None  # `choose` and `map`: see `MeshMethod.options`

    def __post_init__(self) -> None:
        check_timeout("timeout", self.timeout)
        _hedge.check(self.hedge)
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be an int >= 0")
        if self.dispatch is not None and not isinstance(self.dispatch, Dispatch):
            raise TypeError(f"dispatch={self.dispatch!r}: must be an am.Dispatch")
        if self.affinity is not None:
            hash(self.affinity)  # an unhashable key fails here, not inside the router


def check_timeout(what: str, value: float | None) -> None:
    """A timeout is None or a finite number of seconds > 0."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what}={value!r}: must be a finite number of seconds > 0, or None")


class Target:
    """What the verbs need of the mesh or view they call, and nothing else."""

    __slots__ = ("shape", "actors", "router", "label", "class_name", "_owner", "_positions",
                 "_group", "__weakref__")

    def __init__(self, shape: Shape, actors: tuple[int, ...], router: Router, label: str,
                 class_name: str, owner: object = None) -> None:
        # The mesh's shared state: a method or a call in flight keeps the mesh alive, as a Ray
        # actor method keeps its actor.
        self._owner = owner
        self.shape = shape
        self.actors = actors  # the mesh's actor index at each position of this view
        self.router = router
        self.label = label
        self.class_name = class_name
        self._positions: dict[int, int] | None = None
        self._group = -1

    @property
    def group(self) -> int:
        """This view's group in the scheduler, registered when `choose` first needs it and
        freed when the view (and every call made through it) is gone."""
        if self._group < 0:
            scheduler = self.router.scheduler
            self._group = scheduler.add_group(list(self.actors))
            if self._group != 0:
                weakref.finalize(self, _loop.post, scheduler.remove_group, self._group)
        return self._group

    def position(self, actor: int) -> int:
        """The rank in this view of the mesh's actor `actor`."""
        if self._positions is None:
            self._positions = {a: p for p, a in enumerate(self.actors)}
        return self._positions[actor]

    def point_of(self, actor: int) -> Point:
        return Point(self.position(actor), self.shape)


class _Unary(Protocol[A_contra, R]):
    """A `MeshMethod` whose method takes one argument: what `map` calls per item."""

    def choose(self, item: A_contra, /) -> MeshFuture[R]: ...


class MeshMethod(Generic[P, R_co]):
    """One method of the mesh's actor class, bound to a mesh: the verbs `all`, `choose`, `shard`."""

    __slots__ = ("_target", "_name", "_options", "_choose_label", "_alone", "_method_id",
                 "_rides", "_hedge", "_arguments", "_group")

    def __init__(self, target: Target, name: str, options: CallOptions, *,
                 alone: bool = False, arguments: Arguments | None = None) -> None:
        self._arguments = arguments  # the method's parameters, when the mesh knows its class
        self._target = target
        self._name = name
        self._options = options
        self._choose_label = f"{target.label}.{name}.choose"
        self._alone = alone  # `@am.method(coalesce=False)`: its calls never ride a batch
        router = target.router
        self._method_id = router.method_id(name, alone)
        self._rides = router.coalesces and not alone
        self._hedge = _hedge.check(options.hedge)
        self._group = -1  # the view's group in the scheduler, once `choose` has needed it

    @property
    def name(self) -> str:
        return self._name

    def all(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[ValueMesh[R_co]]:
        """Call every actor of the mesh with the same arguments."""
        self._refuse_hedge("all")
        if self._arguments is not None:
            self._arguments.check(args, kwargs)
        shape = self._target.shape
        every = {position: (args, kwargs) for position in range(shape.size)}
        return self._send_each("all", every, lambda values: ValueMesh(shape, values),
                               self._options.return_exceptions)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[R_co]:
        """Call one actor, picked by the mesh's balancer."""
        target, options = self._target, self._options
        if self._arguments is not None:
            self._arguments.check(args, kwargs)
        router = target.router
        if router.closed:
            router.check_open(self._name)
        if self._group < 0:
            self._group = target.group
        call = Call(router, self._name, args, kwargs, target=target, group=self._group,
                    key=options.affinity, retries=options.retries, method_id=self._method_id,
                    alone=not self._rides or _has_ref(args, kwargs), hedge=self._hedge)
        future: MeshFuture[R_co] = MeshFuture.of_call(
            call, self._choose_label, return_exceptions=options.return_exceptions)
        router.route(call)
        if options.timeout is not None:
            _expire(router, options.timeout, (call,), self._choose_label, call.future)
        return future

    def map(
        self: _Unary[A, R], items: Iterable[A], *, ordered: bool = True,
        window: int | None = None,
    ) -> MeshMap[R]:
        """Call the method once per item, each through `choose`, and yield the results: in the
        order of `items` (`ordered=False`: as they complete), with at most `window` calls
        outstanding, so a lazy or endless iterable streams in constant memory. The default
        window keeps every slot busy with calls waiting for each slot that frees: with
        coalescing, as many as the batches of its method's calls hold (they follow its measured
        service time), else a call or two per slot. A failed call raises at its item's position,
        or is yielded with `options(return_exceptions=True)`. What it returns is an iterator:
        `next()`, `for` or `async for`; leaving it early cancels the calls not yet sent.
        """
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered={ordered!r}: must be a bool")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 1):
            raise ValueError(f"window={window!r}: must be an int >= 1, or None")
        assert isinstance(self, MeshMethod)
        if window is None:
            router, method_id, actors = self._target.router, self._method_id, len(self._target.actors)
            return MeshMap(self.choose, iter(items), ordered,
                           lambda: router.default_window(method_id, actors))
        fixed = window
        return MeshMap(self.choose, iter(items), ordered, lambda: fixed)

    def shard(self, *args: P.args, **kwargs: P.kwargs) -> MeshFuture[R_co]:
        """Split the arguments across the actors with the method's dispatch; collect the results."""
        self._refuse_hedge("shard")
        dispatch = self._options.dispatch
        if dispatch is None:
            raise TypeError(
                f"{self._target.class_name}.{self._name} has no dispatch for shard: decorate it "
                f"with @am.method(dispatch=am.dispatch.split()) or call "
                f"mesh.methods.{self._name}.options(dispatch=...).shard(...)"
            )
        self._target.router.check_open(self._name)
        plan = dispatch.plan(self._target.shape, args, kwargs)  # checked before anything is sent
        positions = sorted(plan.calls)
        return self._send_each("shard", plan.calls,
                               lambda values: plan.collect(dict(zip(positions, values))), False)

    def _send_each(self, verb: str, plan: _share.Plan, combine: Callable[[list[Any]], Any],
                   return_exceptions: bool) -> MeshFuture[Any]:
        """Send each position of the plan its arguments (shared objects put once); one future
        combines the results in position order."""
        target = self._target
        router = target.router
        router.check_open(self._name)
        shared = _share.share_plan(plan)
        positions = sorted(plan)
        calls = [Call(router, self._name, *shared[p], point=Point(p, target.shape),
                      method_id=self._method_id,
                      alone=not self._rides or _has_ref(*shared[p])) for p in positions]
        label = f"{target.label}.{self._name}.{verb}"
        future: MeshFuture[Any] = MeshFuture.of_calls(
            calls, combine, label, router, return_exceptions=return_exceptions)
        for position, call in zip(positions, calls):
            router.send(target.actors[position], call)
        if self._options.timeout is not None:
            _expire(router, self._options.timeout, calls, label, future._future)
        return future

    def _refuse_hedge(self, verb: str) -> None:
        if self._hedge is not None:
            raise ValueError(
                f"{self._target.label}.{self._name}.{verb}: hedge={self._options.hedge!r} is for "
                "choose and map (a call to one actor, which another actor can run instead); "
                f"{verb} calls given actors. Leave hedge= out for {verb}."
            )

    def options(
        self,
        *,
        affinity: Hashable | None = _UNSET,
        timeout: float | None = _UNSET,
        dispatch: Dispatch | None = _UNSET,
        return_exceptions: bool = _UNSET,
        retries: int = _UNSET,
        hedge: bool | float | None = _UNSET,
    ) -> Self:
        """A copy of this method with some per-call settings changed.

        `hedge=True` (`choose` and `map`, for calls safe to run twice): a call that has not
        ended after a high percentile (95th) of the method's recent service times on this mesh
        (or after `hedge=` seconds) is sent once more, to another actor with a free slot; the
        first copy to end gives the result and the other is cancelled where Ray can. At most
        one extra copy per call, and at most about one call in twenty is hedged
        (`_hedge.BUDGET`, with a burst of `_hedge.BURST`).
        """
        given: dict[str, Any] = {
            "affinity": affinity,
            "timeout": timeout,
            "dispatch": dispatch,
            "return_exceptions": return_exceptions,
            "retries": retries,
            "hedge": hedge,
        }
        changes = {k: v for k, v in given.items() if v is not _UNSET}
        return type(self)(self._target, self._name, dataclasses.replace(self._options, **changes),
                          alone=self._alone, arguments=self._arguments)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        """Direct calls are for the actor itself; from outside, pick a verb."""
        raise TypeError(
            f"mesh.methods.{self._name}(...) cannot be called directly; use "
            f".all(...), .choose(...) or .shard(...)"
        )

    def __repr__(self) -> str:
        return f"MeshMethod({self._name})"


def _expire(router: Router, timeout_s: float, calls: Sequence[Call], label: str,
            result: Result[Any]) -> None:
    """Fail the calls still running after `timeout_s`; the timer goes once `result` settles,
    so it keeps nothing alive past the call."""
    deadline = time.monotonic() + timeout_s
    for call in calls:
        call.deadline = deadline
    timer = router.expire_after(timeout_s, calls, label)
    result.add_done_callback(lambda _: timer.cancel())


def _has_ref(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call passes an ObjectRef as an argument. Ray resolves those before a lone call
    runs; inside a batch it would not (and the batch would wait for it): such a call goes alone."""
    for arg in args:
        if isinstance(arg, ray.ObjectRef):
            return True
    return bool(kwargs) and any(isinstance(v, ray.ObjectRef) for v in kwargs.values())


class Arguments:
    """The parameters of an actor method: a call whose arguments do not fit is refused before
    it is sent, naming the method and the argument (`choose(y=1)` names `y`)."""

    __slots__ = ("_label", "_signature", "_names", "_most", "_least")

    def __init__(self, label: str, parameters: Sequence[inspect.Parameter]) -> None:
        # Without annotations, and without the tracing context Ray adds to actor methods.
        params = [p.replace(annotation=p.empty) for p in parameters if p.name != "_ray_trace_ctx"]
        self._label = label
        self._signature = inspect.Signature(params)
        simple = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
        # The common call (positional arguments only, as many as fit) is checked by counting.
        self._most = len(params) if simple else -1
        self._least = sum(p.default is p.empty for p in params) if simple else 0
        self._names = None if any(p.kind is p.VAR_KEYWORD for p in params) else \
            {p.name for p in params if p.kind is not p.POSITIONAL_ONLY}

    @staticmethod
    def of(owner: type[Any], name: str) -> Arguments | None:
        """The parameters of `owner.name`, if Python can tell them (a plain method)."""
        attr = inspect.getattr_static(owner, name, None)
        if isinstance(attr, (staticmethod, classmethod)) or not callable(attr):
            return None
        try:
            parameters = list(inspect.signature(attr).parameters.values())[1:]  # not `self`
        except (TypeError, ValueError):  # a builtin or C method: Ray checks its calls
            return None
        return Arguments(f"{owner.__name__}.{name}", parameters)

    @staticmethod
    def of_handle(class_name: str, handle: Any, name: str) -> Arguments | None:
        """The parameters of method `name` of the actor behind `handle`, as Ray recorded them
        when the actor's class was made (an actor made elsewhere: Ray checks a call of its own
        against them, a call that waited and rides a task with others is checked here)."""
        parameters = _ray.method_parameters(handle, name)
        return None if parameters is None else Arguments(f"{class_name}.{name}", parameters)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not kwargs and self._least <= len(args) <= self._most:
            return
        unknown = [k for k in kwargs if self._names is not None and k not in self._names]
        if unknown:
            raise TypeError(f"{self._label}{self._signature} got an unexpected keyword "
                            f"argument {unknown[0]!r}")
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{self._label}{self._signature}: {err} (got {len(args)} "
                            f"positional: {args!r}, keywords: {sorted(kwargs)})") from None


class AsyncMeshMethod(MeshMethod[P, R_co]):
    """The `MeshMethod` of an `async def` method: inside the actor, a direct call is awaitable."""

    __slots__ = ()

    def __call__(  # type: ignore[override]
        self, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R_co]:
        return super().__call__(*args, **kwargs)  # type: ignore[return-value]


class MethodDef(Generic[P, R]):
    """What `@am.method` records on the function it decorates (`definition_of` reads it): its
    default dispatch, and whether its calls may ride a batch with others.

    To the type checker the decorated attribute is this object, whose `__get__` gives
    `mesh.methods.f` its `MeshMethod` type and a direct call inside the actor its plain
    signature. At run time the class keeps the function itself, so that Ray sees an actor
    method: a plain `ray.remote(Worker)` handle calls it, and the actor calls it plainly."""

    def __init__(self, fn: Callable[..., Any], dispatch: Dispatch | None,
                 coalesce: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"@am.method needs a function, got {fn!r}")
        if dispatch is not None and not isinstance(dispatch, Dispatch):
            raise TypeError(f"@am.method(dispatch={dispatch!r}): must be an am.Dispatch")
        if not isinstance(coalesce, bool):
            raise TypeError(f"@am.method(coalesce={coalesce!r}): must be a bool")
        self.fn = fn
        self.dispatch = dispatch
        self.coalesce = coalesce
        self.is_async = inspect.iscoroutinefunction(fn)

    if TYPE_CHECKING:
        @overload
        def __get__(self, instance: None, owner: type[Any]) -> Self: ...
        @overload
        def __get__(self, instance: object, owner: type[Any] | None = None
                    ) -> MeshMethod[P, R]: ...
        def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any: ...

        def __call__(self, instance: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            """`Worker.f(worker, x)`, the unbound form, calls the function."""
            ...


class AsyncMethodDef(MethodDef[P, R]):
    """`MethodDef` of an `async def` method."""

    if TYPE_CHECKING:
        @overload
        def __get__(self, instance: None, owner: type[Any]) -> Self: ...
        @overload
        def __get__(
            self, instance: object, owner: type[Any] | None = None
        ) -> AsyncMeshMethod[P, R]: ...
        def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any: ...


class _Decorator:
    """`@am.method(dispatch=..., coalesce=...)`: the decorator once its arguments are given."""

    def __init__(self, dispatch: Dispatch | None, coalesce: bool) -> None:
        self._dispatch = dispatch
        self._coalesce = coalesce

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
    ) -> AsyncMethodDef[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R], /) -> MethodDef[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> MethodDef[Any, Any]:
        cls = AsyncMethodDef if inspect.iscoroutinefunction(fn) else MethodDef
        setattr(fn, _MARK, cls(fn, self._dispatch, self._coalesce))
        return cast("MethodDef[Any, Any]", fn)  # the function stays: see MethodDef


_MARK = "__actormesh_method__"  # the attribute of a decorated function that holds its MethodDef


def definition_of(attr: object) -> MethodDef[Any, Any] | None:
    """The `MethodDef` of a function decorated with `@am.method`, else None."""
    found = getattr(attr, _MARK, None)
    return found if isinstance(found, MethodDef) else None


@overload
def method(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], /
) -> AsyncMethodDef[P, R]: ...
@overload
def method(fn: Callable[Concatenate[Any, P], R], /) -> MethodDef[P, R]: ...
@overload
def method(*, dispatch: Dispatch | None = None, coalesce: bool = True) -> _Decorator: ...
def method(
    fn: Callable[..., Any] | None = None, /, *, dispatch: Dispatch | None = None,
    coalesce: bool = True,
) -> MethodDef[Any, Any] | _Decorator:
    """Mark an actor method as callable through a mesh, optionally with a default dispatch.

    Works bare (`@am.method`) and with arguments (`@am.method(dispatch=am.dispatch.split())`),
    on `def` and `async def` methods. `coalesce=False` keeps every call of the method its own
    Ray task: it never rides a batch with other calls that waited for the same actor.
    """
    if not isinstance(coalesce, bool):
        raise TypeError(f"@am.method(coalesce={coalesce!r}): must be a bool")
    decorator = _Decorator(dispatch, coalesce)
    return decorator if fn is None else decorator(fn)
