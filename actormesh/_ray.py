"""What the library reads from Ray beyond its public API, in one place, each use guarded.

- `outcome(ref)`: how a finished call ended (a value, a raise in the method, the actor gone),
  read from the object's metadata without deserialising it, so that Ray's completion thread
  pays ~2 µs per call instead of a deserialisation.
- `run_on_event_loop`: inside an asyncio actor, a function that Ray runs on the task's own
  thread (`__ray_call__`) runs coroutines on the actor's event loop, as Ray runs its own.
- `subscribe` / `actor_state`: Ray's GCS actor channel (followed by `_failures.ActorStates`),
  which publishes every change of every actor's state (alive, restarting with its restart
  count, dead) within milliseconds. It is how a mesh sees an
  idle actor die or come back without keeping a call pending on it (which would need a
  concurrency group, and that moves a synchronous actor's methods off its `__init__` thread).
- `arrived(ref)`: whether a value can be read at once (a reader then reads it on its own
  thread or event loop instead of waiting, or handing the read to a thread).
- `runs_calls_at_once(handle)`: whether the actor runs calls out of order, which is also
  whether `ray.cancel` may be used on its calls; `runs_groups_at_once(handle)`: whether a
  method of its class runs in a concurrency group of its own (the class found by the module
  and name Ray recorded, `__ray_metadata__` for a class `@ray.remote` made);
  `methods_with_options`, `method_parameters`: the Ray options and the parameters Ray
  recorded for each method of an actor made elsewhere (the method records of its handle).
- `connected()` / `get`: whether this process is still connected to Ray. Ray's `.remote()`,
  `ray.get`, `ray.kill`, `ray.cancel`, `ray.get_actor`... start a new local cluster when there
  is none (after `ray.shutdown()`); the library checks first, everywhere it calls Ray on its
  own (its threads, a mesh's finalizer or shutdown) or for a call of a mesh, so that a mesh of
  a cluster that is gone fails its calls instead of starting another cluster.

These need Ray 2.60 or newer (`ObjectRef._on_ready` first shipped there): `require` refuses an
older Ray when actormesh is imported, naming the version found.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RaySystemError

from ._errors import MeshError, ray_failure

log = logging.getLogger("actormesh")

T = TypeVar("T")

# How a call ended, as `outcome` tells it.
OK = 0  # returned a value
RAISED = 1  # the method raised
DIED = 2  # the actor died (or its node) before it answered
UNAVAILABLE = 3  # the actor could not be reached; it may be restarting
CANCELLED = 4
FAILED = 5  # any other error (an object lost, a serialisation failure, ...)

# Ray's ErrorType numbers (ray.core.generated.common_pb2.ErrorType), as object metadata carries
# them: an object holding an error has the number as the first field of its metadata.
_KINDS = {0: DIED, 1: DIED, 3: RAISED, 5: CANCELLED, 15: DIED, 23: DIED, 25: UNAVAILABLE}

MIN_RAY = (2, 60)


def require(version: str, object_ref: type) -> None:
    """Raise ImportError, naming what was found, unless this Ray has what actormesh uses."""
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        numbers.append(int(digits) if digits else 0)
    if tuple(numbers) < MIN_RAY or not hasattr(object_ref, "_on_ready"):
        raise ImportError(
            f"actormesh needs ray>={MIN_RAY[0]}.{MIN_RAY[1]} (found ray {version}): it watches "
            "every call with ObjectRef._on_ready and follows actors on the GCS actor channel, "
            f"which older releases lack. Upgrade: pip install 'ray>={MIN_RAY[0]}.{MIN_RAY[1]}'"
        )


require(ray.__version__, ray.ObjectRef)

try:
    _worker: Any = importlib.import_module("ray._private.worker")
except ImportError:  # pragma: no cover - a Ray without it: every call counts as a success
    _worker = None


def outcome(ref: Any) -> int:
    """How the call behind `ref` (which has finished) ended, without deserialising its value.

    A value stored in the object store rather than inline is a success: errors are small and
    come back inline, and reading a remote object here could wait on a transfer.
    """
    try:
        core_worker = _worker.global_worker.core_worker
        if not core_worker.object_exists(ref, memory_store_only=True):
            return OK
        metadata: bytes | None = core_worker.get_objects([ref], 0)[0].metadata
    except Exception:  # noqa: BLE001 - not the internals this was written for: count a success
        return OK
    if not metadata:
        return OK
    head = metadata.split(b",", 1)[0]
    return _KINDS.get(int(head), FAILED) if head.isdigit() else OK


def arrived(ref: Any) -> bool:
    """Whether the value (or error) behind `ref` is already in this process's memory store, so
    that reading it now does not wait. False if this Ray cannot tell, or for a large value kept
    in the object store."""
    try:
        return bool(_worker.global_worker.core_worker.object_exists(ref, memory_store_only=True))
    except Exception:  # noqa: BLE001 - not the internals this was written for
        return False


NOT_RUNNING = ("Ray is not running in this process (ray.shutdown() was called): actormesh "
               "does not start it again, and the mesh's actors were in the cluster that ended")


def connected() -> bool:
    """Whether this process is connected to a Ray cluster (`ray.is_initialized()`, read
    without its wrapper: this is on the path of every call sent)."""
    if _worker is None:  # pragma: no cover - internals moved: the public (slower) question
        return bool(ray.is_initialized())
    return bool(_worker.global_worker.connected)


def require_driver(what: str) -> None:
    """Raise `MeshError` saying why, unless this process is connected to a Ray cluster as a
    driver (or a worker) of its own: never start one (as `ray.init()` in the library would),
    and refuse Ray Client, whose process has no core worker of its own to follow actors and
    read replies with."""
    if client_connected():
        raise MeshError(
            f"{what}: Ray Client (ray.init(\"ray://...\")) is not supported: actormesh follows "
            "its actors on the cluster's GCS and reads their replies in this process's own "
            "core worker, which a Ray Client process does not have. Run the driver on a node "
            "of the cluster (ray.init(address=\"auto\")) or submit it as a Ray job "
            "(ray job submit -- python your_driver.py)")
    if not connected():
        raise MeshError(
            f"{what}: Ray is not running in this process. Call ray.init() first (it starts a "
            "local cluster, or joins the one RAY_ADDRESS names; ray.init(address=\"auto\") "
            "joins the one running on this node): actormesh never starts a cluster itself")


def client_connected() -> bool:
    """Whether this process talks to a cluster through Ray Client (`ray.init("ray://...")`)."""
    from ray.util.client import ray as client

    is_connected: Callable[[], bool] = client.is_connected  # untyped in Ray
    return bool(is_connected())


def get(refs: Any, timeout: float | None = None) -> Any:
    """`ray.get`, refused with a `MeshError` when Ray is not running (where `ray.get` would
    start a new cluster, in which these objects do not exist). Ray's failures that are not a
    task's own error become `MeshError`s too: the `SystemExit` Ray raises in a thread that
    waits while `ray.shutdown()` runs, and a system error such as "Core worker is shutting
    down" read as a value."""
    if not connected():
        raise MeshError(NOT_RUNNING)
    try:
        return ray.get(refs, timeout=timeout)
    except (SystemExit, RaySystemError) as err:
        raise ray_failure("reading a value", err) from err


