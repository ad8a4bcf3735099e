"""`ActorMesh[T]`: a group of Ray actors on named dims, its sub-mesh views, and its three verbs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from typing import Any, Concatenate, Generic, TypeVar, cast, overload

from typing_extensions import ParamSpec

import ray

from . import _share
from ._actor import RUN, Identity, method_def, remote_class
from ._balancer import ActorLoad, AffinityKeys, Balancer, BalancerSpec, make_scheduler
from ._errors import MeshError
from ._future import MeshFuture, ValueMesh
from ._method import CallOptions, MeshMethod
from ._placement import Placed, Placement
from ._router import Call, Router
from ._shape import IndexKey, Point, Selection, Shape, ShapeLike

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class Loads(list[int]):
    """In-flight calls per actor in rank order (a list of ints), with each actor's full load."""

    def __init__(self, actors: Sequence[ActorLoad]) -> None:
        super().__init__(a.in_flight for a in actors)
        self.actors = list(actors)

    @property
    def alive(self) -> list[bool]:
        return [a.alive for a in self.actors]


@dataclasses.dataclass
class _Root:
    """What every view of one mesh shares: the actors, their router and the placement."""

    cls: type[Any]
    shape: Shape
    router: Router
    keys: AffinityKeys
    external: bool
    placed: Placed | None
    label: str
    shut: bool = False


