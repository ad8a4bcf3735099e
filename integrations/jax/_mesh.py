"""`JaxMesh[T]`: an `ActorMesh[T]` whose actors are the processes of one multi-process JAX program.

The driver places the actors (one bundle per process), finds rank 0's bundle, starts the
`Rendezvous` there (it holds the coordinator port; see `_coordinator`) and every actor at once,
waiting on none: rank 0's `initialize` returns only when all processes have connected. Each actor
joins `jax.distributed` before the user's `__init__` runs, and only once all have checked in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from typing_extensions import Unpack

import actormesh as am
from actormesh._actor import with_setup
from actormesh._placement import Strategy, _rank_order

from .._checks import check_optional_int
from .._options import MeshOptions, user_args
from ._coordinator import PORT_ENV, Arrival, check_port_free, port_override, start_rendezvous

T = TypeVar("T")

DIM = "process"
"""The one dim of a `JaxMesh`: its rank is the JAX process index."""


@dataclasses.dataclass(frozen=True)
class JaxSetup:
    """What an actor needs to join the JAX program, passed ahead of the user's arguments."""

    num_processes: int
    host: str
    port: int | None
    rendezvous: Any
    init_timeout_s: int
    platforms: str | None
    local_device_count: int | None

    def address(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"


def join(setup: JaxSetup) -> None:
    """In an actor, before the user's `__init__`: configure JAX, meet the others, initialize."""
    import jax

    rank, count = am.current_rank().rank, setup.num_processes
    rendezvous = setup.rendezvous
    try:
        if jax.distributed.is_initialized() or _backends_initialized():
            # initialize would raise here while the others block on this process: fail first.
            raise RuntimeError(
                "JAX was already in use in this process before the mesh could run "
                "jax.distributed.initialize (a JAX computation or jax.devices() at import time "
                "of the actor's module?)"
            )
        update: Callable[[str, object], None] = jax.config.update
        if setup.platforms is not None:
            update("jax_platforms", setup.platforms)
        if setup.local_device_count is not None:
            update("jax_num_cpu_devices", setup.local_device_count)
        if rank == 0 and setup.port is not None:
            try:
                check_port_free(setup.port)
            except OSError as err:
                raise RuntimeError(
                    f"cannot start the JAX coordinator at {setup.address(setup.port)} ({err}); "
                    f"the port comes from {PORT_ENV}"
                ) from err
    except Exception as err:
        rendezvous.fail.remote(rank, f"{type(err).__name__}: {err}")
        raise
    try:
        arrival: Arrival = ray.get(rendezvous.arrive.remote(rank), timeout=setup.init_timeout_s)
    except GetTimeoutError:
        try:
            port, missing = ray.get([rendezvous.port.remote(), rendezvous.missing.remote()],
                                    timeout=30)
            what, where = f"process(es) {missing}", f"at {setup.address(port)}"
        except Exception:  # the rendezvous itself is gone
            what, where = "the other processes", f"on {setup.host}"
        raise RuntimeError(
            f"JAX process {rank} of {count}: {what} did not reach the coordinator {where} "
            f"within init_timeout_s={setup.init_timeout_s} s (did their actors fail to start?)"
        ) from None
    address = setup.address(arrival.port)
    if arrival.failure is not None:
        raise RuntimeError(
            f"JAX process {rank} of {count} cannot join the coordinator at {address}: "
            f"{arrival.failure}"
        )
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=count,
        process_id=rank,
        initialization_timeout=setup.init_timeout_s,
    )
    if rank == 0:
        rendezvous.release.remote()  # the coordinator owns the port now