_FIRST_SLICE_S, _LAST_SLICE_S = 0.02, 0.2


def get_until(refs: Any, timeout: float | None, stop: Callable[[], bool],
              ended: Callable[[], bool]) -> tuple[Any, bool] | None:
    """`get(refs, timeout)`, and, for one ref, whether its value had arrived before this was
    called (then when it arrived is not known); None as soon as `stop()` is true.

    Ray's get cannot be woken, so it reads in slices (20 ms, twice as long each time up to
    200 ms) and asks `stop` between two: a call cancelled meanwhile (a synchronous actor runs it
    to its end) does not hold its reader. Once `ended()` says every task behind `refs` has
    ended, one get reads the values to the end, as a slice that times out would drop what it
    was pulling from another node. `GetTimeoutError` once `timeout` has passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    was_there = not isinstance(refs, list) and arrived(refs)
    slice_s = _FIRST_SLICE_S
    while not stop():
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if ended():
            return get(refs, left), was_there
        try:
            return get(refs, slice_s if left is None else min(slice_s, left)), was_there
        except GetTimeoutError:
            if left is not None and left <= slice_s:
                raise
        was_there = False
        slice_s = min(2 * slice_s, _LAST_SLICE_S)
    return None


def wait(refs: list[Any], num_returns: int, timeout: float | None) -> tuple[list[Any], list[Any]]:
    """`ray.wait`, refused with a `MeshError` when Ray is not running (where it would start a
    new cluster); Ray's failures that are not a task's own (its `SystemExit` and system errors
    while it shuts down meanwhile) are `MeshError`s too, as in `get`."""
    if not connected():
        raise MeshError(NOT_RUNNING)
    try:
        done, pending = ray.wait(refs, num_returns=num_returns, timeout=timeout)
    except (SystemExit, RaySystemError) as err:
        raise ray_failure("waiting for ObjectRefs", err) from err
    return done, pending


def on_ready(ref: Any, callback: Callable[[Any], object]) -> None:
    """Call `callback(...)` once the object behind `ref` exists (or its task failed), on Ray's
    completion thread, without reading the value (`ObjectRef._on_ready`)."""
    ref._on_ready(callback)


# Actor states on the GCS channel (gcs_pb2.ActorTableData.ActorState).
ALIVE = 2
RESTARTING = 3
DEAD = 4



def gcs_address() -> str | None:
    """The address of the cluster's GCS this process is connected to, if known."""
    try:
        return str(_worker.global_worker.gcs_client.address)
    except Exception:  # noqa: BLE001 - Ray client mode or internals changed
        return None