class ActorMesh(Generic[T]):
    """A group of actors of class `T` laid out on named dims, called through `mesh.methods`.

    `ActorMesh(Worker, shape={"dp": 2, "tp": 2}, args=(3,))` starts 4 actors. Index it
    (`mesh[1, :]`, `mesh.slice(dp=0)`) for views over the same actors, and call
    `mesh.methods.f.all(x)`, `.choose(x)` or `.shard(batch)`.
    """

    def __init__(
        self,
        actor_cls: type[T],
        shape: ShapeLike = 1,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        memory: int | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        placement: Placement | None = None,
        balancer: BalancerSpec = "pow2",
        max_in_flight: int | None = None,
        max_restarts: int = 0,
        name: str | None = None,
        on_restart: Callable[[ActorMesh[T]], object] | None = None,
    ) -> None:
        """Validate everything, then start one actor per point of `shape`.

        `on_restart(view)` runs on the driver after a restarted actor answers again, with the
        one-actor view of it (e.g. to make it rejoin a collective group), before `choose` routes
        to it.
        """
        if not isinstance(actor_cls, type):
            raise TypeError(f"ActorMesh needs a class, got {actor_cls!r}")
        full = Shape.of(shape)
        if placement is not None:
            if not isinstance(placement, Placement):
                raise TypeError(f"placement={placement!r}: must be an am.Placement")
            placement.check(full.size)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise ValueError(f"max_restarts={max_restarts!r}: must be an int >= -1 (-1: forever)")
        keys = AffinityKeys()
        scheduler = make_scheduler(full.size, balancer, max_in_flight, keys)
        label = name or actor_cls.__name__

        if not ray.is_initialized():
            ray.init()  # as Ray does on a first call, honouring RAY_ADDRESS
        placed = Placed(placement) if placement is not None else None
        options: dict[str, Any] = {"max_restarts": max_restarts}
        for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus),
                           ("resources", resources), ("memory", memory),
                           ("runtime_env", runtime_env)):
            if value is not None:
                options[key] = dict(value) if isinstance(value, Mapping) else value
        remote_cls = remote_class(actor_cls)
        handles: list[Any] = []
        try:
            for rank in range(full.size):
                per_actor = placed.actor_options(rank, options) if placed else dict(options)
                if name is not None:
                    per_actor["name"] = f"{name}.{rank}"
                identity = Identity(rank, full.dims, full.sizes)
                handles.append(
                    remote_cls.options(**per_actor).remote(identity, *args, **(kwargs or {}))
                )
        except BaseException:  # Ray refused an actor: leave nothing behind
            for handle in handles:
                ray.kill(handle, no_restart=True)
            if placed is not None:
                placed.release()
            raise

        def restart_hook(actor: int) -> None:
            if on_restart is not None:
                on_restart(self._subview(Selection(Shape({}), (actor,))))

        router = Router(handles, full, scheduler, max_restarts=max_restarts,
                        on_restart=restart_hook)
        for actor in range(full.size):
            router.watch(actor)
        self._root = _Root(actor_cls, full, router, keys, isinstance(balancer, Balancer),
                           placed, label)
        self._init_view(full, tuple(range(full.size)))

    # -- views --------------------------------------------------------------------------------
    def _init_view(self, shape: Shape, actors: tuple[int, ...]) -> None:
        self._shape = shape
        self._actors = actors  # global actor index of each point of this view, in rank order
        self._group = self._root.router.scheduler.add_group(list(actors))
        local = {actor: rank for rank, actor in enumerate(actors)}
        self._point_of: Callable[[int], Point] = lambda actor: Point(local[actor], shape)
        self._methods = _Methods(self)
        self._choose_labels: dict[str, str] = {}  # by method: `choose` is the hot path

    def _subview(self, selection: Selection) -> ActorMesh[T]:
        view: ActorMesh[T] = object.__new__(ActorMesh)
        view._root = self._root
        view._init_view(selection.shape, tuple(self._actors[p] for p in selection.positions))
        return view

    def __getitem__(self, key: IndexKey) -> ActorMesh[T]:
        """`mesh[1]`, `mesh[1, :]`, `mesh[:, 0]`, `mesh[0:2]`: a view; ints drop their dim."""
        return self._subview(self._shape.select(key))

    def slice(self, **dims: int | slice) -> ActorMesh[T]:
        """`mesh.slice(dp=1)`, `mesh.slice(tp=slice(0, 1))`: a view selected by dim name."""
        return self._subview(self._shape.select_dims(**dims))

    # -- description ----------------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def dims(self) -> tuple[str, ...]:
        return self._shape.dims

    @property
    def size(self) -> int:
        return len(self._actors)

    def __len__(self) -> int:
        return len(self._actors)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles of this view, in rank order."""
        handles = self._root.router.handles
        return [handles[a] for a in self._actors]

    @property
    def points(self) -> list[Point]:
        """Each actor's point in the whole mesh (its rank and coordinates), in this view's order."""
        points = self._root.router.points
        return [points[a] for a in self._actors]

    @property
    def methods(self) -> T:
        """The actor class's methods as `MeshMethod`s: `mesh.methods.f.choose(x)`."""
        return cast(T, self._methods)

    def load(self) -> Loads:
        """Calls in flight per actor of this view (rank order), with latency and liveness."""
        scheduler = self._root.router.scheduler
        in_flight, latency, alive = scheduler.in_flight(), scheduler.mean_latency_s(), scheduler.alive()
        return Loads([
            ActorLoad(rank, in_flight[a], latency[a], alive[a])
            for rank, a in enumerate(self._actors)
        ])

    def __repr__(self) -> str:
        return f"ActorMesh({self._root.label}, {self._shape})"

    @overload
    def run_in_actors(
        self, fn: Callable[Concatenate[T, P], Coroutine[Any, Any, R]], /,
        *args: P.args, **kwargs: P.kwargs,
    ) -> MeshFuture[ValueMesh[R]]: ...
    @overload
    def run_in_actors(
        self, fn: Callable[Concatenate[T, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> MeshFuture[ValueMesh[R]]: ...
    def run_in_actors(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> MeshFuture[ValueMesh[Any]]:
        """Run `fn(actor, *args, **kwargs)` inside every actor of this mesh or view, `actor` being
        the actor's instance; results as `all` gives them (a coroutine is awaited in the actor).

        For integrations that set actors up (join a collective group, load a shard) without a
        method of the user's class: `fn` is pickled by value, so define it at module level.
        """
        if not callable(fn):
            raise TypeError(f"run_in_actors needs a callable, got {fn!r}")
        return self._call_all(RUN, (fn, *args), kwargs, CallOptions())

    # -- lifetime -------------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every actor of this view has finished `__init__` (raises if one failed)."""
        refs = [h.__ray_ready__.remote() for h in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            raise TimeoutError(f"{self!r}: {len(refs) - len(ready)} actors not ready after {timeout} s")
        ray.get(refs)

    def shutdown(self) -> None:
        """Kill every actor of the mesh (views share them) and release its placement group."""
        root = self._root
        if root.shut:
            return
        root.shut = True
        root.router.close()
        for handle in root.router.handles:
            ray.kill(handle, no_restart=True)
        if root.placed is not None:
            root.placed.release()

    def __enter__(self) -> ActorMesh[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the verbs (called by MeshMethod) -------------------------------------------------------
    def _check_open(self, name: str) -> None:
        if self._root.shut:
            raise MeshError(f"{self._root.label}.{name}: the mesh is shut down")

    def _call_all(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                  options: CallOptions) -> MeshFuture[ValueMesh[Any]]:
        self._check_open(name)
        shape = self._shape
        every = {position: (args, kwargs) for position in range(len(self._actors))}
        return self._send_plan(name, "all", every, lambda values: ValueMesh(shape, values),
                               options, return_exceptions=options.return_exceptions)

    def _call_choose(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                     options: CallOptions) -> MeshFuture[Any]:
        self._check_open(name)
        root = self._root
        affinity = options.affinity
        call = Call(name, args, kwargs, None, self._point_of, group=self._group,
                    affinity=None if affinity is None else _affinity(root, affinity),
                    retries=options.retries, return_exceptions=options.return_exceptions)
        label = self._choose_labels.get(name)
        if label is None:
            label = self._choose_labels[name] = f"{root.label}.{name}.choose"
        future: MeshFuture[Any] = MeshFuture((call,), None, label, root.router)
        root.router.route(call)
        if options.timeout is not None:
            root.router.expire_after(options.timeout, (call,), label)
        return future

    def _call_shard(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    options: CallOptions) -> MeshFuture[Any]:
        self._check_open(name)
        dispatch = options.dispatch
        if dispatch is None:
            raise TypeError(
                f"{self._root.cls.__name__}.{name} has no dispatch for shard: decorate it with "
                f"@am.method(dispatch=am.dispatch.split()) or call "
                f"mesh.methods.{name}.options(dispatch=...).shard(...)"
            )
        plan = dispatch.plan(self._shape, args, kwargs)  # checks positions before anything is sent
        positions = sorted(plan.calls)
        return self._send_plan(name, "shard", plan.calls,
                               lambda values: plan.collect(dict(zip(positions, values))), options)

    def _send_plan(self, name: str, verb: str, plan: _share.Plan,
                   combine: Callable[[list[Any]], Any], options: CallOptions,
                   return_exceptions: bool = False) -> MeshFuture[Any]:
        """Send each position of this view its arguments (shared objects put once); one future
        combines the results, in position order."""
        shape, router = self._shape, self._root.router
        positions = sorted(plan)
        shared = _share.share_plan(plan)
        calls = [Call(name, *shared[p], Point(p, shape), return_exceptions=return_exceptions)
                 for p in positions]
        for p, call in zip(positions, calls):
            router.send(self._actors[p], call)
        label = f"{self._root.label}.{name}.{verb}"
        if options.timeout is not None:
            router.expire_after(options.timeout, calls, label)
        return MeshFuture(calls, combine, label, router)


class _Methods:
    """The run-time object behind `mesh.methods`: attribute access yields `MeshMethod`s."""

    def __init__(self, mesh: ActorMesh[Any]) -> None:
        self._mesh = mesh
        self._cache: dict[str, MeshMethod[Any, Any]] = {}

    def __getattr__(self, name: str) -> MeshMethod[Any, Any]:
        cached = self._cache.get(name)
        if cached is None:
            definition = method_def(self._mesh._root.cls, name)
            options = CallOptions(dispatch=definition.dispatch if definition else None)
            cached = self._cache[name] = MeshMethod(self._mesh, name, options)
        return cached

    def __dir__(self) -> list[str]:
        return [n for n in dir(self._mesh._root.cls) if not n.startswith("_")]


def _affinity(root: _Root, key: Hashable | None) -> int | None:
    return root.keys.hash(key, remember=root.external) if key is not None else None

