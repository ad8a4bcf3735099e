"""`ActorMesh[T]`: a group of Ray actors on named dims, its sub-mesh views, and its three verbs."""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Concatenate, Generic, TypeVar, cast, overload

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayError
from typing_extensions import ParamSpec, Self

from . import _drivers, _loop, _named, _native, _ray
from ._actor import RUN, Identity, check_init_args, is_asyncio, method_def, remote_class
from ._balancer import DEFAULT_BALANCER, DEFAULT_COALESCE, ActorLoad, BalancerSpec, make_scheduler
from ._calls import Router
from ._errors import MeshError, from_ray
from ._failures import ON_RESTART_TIMEOUT_S, ActorStates
from ._future import MeshFuture, ValueMesh
from ._method import Arguments, CallOptions, MeshMethod, Target, check_timeout
from ._metrics import MeshMetrics
from ._placement import Placed, Placement, shortfall
from ._ray import actor_id
from ._shape import IndexKey, Point, Selectable, Selection, Shape, ShapeLike

log = logging.getLogger("actormesh")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C")  # the actor class `connect` is given


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

    cls: type[Any] | None  # None for a mesh over actors made elsewhere (`from_actors`, `connect`)
    class_name: str
    method_names: frozenset[str]  # of actors made elsewhere, from their handles
    shape: Shape
    router: Router
    label: str
    run_method: str  # what `run_in_actors` calls
    record: _named.Record | None = None  # of a mesh joined with `connect`: its methods
    lacking: str = ""  # what no node of the cluster can give one actor, if anything
    metrics: MeshMetrics = dataclasses.field(init=False)
    cleanup: weakref.finalize[..., _Root] = dataclasses.field(init=False)