async def subscribe(address: str) -> Any:
    """A subscriber to the GCS actor channel of the cluster at `address`, subscribed."""
    from ray._private.gcs_pubsub import GcsAioActorSubscriber

    subscriber = GcsAioActorSubscriber(address=address)
    await subscriber.subscribe()
    return subscriber


async def poll(subscriber: Any) -> list[tuple[bytes, int, int, str]]:
    """The next batch of actor state changes: (actor id, state, restart count, reason)."""
    messages = await subscriber.poll(batch_size=1000, timeout=None)
    return [(actor_id, int(data.state), int(data.num_restarts), _reason(data))
            for actor_id, data in messages]


async def actor_state(actor_id: bytes) -> tuple[int, int, str] | None:
    """The actor's current (state, restart count, reason) from the GCS, None if unknown."""
    client = _worker.global_worker.gcs_client
    infos = await client.async_get_all_actor_info(
        actor_id=ray.ActorID(actor_id), timeout=30
    )
    for data in infos.values():
        return int(data.state), int(data.num_restarts), _reason(data)
    return None


def locally_alive(actor_id: bytes) -> bool:
    """Whether this process's own core worker sees the actor alive. It learns of a restart's end
    from the GCS too, a little after the channel says so; until then it fails calls to the actor
    at once ("the actor is restarting"). True if this Ray cannot tell."""
    try:
        core_worker = _worker.global_worker.core_worker
        return int(core_worker.get_local_actor_state(ray.ActorID(actor_id))) == ALIVE
    except Exception:  # noqa: BLE001 - not the internals this was written for
        return True


def _reason(data: Any) -> str:
    try:
        context = data.death_cause.actor_died_error_context
        return str(context.error_message) if context.error_message else ""
    except AttributeError:
        return ""


def in_asyncio_actor() -> bool:
    """Whether this process is an actor that runs its calls on an asyncio event loop."""
    return bool(_worker.global_worker.core_worker.current_actor_is_asyncio())


def run_on_event_loop(coroutine: Coroutine[Any, Any, T], cls: type[Any]) -> T:
    """Run `coroutine` on the event loop of the asyncio actor (of class `cls`) this task runs in,
    from the task's own thread, as Ray runs an `async def` method: the task's fiber yields until
    it is done, so the actor's other calls go on meanwhile. What a function sent with
    `__ray_call__` (which Ray runs on the task's thread) needs in order to await."""
    raylet: Any = importlib.import_module("ray._raylet")
    descriptor = raylet.PythonFunctionDescriptor(cls.__module__, "__ray_call__", cls.__name__)
    result: T = _worker.global_worker.core_worker.run_async_func_or_coro_in_event_loop(
        coroutine, descriptor, "", is_actor_task=True)
    return result


def runs_calls_at_once(handle: Any) -> bool:
    """Whether the actor behind `handle` may run several calls at once (an asyncio actor, or
    one with max_concurrency > 1): Ray lets such actors run calls out of order, and only they
    drop a cancelled call cleanly. An in-order (synchronous) actor runs a call it holds anyway,
    and Ray 2.60 cancelling one not yet delivered leaves a gap in the actor's sequence numbers:
    it waits 30 s for the missing call, then fails every call queued behind it. False if this
    Ray cannot tell."""
    return bool(getattr(handle, "_ray_allow_out_of_order_execution", False))