def _backends_initialized() -> bool:
    """Whether this process's JAX backend is up (the check `jax.distributed.initialize` makes)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # a JAX without it: initialize itself will tell
        return False
    check: Callable[[], bool] = getattr(xla_bridge, "backends_are_initialized", lambda: False)
    return check()


class JaxMesh(am.ActorMesh[T]):
    """A mesh of `num_processes` actors (dim `"process"`) forming one multi-process JAX program.

    In every actor, `jax.distributed.initialize` has returned before the user's `__init__` runs,
    with `jax.process_index()` equal to the actor's rank. Ranks follow the placement (processes on
    one node are neighbours); the coordinator runs on rank 0's node, on a port held for it from
    the moment it is chosen (or on `ACTORMESH_JAX_COORDINATOR_PORT` when set on the driver).

    - `bundles`: one placement bundle per process, placed with `strategy` (SPREAD: across nodes
      when it can). The default asks for what each actor asks for: `num_cpus` (1 if unset), and
      `num_gpus`, `resources` and `memory` when given. Or pass an `am.Placement` as
      `placement=` (e.g. an existing placement group); its bundle count is checked the same way.
    - `platforms`: sets `jax_platforms` in each process (e.g. `"cpu"`); `local_device_count`
      sets how many CPU devices each process exposes (`jax_num_cpu_devices`), for testing
      sharded programs on one machine.
    - `init_timeout_s`: how long a process waits for the others to reach the coordinator.
    - The other `ActorMesh` options pass through (`MeshOptions`), except `shape` (fixed by
      `num_processes`), `max_restarts` and `on_restart`: `jax.distributed` cannot re-admit one
      restarted process into a running program.

    Like `ActorMesh`, the constructor does not wait: `mesh.wait_ready()` returns once every
    process has joined (and raises the error, naming the coordinator address, if one could not).
    Shut it down through the `JaxMesh` (or `with`): that also releases its placement group.
    """

    def __init__(
        self,
        actor_cls: type[T],
        num_processes: int,
        *,
        bundles: Sequence[Mapping[str, float]] | None = None,
        strategy: Strategy = "SPREAD",
        platforms: str | None = None,
        local_device_count: int | None = None,
        init_timeout_s: int = 120,
        **mesh_options: Unpack[MeshOptions],
    ) -> None:
        if not isinstance(actor_cls, type):
            raise TypeError(f"JaxMesh needs a class, got {actor_cls!r}")
        if isinstance(num_processes, bool) or not isinstance(num_processes, int):
            raise TypeError(f"num_processes={num_processes!r}: must be an int")
        if num_processes < 1:
            raise ValueError(f"num_processes={num_processes}: must be >= 1")
        local_device_count = check_optional_int("local_device_count", local_device_count, 1)
        if isinstance(init_timeout_s, bool) or not isinstance(init_timeout_s, int) \
                or init_timeout_s < 1:
            raise ValueError(f"init_timeout_s={init_timeout_s!r}: must be an int >= 1 (seconds)")
        for option in ("shape", "max_restarts", "on_restart"):
            if option in mesh_options:
                raise TypeError(
                    f"JaxMesh does not take {option}=: the shape is {{'process': num_processes}} "
                    "and jax.distributed cannot re-admit a restarted process"
                )
        args, options = user_args(actor_cls, mesh_options)
        override = port_override()
        placement = options.pop("placement", None)
        group, owned = _placement_group(num_processes, bundles, strategy, placement, options)

        rendezvous: Any = None
        try:
            rank0_bundle = _rank_order(group)[0]
            rendezvous = start_rendezvous(num_processes, override, PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=rank0_bundle))
            setup = JaxSetup(num_processes, _node_ip(group, rank0_bundle), override, rendezvous,
                             init_timeout_s, platforms, local_device_count)
            super().__init__(
                with_setup(actor_cls, join),
                {DIM: num_processes},
                args=(setup, *args),
                placement=am.Placement(placement_group=group),
                **options,
            )
        except BaseException:
            _release(rendezvous, group if owned else None)
            raise
        # Named apart from ActorMesh's own attributes. The port is asked for now, unwaited: the
        # rendezvous ends once the coordinator is up, its answer stays.
        self._jax_setup = setup
        self._jax_port = rendezvous.port.remote()
        self._jax_group = group
        self._jax_owns_group = owned

    @property
    def num_processes(self) -> int:
        return self.size

    @property
    def coordinator_address(self) -> str:
        """`host:port` of the JAX coordinator (on rank 0's node)."""
        setup = self._jax_setup
        port = cast(int, ray.get(self._jax_port, timeout=max(setup.init_timeout_s, 60)))
        return setup.address(port)

    def shutdown(self) -> None:
        """Kill the processes, the rendezvous if still up, and the placement group if it made it."""
        super().shutdown()
        _release(self._jax_setup.rendezvous, self._jax_group if self._jax_owns_group else None)
        self._jax_owns_group = False

    def __repr__(self) -> str:
        return f"JaxMesh({self._root.label}, num_processes={self.size})"


def _placement_group(
    num_processes: int,
    bundles: Sequence[Mapping[str, float]] | None,
    strategy: Strategy,
    placement: am.Placement | None,
    options: Mapping[str, Any],
) -> tuple[PlacementGroup, bool]:
    """A ready placement group with one bundle per process, and whether this mesh owns it."""
    if placement is not None and bundles is not None:
        raise TypeError("JaxMesh takes bundles= or placement=, not both")
    if placement is None:
        if bundles is None:
            bundles = [_default_bundle(options)] * num_processes
        placement = am.Placement(bundles=bundles, strategy=strategy)
    elif not isinstance(placement, am.Placement):
        raise TypeError(f"placement={placement!r}: must be an am.Placement")
    if placement.bundle_count != num_processes:
        raise ValueError(
            f"{placement.bundle_count} placement bundles for num_processes={num_processes}: "
            "give exactly one bundle per JAX process"
        )
    timeout_s = placement.timeout_s
    if placement.placement_group is not None:
        group, owned = placement.placement_group, False
    else:
        assert placement.bundles is not None
        group = placement_group([dict(b) for b in placement.bundles], strategy=placement.strategy)
        owned = True
    try:
        ready = group.wait(timeout_s)
    except Exception:
        ready = False
    if not ready:
        if owned:
            remove_placement_group(group)
        raise TimeoutError(
            f"placement group with bundles {group.bundle_specs} for {num_processes} JAX processes "
            f"not ready after {timeout_s} s: the cluster lacks the resources"
        )
    return group, owned


def _default_bundle(options: Mapping[str, Any]) -> dict[str, float]:
    """What one process asks for: `num_cpus` (1 if unset), `num_gpus`, `resources`, `memory`."""
    num_cpus = options.get("num_cpus")
    bundle: dict[str, float] = {"CPU": 1 if num_cpus is None else num_cpus,
                                "GPU": options.get("num_gpus") or 0,
                                **(options.get("resources") or {}),
                                "memory": options.get("memory") or 0}
    return {name: amount for name, amount in bundle.items() if amount}


def _node_ip(group: PlacementGroup, bundle: int) -> str:
    """The IP address of the node that holds `bundle` of `group`."""
    node_id = ray.util.placement_group_table(group)["bundles_to_node_id"][bundle]
    nodes: Callable[[], list[dict[str, Any]]] = ray.nodes
    for node in nodes():
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    raise RuntimeError(f"node {node_id} of placement bundle {bundle} is not in the cluster")


def _release(rendezvous: Any, group: PlacementGroup | None) -> None:
    if not ray.is_initialized():  # they went with the cluster; asking would start a new one
        return
    if rendezvous is not None:
        try:
            ray.kill(rendezvous, no_restart=True)
        except ValueError:  # already gone
            pass
    if group is not None:
        remove_placement_group(group)