class ActorMesh(Selectable, Generic[T]):
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
        balancer: BalancerSpec = DEFAULT_BALANCER,
        max_in_flight: int | None = None,
        coalesce: int = DEFAULT_COALESCE,
        max_restarts: int = 0,
        restart_timeout_s: float = 60.0,
        name: str | None = None,
        on_restart: Callable[[ActorMesh[T]], object] | None = None,
        on_restart_timeout_s: float = ON_RESTART_TIMEOUT_S,
        ray_actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Validate everything, then start one actor per point of `shape`.

        `coalesce` bounds how many calls that waited for one actor ride one Ray task together
        (1: every call is its own task); under light load nothing waits and nothing rides.
        With `max_restarts` (-1: forever) an actor that dies comes back with the same rank,
        coordinates and environment; `choose` waits up to `restart_timeout_s` for it to be back
        when no other actor can take a call. `on_restart(view)` then runs, with the one-actor
        view of it, on a user thread of this mesh (it may call the mesh and wait, e.g. to make
        the actor rejoin a collective group), before `choose` routes to the actor again; after
        `on_restart_timeout_s` the actor is routed to anyway (the overrun is logged).

        With `name`, the actors are Ray named actors `name.0`, `name.1`, ... and the mesh can
        be joined from other drivers of this Ray namespace (`ActorMesh.connect(name)`); the
        drivers' balancers then see each other's calls.

        `ray_actor_options` go to Ray's `.options()` of every actor as they are
        (`scheduling_strategy`, `max_concurrency`, `concurrency_groups`, `lifetime`, ...), except
        what the mesh sets itself, which is refused naming the parameter to use instead. Ray
        must be running (`ray.init()`): the mesh never starts a cluster itself.
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
        check_timeout("restart_timeout_s", restart_timeout_s)
        check_timeout("on_restart_timeout_s", on_restart_timeout_s)
        if on_restart is not None:
            if not callable(on_restart):
                raise TypeError(f"on_restart={on_restart!r}: must be a callable taking the view")
            if max_restarts == 0:
                raise ValueError(
                    "on_restart is given but max_restarts=0: the actors never restart; "
                    "pass max_restarts=n (or -1 for no limit)"
                )
        user_kwargs = dict(kwargs or {})
        check_init_args(actor_cls, tuple(args), user_kwargs)
        passed = _passthrough(ray_actor_options, placement)
        at_once = is_asyncio(actor_cls) or _runs_calls_at_once(passed, groups=False)
        scheduler = make_scheduler(full.size, balancer, max_in_flight, coalesce, at_once=at_once,
                                   concurrent=at_once or _runs_calls_at_once(passed))
        label = name or actor_cls.__name__
        options: dict[str, Any] = {"max_restarts": max_restarts}
        for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus),
                           ("resources", resources), ("memory", memory),
                           ("runtime_env", runtime_env)):
            if value is not None:
                options[key] = dict(value) if isinstance(value, Mapping) else value
        groups = passed.pop("concurrency_groups", None)
        options.update(passed)
        remote_cls = remote_class(actor_cls, groups)
        try:
            remote_cls.options(**options)  # Ray checks every option's name and value here
        except (TypeError, ValueError) as err:
            raise ValueError(f"ActorMesh({actor_cls.__name__}): Ray refuses the actor options "
                             f"{options}: {err}") from None

        _ray.require_driver(f"ActorMesh({actor_cls.__name__})")
        if name is not None:
            _check_name_free(name)
        lacking = "" if placement is not None else shortfall(options)
        if lacking:
            log.warning("actormesh: the %d actors of mesh %s will wait: %s", full.size, label,
                        lacking)
        ActorStates.get().start()  # before any actor exists, so no state change is missed
        placed = Placed(placement) if placement is not None else None
        handles: list[Any] = []
        publication: _named.Publication | None = None
        shared: _drivers.Shared | None = None
        try:
            for rank in range(full.size):
                per_actor = placed.actor_options(rank, options) if placed else dict(options)
                if name is not None:
                    per_actor["name"] = _named.actor_name(name, rank)
                identity = Identity(rank, full.dims, full.sizes, per_actor.get("max_concurrency"))
                handles.append(remote_cls.options(**per_actor).remote(identity, *args, **user_kwargs))
            if name is not None:
                publication = _named.publish(name, actor_cls, full, handles,
                                             is_asyncio(actor_cls))
                shared = _drivers.Shared(scheduler, publication.record, label, creator=True)
        except BaseException:  # Ray refused an actor: leave nothing behind
            for handle in handles:
                ray.kill(handle, no_restart=True)
            if placed is not None:
                placed.release()
            if publication is not None:
                publication.withdraw()
            raise

        router = _router(handles, full, scheduler, restart_timeout_s)
        self._assemble(_Root(actor_cls, actor_cls.__name__, frozenset(), full, router, label, RUN,
                             lacking=lacking),
                       handles, placed, on_restart, owned=True, publication=publication,
                       shared=shared)
        self._root.router.failures.on_restart_timeout_s = on_restart_timeout_s

    @classmethod
    def from_actors(
        cls,
        handles: Sequence[ActorHandle[T]],
        shape: ShapeLike | None = None,
        *,
        balancer: BalancerSpec = DEFAULT_BALANCER,
        max_in_flight: int | None = None,
        coalesce: int = DEFAULT_COALESCE,
        restart_timeout_s: float = 60.0,
        name: str | None = None,
    ) -> ActorMesh[T]:
        """A mesh over Ray actors created elsewhere: every verb, the balancer and the failure
        handling, without starting or owning them (`shutdown()` leaves them alive). Calls that
        ride together run through Ray's `__ray_call__`, which every actor has.

        `shape` defaults to one dim `"rank"` over the handles in the order given. The actors
        restart as their own `max_restarts` says; `choose` follows, as for a mesh's own actors.
        """
        handles = list(handles)
        if not handles:
            raise ValueError("from_actors needs at least one actor handle, got none")
        _ray.require_driver("ActorMesh.from_actors")
        for handle in handles:
            if not isinstance(handle, ActorHandle):
                raise TypeError(f"from_actors takes Ray actor handles, got {handle!r}")
        ids = [actor_id(h) for h in handles]
        if len(set(ids)) != len(ids):
            raise ValueError("from_actors: the same actor is given twice")
        full = Shape.of(len(handles) if shape is None else shape)
        if full.size != len(handles):
            raise ValueError(f"shape {full} has {full.size} points but {len(handles)} actors "
                             "were given")
        check_timeout("restart_timeout_s", restart_timeout_s)
        at_once = any(_ray.runs_calls_at_once(h) for h in handles)
        scheduler = make_scheduler(full.size, balancer, max_in_flight, coalesce, at_once=at_once,
                                   concurrent=at_once or any(_ray.runs_groups_at_once(h)
                                                             for h in handles))
        class_name = _ray.class_name(handles[0])
        ActorStates.get().start()
        mesh: ActorMesh[T] = object.__new__(ActorMesh)
        mesh._assemble(_Root(None, class_name, frozenset(_ray.method_names(handles[0])), full,
                             _router(handles, full, scheduler, restart_timeout_s),
                             name or class_name,
                             "__ray_call__"), handles, None, None, owned=False)
        return mesh

    @overload
    @classmethod
    def connect(
        cls, name: str, actor_cls: type[C], /, *, balancer: BalancerSpec = ...,
        max_in_flight: int | None = ..., coalesce: int = ..., restart_timeout_s: float = ...,
    ) -> ActorMesh[C]: ...
    @overload
    @classmethod
    def connect(
        cls, name: str, /, *, balancer: BalancerSpec = ..., max_in_flight: int | None = ...,
        coalesce: int = ..., restart_timeout_s: float = ...,
    ) -> ActorMesh[Any]: ...
    @classmethod
    def connect(
        cls,
        name: str,
        actor_cls: type[Any] | None = None,
        /,
        *,
        balancer: BalancerSpec = DEFAULT_BALANCER,
        max_in_flight: int | None = None,
        coalesce: int = DEFAULT_COALESCE,
        restart_timeout_s: float = 60.0,
    ) -> ActorMesh[Any]:
        """Join the mesh that another driver of this Ray namespace created with `name=`: the same
        shape, dims, methods (with their dispatch) and verbs, and failure handling, through a
        balancer of this driver's own (`balancer`, `max_in_flight` and `coalesce` as for
        `ActorMesh`; slots bound this driver's calls). Every driver's balancer counts the calls
        the others have in flight, so several drivers do not herd onto the same actors.

        Pass the actor class (`connect("engines", Engine)`) for a typed `ActorMesh[Engine]`;
        it must be the class the mesh was made of. `shutdown()` leaves the actors to their
        creator. Raises `am.MeshError` naming the mesh when there is no such mesh in this
        namespace, it is being shut down, or one of its actors is gone.
        """
        check_timeout("restart_timeout_s", restart_timeout_s)
        if actor_cls is not None and not isinstance(actor_cls, type):
            raise TypeError(f"connect({name!r}, {actor_cls!r}): the second argument must be "
                            "the mesh's actor class")
        _ray.require_driver(f"ActorMesh.connect({name!r})")
        record, handles = _named.find(name)
        if actor_cls is not None:
            _named.check_class(record, actor_cls)
        full = record.shape
        scheduler = make_scheduler(full.size, balancer, max_in_flight, coalesce,
                                   concurrent=record.concurrent,
                                   at_once=any(_ray.runs_calls_at_once(h) for h in handles))
        ActorStates.get().start()
        shared = _drivers.Shared(scheduler, record, name, creator=False)
        mesh: ActorMesh[Any] = object.__new__(ActorMesh)
        try:
            router = _router(handles, full, scheduler, restart_timeout_s)
            mesh._assemble(_Root(None, record.class_name, frozenset(), full, router, name, RUN,
                                 record), handles, None, None, owned=False, shared=shared)
        except BaseException:
            shared.leave()
            raise
        return mesh

    def _assemble(self, root: _Root, handles: list[Any], placed: Placed | None,
                  on_restart: Callable[[ActorMesh[T]], object] | None, *, owned: bool,
                  publication: _named.Publication | None = None,
                  shared: _drivers.Shared | None = None) -> None:
        """Make this the whole mesh over `root`: follow the actors' states, and clean up when
        the last view of it goes."""
        root.metrics = MeshMetrics(root.label, root.router.scheduler)
        root.router.failures.label = root.label
        root.router.failures.metrics = root.router.metrics = root.metrics
        root.router.lacking = root.lacking
        root.cleanup = weakref.finalize(root, _release, root.router, handles if owned else [],
                                        placed, root.label, publication, shared, root.metrics)
        root.cleanup.atexit = False  # at exit Ray itself kills the actors
        if on_restart is not None:
            # Held weakly: the router (alive while calls are) must not keep a dropped mesh alive.
            root.router.failures.on_restart = functools.partial(
                _run_restart_hook, weakref.ref(root), on_restart)
        root.router.failures.watch([actor_id(h) for h in handles], known=owned)
        self._root = root
        self._init_view(root.shape, tuple(range(root.shape.size)))

    # -- views --------------------------------------------------------------------------------
    def _init_view(self, shape: Shape, actors: tuple[int, ...]) -> None:
        root = self._root
        self._target = Target(shape, actors, root.router, root.label, root.class_name, root)
        self._methods = _Methods(self)

    @staticmethod
    def _view(root: _Root, shape: Shape, actors: tuple[int, ...]) -> ActorMesh[Any]:
        view: ActorMesh[Any] = object.__new__(ActorMesh)
        view._root = root
        view._init_view(shape, actors)
        return view

    def _selected(self, selection: Selection) -> ActorMesh[T]:
        actors = tuple(self._target.actors[p] for p in selection.positions)
        return ActorMesh._view(self._root, selection.shape, actors)

    def __getitem__(self, key: IndexKey) -> ActorMesh[T]:
        """`mesh[1]`, `mesh[1, :]`, `mesh[:, 0]`, `mesh[0:2]`: a view over the same actors; an int
        drops its dim, a slice keeps it (`mesh[1, 0]` is a mesh of one actor)."""
        return self._select(key)

    # -- description ----------------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return self._target.shape

    @property
    def dims(self) -> tuple[str, ...]:
        return self._target.shape.dims

    @property
    def size(self) -> int:
        return len(self._target.actors)

    def __len__(self) -> int:
        return len(self._target.actors)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles of this view, in rank order."""
        handles = self._root.router.handles
        return [handles[a] for a in self._target.actors]

    @property
    def points(self) -> list[Point]:
        """Each actor's point in the whole mesh (its rank and coordinates), in this view's order."""
        points = self._root.router.points
        return [points[a] for a in self._target.actors]

    @property
    def methods(self) -> T:
        """The actor class's methods as `MeshMethod`s: `mesh.methods.f.choose(x)`."""
        return cast(T, self._methods)

    def load(self) -> Loads:
        """Calls in flight per actor of this view (rank order), with latency and liveness, as
        they were at one instant. On a mesh several drivers share (`name=`, `connect`), the
        counts include the other drivers' calls (`ActorLoad.others`)."""
        snapshot = self._root.router.scheduler.snapshot()
        loads = []
        for rank, actor in enumerate(self._target.actors):
            own, _, latency, status, ejected, others = snapshot[actor]
            loads.append(ActorLoad(rank, own + others, latency, status == "alive",
                                   restarting=status == "restarting", ejected=ejected,
                                   others=others))
        return Loads(loads)

    def stats(self) -> dict[str, Any]:
        """The mesh's figures now, as its metrics export them (`actormesh_*`): calls per
        method and outcome, call durations and calls per Ray task per method, calls in flight
        and queued, and actor events (died, restarted, ejected, readmitted). A view reports its
        whole mesh."""
        return self._root.metrics.stats()

    def __repr__(self) -> str:
        return f"ActorMesh({self._root.label}, {self._target.shape})"

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{self!r} cannot be pickled (into a Ray task or actor): it holds this driver's "
            "scheduler. Pass the actor handles (mesh.actors) instead, or create the mesh with "
            f"name=... and join it there with am.ActorMesh.connect(name)")

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
        method: MeshMethod[..., Any] = MeshMethod(self._target, self._root.run_method,
                                                  CallOptions())
        return method.all(fn, *args, **kwargs)

    # -- lifetime -------------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every actor of this view has finished `__init__` (raises if one failed)."""
        check_timeout("timeout", timeout)
        _ray.require_driver(f"{self!r}.wait_ready")
        refs = [h.__ray_ready__.remote() for h in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            lacking = self._root.lacking
            raise TimeoutError(f"{self!r}: {len(refs) - len(ready)} actors not ready after "
                               f"{timeout} s" + (f": {lacking}" if lacking else ""))
        for point, ref in zip(self.points, refs):
            try:
                _ray.get(ref)
            except RayError as err:
                raise from_ray(point, "wait_ready", err) from None

    def shutdown(self) -> None:
        """Kill every actor of the mesh (views share them) and release its placement group;
        a mesh made with `from_actors` or joined with `connect` leaves its actors alive (to
        their creator). Calls still waiting for a slot fail with `am.MeshError`."""
        detached = self._root.cleanup.detach()
        if detached is not None:
            _shut(*detached[2])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _router(handles: list[Any], full: Shape, scheduler: _native.Scheduler,
            restart_timeout_s: float) -> Router:
    """The router of a mesh's actors; a Python Balancer (the `external` policy) drains its
    queue on the loop thread, never on Ray's."""
    return Router(handles, [Point(r, full) for r in range(full.size)], scheduler,
                  defer_drain=scheduler.policy == "external", restart_timeout_s=restart_timeout_s)


def _run_restart_hook(root_ref: weakref.ref[_Root], hook: Callable[[ActorMesh[Any]], object],
                      actor: int) -> None:
    root = root_ref()
    if root is not None:
        hook(ActorMesh._view(root, Shape({}), (actor,)))


def _release(router: Router, handles: list[Any], placed: Placed | None, label: str,
             publication: _named.Publication | None, shared: _drivers.Shared | None,
             metrics: MeshMetrics) -> None:
    """A mesh was garbage-collected without `shutdown()`: shut it down on the loop thread
    (collection happens on any thread, Ray's completion thread included)."""
    _loop.post(_shut, router, handles, placed, label, publication, shared, metrics)


def _shut(router: Router, handles: list[Any], placed: Placed | None, label: str,
          publication: _named.Publication | None, shared: _drivers.Shared | None,
          metrics: MeshMetrics) -> None:
    """Close the router and stop sharing its load, then (a mesh this driver created) kill the
    actors; a named mesh is marked closing before its actors go and unpublished after. After
    `ray.shutdown()` only this process's side is undone: the actors, their placement group and
    the record went with the cluster, and asking Ray would start a new one."""
    ray_up = _ray.connected()
    if publication is not None and ray_up:
        _quietly(label, "marking the mesh closing", publication.closing)
    router.close(f"{label}: the mesh was shut down before this call was sent")
    if shared is not None:
        _quietly(label, "leaving the drivers' load", shared.leave)
    if ray_up:
        for handle in handles:
            _quietly(label, "killing an actor", ray.kill, handle, no_restart=True)
        if placed is not None:
            placed.release()
    if publication is not None:
        _quietly(label, "unpublishing the mesh", publication.withdraw)
    metrics.close()


# Ray options the mesh sets itself, and what to use instead.
_OWNED_OPTIONS = {
    "num_cpus": "ActorMesh(num_cpus=...)", "num_gpus": "ActorMesh(num_gpus=...)",
    "resources": "ActorMesh(resources=...)", "memory": "ActorMesh(memory=...)",
    "runtime_env": "ActorMesh(runtime_env=...)", "max_restarts": "ActorMesh(max_restarts=...)",
    "name": "ActorMesh(name=...), which names the actors name.0, name.1, ...",
    "get_if_exists": "ActorMesh.connect(name) to join an existing mesh",
    "max_task_retries": ".options(retries=n) on the method: Ray would replay a whole batch of "
                        "calls",
    "placement_group": "placement=am.Placement(placement_group=pg)",
    "placement_group_bundle_index": "placement=am.Placement(...), which gives each rank a bundle",
    "placement_group_capture_child_tasks": "placement=am.Placement(...)",
}


def _passthrough(options: Mapping[str, Any] | None, placement: Placement | None) -> dict[str, Any]:
    """`ray_actor_options`, checked: a mapping, without what the mesh sets itself."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"ray_actor_options={options!r}: must be a mapping of Ray actor options")
    for key in options:
        if key in _OWNED_OPTIONS:
            raise ValueError(f"ray_actor_options={{{key!r}: ...}}: the mesh sets {key} itself; "
                             f"use {_OWNED_OPTIONS[key]}")
    if placement is not None and "scheduling_strategy" in options:
        raise ValueError("ray_actor_options={'scheduling_strategy': ...} with placement=: the "
                         "placement gives each actor its bundle; pass one or the other")
    return dict(options)


def _runs_calls_at_once(options: Mapping[str, Any], *, groups: bool = True) -> bool:
    """Whether these options make the actors run several calls at once (threads; with
    `groups`, a concurrency group's beside the others too)."""
    concurrency = options.get("max_concurrency")
    return (groups and bool(options.get("concurrency_groups"))) or (
        isinstance(concurrency, int) and concurrency > 1)


def _check_name_free(name: str) -> None:
    """MeshError naming `name` if actors of a mesh of that name exist in this namespace."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={name!r}: must be a non-empty str")
    try:
        ray.get_actor(_named.actor_name(name, 0))
    except ValueError:
        return
    raise MeshError(f"name={name!r} is taken: Ray namespace {_ray.namespace()!r} has a mesh (or "
                    f"an actor {_named.actor_name(name, 0)!r}) of that name already. Join it "
                    f"with am.ActorMesh.connect({name!r}), or pick another name")


def _quietly(label: str, what: str, fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - Ray is gone already (interpreter exit)
        log.debug("actormesh: %s of %s failed: %s", what, label, err)


class _Methods:
    """The run-time object behind `mesh.methods`: attribute access yields `MeshMethod`s."""

    def __init__(self, mesh: ActorMesh[Any]) -> None:
        self._mesh = mesh
        self._cache: dict[str, MeshMethod[Any, Any]] = {}

    def __getattr__(self, name: str) -> MeshMethod[Any, Any]:
        cached = self._cache.get(name)
        if cached is None:
            root = self._mesh._root
            alone = False
            arguments = None
            if root.cls is not None:
                definition = method_def(root.cls, name)
                dispatch = definition.dispatch if definition else None
                alone = definition is not None and not definition.coalesce
                arguments = Arguments.of(root.cls, name)
            elif root.record is not None or (name in root.method_names
                                             and not name.startswith("__")):
                # actors made elsewhere, or a mesh joined: Ray's record of the class
                dispatch, alone = root.record.method(name) if root.record else (None, False)
                arguments = Arguments.of_handle(root.class_name, root.router.handles[0], name)
            else:
                raise AttributeError(f"{root.class_name} has no method {name!r}")
            options = CallOptions(dispatch=dispatch)
            cached = self._cache[name] = MeshMethod(self._mesh._target, name, options,
                                                    alone=alone, arguments=arguments)
        return cached

    def __dir__(self) -> list[str]:
        root = self._mesh._root
        if root.cls is not None:
            names: Iterable[str] = dir(root.cls)
        elif root.record is not None:
            names = root.record.methods
        else:
            names = root.method_names
        return [n for n in names if not n.startswith("_")]