def runs_groups_at_once(handle: Any) -> bool:
    """Whether a method of the actor's class runs in a concurrency group of its own
    (`@ray.method(concurrency_group=...)`): Ray runs its calls beside those of the default
    group, even on an actor that runs calls in order. Read from the class this process knows
    by the module and qualified name Ray recorded for it (the driver that made the actor has
    it); False where it knows no such class."""
    descriptor = getattr(handle, "_ray_actor_creation_function_descriptor", None)
    module_name = getattr(descriptor, "module_name", None)
    class_name = getattr(descriptor, "class_name", None)
    if not isinstance(module_name, str) or not isinstance(class_name, str):
        return False
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None) or ""
    module = sys.modules.get(module_name) or (  # a script's classes: Ray names it by its file
        main if os.path.splitext(os.path.basename(main_file))[0] == module_name else None)
    cls: Any = module
    for part in class_name.split("."):  # a qualified name: a class nested in another
        cls = getattr(cls, part, None)  # (one defined in a function cannot be found)
    metadata = getattr(cls, "__ray_metadata__", None)  # `@ray.remote`: the class Ray made
    cls = getattr(metadata, "modified_class", cls)
    if not isinstance(cls, type):
        return False
    return any(getattr(getattr(cls, name, None), "__ray_concurrency_group__", None) is not None
               for name in method_names(handle) if not name.startswith("__"))


def actor_id(handle: Any) -> bytes:
    """The binary id of an actor handle, as the GCS channel names it."""
    return bytes(handle._actor_id.binary())


def method_names(handle: Any) -> list[str]:
    """The methods an actor handle can call, from Ray's record of its class."""
    return list(getattr(handle, "_ray_method_signatures", {}))


def method_parameters(handle: Any, name: str) -> list[inspect.Parameter] | None:
    """The parameters of method `name` (without `self`) that Ray recorded for the actor behind
    `handle` and checks a call's arguments against; None if it recorded none."""
    signatures = getattr(handle, "_ray_method_signatures", None)
    parameters = signatures.get(name) if isinstance(signatures, dict) else None
    if not isinstance(parameters, list) or \
            not all(isinstance(p, inspect.Parameter) for p in parameters):
        return None
    return parameters


def class_name(handle: Any) -> str:
    descriptor = getattr(handle, "_ray_actor_creation_function_descriptor", None)
    return str(getattr(descriptor, "class_name", "") or type(handle).__name__)


# Ray's internal key-value store (in the GCS): where a named mesh is published for other drivers.
_KV_NAMESPACE = "actormesh"


def kv_put(key: str, value: bytes) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=_KV_NAMESPACE)


def kv_get(key: str) -> bytes | None:
    from ray.experimental import internal_kv

    value: bytes | None = internal_kv._internal_kv_get(key, namespace=_KV_NAMESPACE)
    return value


def kv_del(key: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=_KV_NAMESPACE)


def namespace() -> str:
    """The Ray namespace of this driver (named actors and meshes live in one)."""
    return str(ray.get_runtime_context().namespace)

def stream_refs(generator: Any, count: int) -> list[Any]:
    """The ObjectRefs of the first `count` items a streaming task will report, known before it
    reports them (`ObjectRefGenerator._get_next_ref_n`): a callback on each fires as its item
    arrives, and with the task's error for an item it never reported."""
    refs: list[Any] = generator._get_next_ref_n(count)
    return refs


# Ray options of an actor method (set with `@ray.method(...)`, or for every method with the
# actor's own `max_task_retries`) under which a call must be the method's own Ray task: Ray
# retries, streams or splits what that task returns.
def methods_with_options(handle: Any) -> set[str]:
    """The methods of the actor behind `handle` whose Ray options a task of several calls would
    drop: retries (the method's, or the actor's default for its methods), exceptions retried,
    several or streamed returns."""
    alone: set[str] = set()
    actor_retries = getattr(handle, "_ray_max_task_retries", 0)
    if actor_retries:  # every method retries unless its own option says otherwise
        own = getattr(handle, "_ray_method_max_task_retries", None)
        own = own if isinstance(own, dict) else {}
        alone.update(name for name in method_names(handle)
                     if own.get(name, actor_retries) not in (None, 0))
    for table, default in (("_ray_method_max_task_retries", (None, 0)),
                           ("_ray_method_retry_exceptions", (None, False)),
                           ("_ray_method_num_returns", (None, 1)),
                           ("_ray_method_is_generator", (None, False))):
        options = getattr(handle, table, None)
        for name, value in (options.items() if isinstance(options, dict) else ()):
            if value not in default:
                alone.add(name)
    return alone


def methods_without_returns(handle: Any) -> set[str]:
    """The methods of the actor behind `handle` made with `@ray.method(num_returns=0)`: their
    calls return no ObjectRef, so nothing tells when one ends."""
    returns = getattr(handle, "_ray_method_num_returns", None)
    return {name for name, n in (returns.items() if isinstance(returns, dict) else ())
            if n == 0}
