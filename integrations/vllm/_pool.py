"""`EnginePool`: vLLM engines on an `ActorMesh`, with interruptible generation and weight updates.

How a request travels:

    pool.generate(prompt)            validate, then hand a task to the pool's event-loop thread
      -> _run                        wait while the pool is paused (the gate), then
         mesh.methods.generate       .options(affinity=session).choose([sub-request])
           .choose(...)              the native balancer counts it until the engine answers
      <- [Piece]                     finished: done.  Cut by an abort-pause: back to the gate,
                                     then resent to the same engine with the tokens so far.
                                     Engine died: resent from what the pool has, via choose.

Every piece of pool state (the gate, the pause mode, calls out, kept weights) is touched on the
pool's loop thread only; control operations (pause, resume, update, restore) run there one at a
time under one lock. Callers on any thread get a `PoolFuture`: `.get(timeout)` or `await`.
Cancelling one cancels its request down to the engine, which aborts it.

A weight update is a transaction (`_updates`): its version is a fresh ticket; the engines pause
("keep"), load, and generation resumes only once every live engine serves the same weights: the
new ones, or, if any engine failed, the ones they all served before (engines that loaded are
rolled back; one that cannot be is restarted, and restored as it comes back). Every update
takes that one path (`_transact`), whoever brings the weights: `update_weights` (a blob in the
object store, packed on the driver or, for an ObjectRef, by a task where the weights are) or a
`WeightSender` (streamed from the sender's process over a collective group; see `_sender`). The
version is committed, and reported, as soon as every engine serves it and the pool holds a copy
of the weights (in the object store), before generation resumes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Hashable, Iterable, Mapping
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from typing_extensions import Unpack

import actormesh as am
from actormesh._balancer import BalancerSpec

from .._checks import check_int, check_optional_int, seconds
from .._options import ActorOptions
from . import _updates, _weights
from ._protocol import (
    PAUSE_MODES,
    Blob,
    Engine,
    EngineStats,
    PauseMode,
    Piece,
    SubRequest,
    WeightSpec,
)
from ._requests import Generation, Sequence, check_prompt, check_sampling, group
from ._sender import (
    DEFAULT_BUCKET_BYTES,
    Go,
    Held,
    Place,
    SendRequest,
    Sent,
    WeightPort,
    WeightSender,
    check_backend,
    place,
)
from ._transfer import Formation
from ._updates import EngineUpdate, WeightUpdate, WeightUpdateError

log = logging.getLogger("actormesh.vllm")

R = TypeVar("R")
P = ParamSpec("P")

DIM = "engine"
"""The one dim of a pool's mesh."""

_POLL_S = 5.0
"""How long the pool's loop waits for a send request before it asks the port again."""
_SETTLE_S = 30.0
"""How long a blocking call waits beyond the operation's own timeout."""


class MeshOptions(ActorOptions, total=False):
    """The `ActorMesh` options a pool passes through to its engine actors."""

    max_restarts: int


class PoolFuture(Generic[R]):
    """The pending result of a pool operation: `.get(timeout=None)`, `await`, `.done()`,
    `.cancel()`. Cancelling a request (or the task that awaits it, as `asyncio.wait_for` does
    when it times out) cancels it down to its engine, which aborts it.

    Done-callbacks run on the pool's loop thread: keep them short.
    """

    __slots__ = ("_future", "_label")

    def __init__(self, future: cf.Future[R], label: str) -> None:
        self._future = future
        self._label = label

    def get(self, timeout: float | None = None) -> R:
        """Wait for the result; raise its error, or `TimeoutError` after `timeout` s."""
        try:
            return self._future.result(timeout)
        except cf.TimeoutError:
            if self._future.done():
                raise
            raise TimeoutError(f"{self._label} did not finish within {timeout} s") from None

    def __await__(self) -> Generator[Any, None, R]:
        return asyncio.wrap_future(self._future).__await__()

    def done(self) -> bool:
        return self._future.done()

    def add_done_callback(self, fn: Callable[[PoolFuture[R]], object]) -> None:
        self._future.add_done_callback(lambda _: fn(self))

    def cancel(self) -> bool:
        """Cancel the operation: the caller gets `CancelledError`, and a request already at an
        engine is aborted there. False if it had finished."""
        return self._future.cancel()

    def __repr__(self) -> str:
        return f"PoolFuture({self._label}, {'done' if self.done() else 'pending'})"


class PoolStats(TypedDict):
    """`pool.stats()`: the pool's counters and each engine's `EngineStats`. `held`: requests
    waiting for `resume`; `interruptions`: cuts with tokens that were resent; `failovers`:
    resends after an engine died."""

    weight_version: int
    paused: PauseMode | None
    held: int
    requests_done: int
    interruptions: int
    failovers: int
    engines: list[EngineStats]
    weight_update: WeightUpdate | None  # the last update's report, per engine


class EnginePool:
    """`num_engines` engine actors (vLLM's `AsyncLLM` by default) on an `ActorMesh` with dim
    `"engine"`, serving token-id requests through the mesh's balancer.

    `engine_args` go to the engine (for vLLM, `AsyncEngineArgs` fields; the pool sets a small
    KV cache and the environment vLLM needs on the CPU unless you do). `mesh_options` go to the
    `ActorMesh` (`num_cpus`, `max_restarts`, `runtime_env`, ...). `timeout_s` bounds every
    control operation (pause, resume, weight update, stats); `max_failovers` is how many times
    one request may be resent after engine deaths before its caller gets the error.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        num_engines: int = 1,
        *,
        engine_args: Mapping[str, Any] | None = None,
        balancer: BalancerSpec = "least_loaded",
        engine_cls: type[Engine] | None = None,
        timeout_s: float = 300.0,
        max_failovers: int = 3,
        **mesh_options: Unpack[MeshOptions],
    ) -> None:
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model={model!r}: must be a path or a model name")
        model = os.fspath(model)
        num_engines = check_int("num_engines", num_engines, 1)
        if engine_args is not None and not isinstance(engine_args, Mapping):
            raise TypeError(f"engine_args={engine_args!r}: must be a mapping")
        args = dict(engine_args or {})
        if engine_cls is None:
            from ._engine import VllmEngine

            engine_cls = VllmEngine
        if not (isinstance(engine_cls, type) and issubclass(engine_cls, Engine)):
            raise TypeError(f"engine_cls={engine_cls!r}: must be a subclass of Engine")
        timeout_s = seconds("timeout_s", timeout_s)
        max_failovers = check_int("max_failovers", max_failovers, 0)
        for key in ("args", "kwargs", "on_restart", "shape"):
            if key in mesh_options:
                raise TypeError(f"EnginePool sets {key!r} of its mesh itself")
        engine_cls.check_args(model, args)
        options: dict[str, Any] = _merge_options(engine_cls.mesh_defaults(), dict(mesh_options))

        self.model = model
        self.weight_version = 0
        self._timeout_s = timeout_s
        self._max_failovers = max_failovers
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="actormesh-vllm-pool", daemon=True)
        self._thread.start()
        self._pending: set[cf.Future[Any]] = set()
        self._ids = itertools.count()
        # Loop-thread state.
        self._open = asyncio.Event()  # set while not paused: the gate every send passes
        self._open.set()
        self._paused: PauseMode | None = None
        self._control = asyncio.Lock()
        self._out = 0  # generate calls sent and not yet answered
        self._idle = asyncio.Event()
        self._idle.set()
        self._held = 0
        self._done = 0
        self._interruptions = 0
        self._failovers = 0
        self._spec: WeightSpec | None = None
        # The weights every engine serves, where not the checkpoint's: name -> (sequence, ref
        # of a safetensors blob holding it, or a bucket the port holds), never on the driver.
        self._kept: dict[str, tuple[int, ray.ObjectRef[bytes] | Held]] = {}
        self._kept_sequence = itertools.count()
        self._checkpoint: dict[str, Any] = {}  # checkpoint tensors read so far
        self._pool_id = uuid.uuid4().hex[:12]
        self._port: Any = None  # the WeightPort, once a sender was made
        self._port_node = ""  # the port's Ray node
        self._places: dict[int, Place] = {}  # where each engine runs (asked once per process)
        self._serving: asyncio.Task[None] | None = None
        self._formation: tuple[Hashable, Formation] | None = None  # the senders' current group
        self._issued = 0  # the last weight version handed out (loaded or not): never again
        self._last_update: WeightUpdate | None = None
        self._restarts = options.get("max_restarts", 0) != 0
        self._stopped: set[int] = set()  # engines this pool killed, not restored since

        if options.get("max_restarts", 0) != 0:
            options["on_restart"] = self._on_restart
        try:
            self.mesh: am.ActorMesh[Engine] = am.ActorMesh(
                engine_cls, {DIM: num_engines}, args=(model, args), balancer=balancer, **options,
            )
        except BaseException:
            self._stop_loop()
            raise
        self._engines = [self.mesh[i] for i in range(num_engines)]

    # -- requests ---------------------------------------------------------------------------
    def generate(
        self,
        prompt_token_ids: list[int],
        sampling: Mapping[str, Any] | None = None,
        *,
        session: Hashable | None = None,
    ) -> PoolFuture[Generation]:
        """Generate from a prompt of token ids on the least loaded engine (or the session's).

        `sampling` maps vLLM `SamplingParams` fields (`max_tokens`, `temperature`, `seed`,
        `stop_token_ids`, `ignore_eos`, ...). Interruptions (pauses, aborts, engine deaths) are
        invisible to the caller: with greedy sampling the result is the uninterrupted one.
        """
        seq = Sequence(check_prompt(prompt_token_ids), check_sampling(sampling))
        if session is not None:
            hash(session)

        async def one() -> Generation:
            await self._run([seq], session)
            return seq.result()

        return self._submit(one(), "generate")

    def generate_group(
        self,
        prompt_token_ids: list[int],
        sampling: Mapping[str, Any] | None = None,
        *,
        n: int,
    ) -> PoolFuture[list[Generation]]:
        """`n` samples of one prompt on one engine (they share the prompt's prefix cache); with
        a `seed`, sample i uses seed + i."""
        n = check_int("n", n, 1)
        samples = group(check_prompt(prompt_token_ids), check_sampling(sampling), n)

        async def run() -> list[Generation]:
            await self._run(samples, None)
            return [s.result() for s in samples]

        return self._submit(run(), "generate_group")

    async def _run(self, seqs: list[Sequence], session: Hashable | None) -> None:
        """Send the unfinished sequences until every one is done (on the loop thread)."""
        key = str(next(self._ids))
        engine: int | None = None
        attempt = failovers = 0
        while True:
            todo = [s for s in seqs if not s.done]
            if not todo:
                self._done += 1
                return
            if not self._open.is_set():
                self._held += 1
                try:
                    while not self._open.is_set():  # a pause may close the gate again first
                        await self._open.wait()
                finally:
                    self._held -= 1
            self._check_open()
            requests = [s.request(f"{key}.{i}.{attempt}") for i, s in enumerate(todo)]
            attempt += 1
            future = self._send(requests, session, engine)
            self._out += 1
            self._idle.clear()
            try:
                pieces: list[Piece] = await future
            except asyncio.CancelledError:  # the caller cancelled: the engine aborts the request
                future.cancel()
                raise
            except (am.ActorDiedError, am.NoLiveActorsError) as err:
                self._check_open()
                if isinstance(err, am.NoLiveActorsError) and engine is None:
                    raise
                if isinstance(err, am.ActorDiedError):
                    failovers += 1
                    if failovers > self._max_failovers:
                        raise
                    self._failovers += 1
                    for s in todo:
                        s.lost()
                    log.warning("request %s: %s; resending it (failover %d)", key, err, failovers)
                engine = None
                continue
            finally:
                self._out -= 1
                if self._out == 0:
                    self._idle.set()
            for s, piece in zip(todo, pieces):
                before = s.interruptions
                s.add(piece)
                self._interruptions += s.interruptions - before
            engine = pieces[0].engine

    def _send(self, requests: list[SubRequest], session: Hashable | None,
              engine: int | None) -> am.MeshFuture[list[Piece]]:
        """One `choose`: on `engine` (a resend after a cut, while it lives), else by the
        balancer, sticky to `session`."""
        if engine is not None and self.mesh.load().alive[engine]:
            return self._engines[engine].methods.generate.choose(requests)
        method = self.mesh.methods.generate
        if session is not None:
            method = method.options(affinity=session)
        return method.choose(requests)

    # -- pausing ----------------------------------------------------------------------------
    def pause(self, mode: PauseMode = "keep", *, timeout: float | None = None) -> PoolFuture[None]:
        """Stop generation: `await pool.pause("keep" | "abort" | "wait")`.

        New requests (and resends) are held by the pool from this call on, before any engine
        pauses. `"keep"`: requests freeze inside the engines. `"abort"`: requests are cut and
        resent after `resume`, each to the same engine with its tokens so far. `"wait"`:
        requests already sent finish first. Pausing a paused pool does nothing, except that
        `"abort"` cuts what a `"keep"` pause froze. On a timeout the pool stays paused.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode={mode!r}: must be one of {PAUSE_MODES}")
        return self._controlled(f"pause({mode})", self._pause, mode, self._limit(timeout))

    def resume(self, *, timeout: float | None = None) -> PoolFuture[None]:
        """Let the engines generate again and release the requests the pool held."""
        return self._controlled("resume", self._resume, self._limit(timeout))

    async def _pause(self, mode: PauseMode, timeout: float) -> None:
        if self._paused is not None and mode != "abort":
            return
        self._open.clear()
        self._paused = mode
        if mode == "wait":
            await asyncio.wait_for(self._idle.wait(), timeout)
        await self._all("pause", timeout, mode)

    async def _resume(self, timeout: float) -> None:
        if self._paused is None:
            return
        await self._all("resume", timeout)
        self._paused = None
        self._open.set()

    async def _all(self, method: str, timeout: float, *args: Any) -> list[Any]:
        """Call `method` on every live engine; engines that died, or are restarting, are
        skipped (a restarted one is brought to the pool's state by `restore`, which runs after
        this control operation: waiting here for its restart would only spend the timeout),
        any other error raises."""
        values = await self._on_engines(self._live(), method, timeout, *args)
        out = []
        for value in values:
            if isinstance(value, (am.ActorDiedError, am.NoLiveActorsError)):
                log.warning("%s skipped a dead engine: %s", method, value)
            elif isinstance(value, BaseException):
                raise value
            else:
                out.append(value)
        return out

    # -- weights ----------------------------------------------------------------------------
    def update_weights(
        self,
        weights: Mapping[str, Any] | ray.ObjectRef[Any],
        *,
        version: int | None = None,
        timeout: float | None = None,
    ) -> PoolFuture[int]:
        """Load new weights into every engine: `await pool.update_weights({name: tensor})`.

        `weights` maps checkpoint names (as in the model's safetensors files) to arrays or
        tensors, or ObjectRefs of them (or is an ObjectRef of such a mapping). Every name and
        shape is checked before any engine loads anything; a partial update is completed from
        the current weights. While generating, the pool pauses (`"keep"`), loads, and resumes:
        later tokens carry the new version. Returns it: `version` (the caller's own numbering,
        e.g. a trainer's step), or by default the next ticket, one more than any version the
        pool has handed out. A number never names two weight sets: a given `version` must be
        newer than the weights the engines serve (`weight_version`, 0 for the weights they
        started with), else `ValueError` before anything is loaded.

        All or nothing: if an engine fails to load (or times out), the update is undone before
        generation resumes (every engine serves the weights it served before, with their
        version) and `WeightUpdateError` says what happened on each engine; so does
        `stats()["weight_update"]`. No token ever carried its version; the pool never hands
        that number out again (a caller may give it again, for other weights). An ObjectRef is
        read, checked and packed by a Ray task, never on the driver. From a trainer's process,
        `weight_sender()` sends without the object store.
        """
        if not isinstance(weights, (Mapping, ray.ObjectRef)):
            raise TypeError(f"weights: must be a mapping of name to tensor or an ObjectRef, "
                            f"got {type(weights).__name__}")
        version = check_optional_int("version", version, 0)
        return self._controlled("update_weights", self._update, weights, version,
                                self._limit(timeout))

    def weight_sender(self, *, backend: str | None = None,
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightSender:
        """A picklable `WeightSender`: inside any Ray actor (a trainer's rank 0),
        `sender.send(named_tensors)` streams the tensors over one collective group from that
        process to every engine worker, never through the driver, and returns the version
        every engine then serves. `backend`: `"gloo"` (CPU tensors), `"nccl"` (CUDA tensors,
        engines on GPUs), `"ipc"` (every engine on the sender's host: the engines map the
        buckets' memory), or None to pick (ipc where it can, else by the tensors' device).
        `bucket_bytes` bounds the tensor bytes in flight (one bucket at a time)."""
        backend = check_backend(backend)
        bucket_bytes = check_int("bucket_bytes", bucket_bytes, 1)
        limit = self._timeout_s + _SETTLE_S
        spec = self._submit(self._weight_spec(self._timeout_s), "weight_sender").get(limit)
        port = self._submit(self._open_port(), "weight_sender").get(limit)
        places = self._submit(self._engine_places(self._live(), self._timeout_s),
                              "weight_sender").get(limit)
        return WeightSender(port, self._pool_id, spec, backend, bucket_bytes, self._timeout_s,
                            list(places.values()))

    async def _engine_places(self, ranks: list[int], timeout: float) -> dict[int, Place]:
        """Where the engines of `ranks` run (each asked once per process)."""
        for rank in ranks:
            if rank not in self._places:
                asked = self.mesh[rank].run_in_actors(place)

                async def answer(asked: Any = asked) -> Any:
                    return list(await asked)[0]

                self._places[rank] = await asyncio.wait_for(answer(), timeout)
        return {rank: self._places[rank] for rank in ranks}

    async def _weight_spec(self, timeout: float) -> WeightSpec:
        if self._spec is None:
            self._spec = await self.mesh.methods.weight_spec.options(timeout=timeout).choose()
        return self._spec

    async def _current(self, names: set[str], timeout: float) -> dict[str, Any]:
        """What every engine serves for `names`: from the copies the pool keeps, else the
        checkpoint's (read from an engine once, and cached). Read on the driver: for the
        members that complete a partial update, and to undo a failed one."""
        out: dict[str, Any] = {}
        by_copy: dict[ray.ObjectRef[bytes] | Held, list[str]] = {}
        for name in sorted(names & set(self._kept)):
            by_copy.setdefault(self._kept[name][1], []).append(name)
        for kept, wanted in by_copy.items():
            tensors = _weights.unpack(await (await self._blob(kept)))
            out.update({n: tensors[n] for n in wanted})
        unread = sorted(names - set(self._kept) - set(self._checkpoint))
        if unread:
            blob = await self.mesh.methods.read_weights.options(timeout=timeout).choose(unread)
            self._checkpoint.update(_weights.unpack(blob))
        out.update({n: self._checkpoint[n] for n in names - set(self._kept)})
        return out

    async def _blob(self, kept: ray.ObjectRef[bytes] | Held) -> ray.ObjectRef[bytes]:
        """A kept blob as an ObjectRef (the port puts a bucket it holds)."""
        if not isinstance(kept, Held):
            return kept
        refs: list[ray.ObjectRef[bytes]] = await self._port.blob.remote(kept.key)
        return refs[0]

    async def _completion(self, names: set[str], spec: WeightSpec,
                          timeout: float) -> tuple[set[str], ray.ObjectRef[bytes] | None]:
        """The other members of the modules `names` touch, and a blob of their current values
        (None if the modules are whole)."""
        missing = _weights.missing_members(names, spec)
        if not missing:
            return missing, None
        current = await self._current(missing, timeout)
        return missing, await asyncio.to_thread(_pack_and_put, current, spec)

    def _ticket(self, version: int | None) -> int:
        """The version of a new update: `version`, if newer than the weights served, else the
        next number never handed out."""
        if version is not None and version <= self.weight_version:
            raise ValueError(
                f"version={version}: the engines serve weights version {self.weight_version}; "
                "a version must be newer, so that no number names two weight sets (pass no "
                "version to let the pool number the update)")
        ticket = self._issued + 1 if version is None else version
        self._issued = max(self._issued, ticket)
        return ticket

    async def _update(self, weights: Mapping[str, Any] | ray.ObjectRef[Any],
                      version: int | None, timeout: float) -> int:
        """`update_weights` on the loop: stage the blob, then the one load/commit path."""
        spec = await self._weight_spec(timeout)
        names, ref = await _stage(weights, spec)
        missing, extra = await self._completion(names, spec, timeout)
        ticket = self._ticket(version)
        blobs: list[Blob] = [ref] if extra is None else [extra, ref]

        async def load(ranks: list[int]) -> list[Any]:
            return await self._on_engines(ranks, "load_weights", timeout, ticket, blobs)

        async def keep() -> dict[str, Any]:
            return {**dict.fromkeys(missing, extra), **dict.fromkeys(names, ref)}

        try:
            return await self._transact(ticket, names | missing, load, keep, spec, timeout)
        finally:
            await self._let_go()

    def _held_keys(self) -> list[str]:
        """The keys of the buckets the port holds for the pool (those it keeps)."""
        return [k.key for _, k in self._kept.values() if isinstance(k, Held)]

    async def _let_go(self) -> None:
        """Have the port hold only the buckets the pool keeps (not those an update replaced)."""
        if self._port is None:
            return
        try:
            await self._port.retain.remote(self._held_keys())
        except Exception as err:  # noqa: BLE001 - the port is gone: the pool is closing
            log.warning("the weight port could not let go of replaced weights: %s", err)

    async def _open_port(self) -> Any:
        """The pool's `WeightPort`, started (with the task that serves it) on first use."""
        if self._port is None:
            self._port = ray.remote(WeightPort).options(
                num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=True),
            ).remote()
            self._port_node = await self._port.node.remote()
            self._serving = asyncio.get_running_loop().create_task(self._serve(self._port))
        return self._port

    async def _serve(self, port: Any) -> None:
        """Take the senders' requests from the port, one at a time, each as a control
        operation (under the control lock, like `update_weights`)."""
        while not self._closed:
            try:
                request: SendRequest | None = await port.take.remote(_POLL_S)
            except Exception as err:  # noqa: BLE001 - the port is gone: the pool is closing
                if not self._closed:
                    log.error("the weight port failed: %s", err)
                return
            if request is None:
                continue
            async with self._control:
                outcome: int | BaseException
                try:
                    outcome = await self._receive(port, request)
                except Exception as err:  # noqa: BLE001 - the sender gets it
                    outcome = err
                try:  # the port lets go of what the pool does not keep (a failed send's)
                    await port.finish.remote(request.id, outcome, self._held_keys())
                except Exception as err:  # noqa: BLE001 - the port is gone: the pool is closing
                    log.warning("telling a sender how its send ended failed: %s", err)

    async def _receive(self, port: Any, request: SendRequest) -> int:
        """A sender's update, on the loop under the control lock: the one load/commit path,
        loading what the sender streams to the engines over its group. (`_serve` has the port
        let go of what the pool does not keep as it ends the send: `WeightPort.finish`.)"""
        timeout = request.timeout_s
        members = tuple(self._live())
        if not members:
            raise am.MeshError("no live engine to send weights to")
        if request.backend == "ipc":  # checked again here: an engine may have moved since
            places = await self._engine_places(list(members), timeout)
            away = [f"engine {r} on node {p.node[:12]}" for r, p in places.items()
                    if p.node != request.node]
            if away:
                raise ValueError(f"backend 'ipc' shares memory within one host, and {away} "
                                 f"not on the sender's node {request.node[:12]}")
        spec = await self._weight_spec(timeout)
        names = set(request.names)
        missing, extra = await self._completion(names, spec, timeout)
        ticket = self._ticket(request.version)
        # The send's timeout is part of the group's key: a torch group's timeout is fixed when
        # it forms, and it is what bounds a member stuck in the group (joining it, or in a
        # broadcast) when the send fails: the sender's own `send` call, an engine's receive
        # thread, the port's. Formed with a longer one (the pool's), a send with timeout=2
        # that an engine never joins would hold its sender, and those threads, for that long;
        # gloo has no deadline for a join other than the group's timeout. So a send with
        # another timeout forms a group of its own (milliseconds; a trainer sends with one).
        # An ipc channel serves one send (its keys are the send's), so each forms its own. The
        # port keeps the buckets where it can receive them: over gloo, and over ipc of CPU
        # tensors on its own host; else the sender puts copies.
        key = (request.host, request.port, request.backend, timeout, members,
               request.id if request.backend == "ipc" else "")
        keeper = request.backend == "gloo" or (request.backend == "ipc" and request.device
                                               == "cpu" and request.node == self._port_node)
        if self._formation is None or self._formation[0] != key:
            self._formation = (key, Formation(uuid.uuid4().hex[:12], request.host, request.port,
                                              members, request.backend, timeout, keeper))
        formation = self._formation[1]
        keeping: list[Any] = []  # the port's receive, where it keeps the weights

        async def load(ranks: list[int]) -> list[Any]:
            if formation.keeper:
                keeping.append(port.keep.remote(request.id, formation))
            await port.go.remote(request.id, Go(formation, ticket))
            return await self._on_engines(ranks, "receive_weights", timeout, formation,
                                          [] if extra is None else [extra], ticket)

        async def keep() -> dict[str, Any]:
            sent: Sent | None = await port.wait_sent.remote(request.id, timeout)
            if sent is None:
                raise TimeoutError(f"the sender did not report within {timeout} s")
            if sent.error:
                raise RuntimeError(f"the sender failed: {sent.error}")
            copies: dict[str, ray.ObjectRef[bytes] | Held] = {
                name: ref for names_in, ref in sent.copies for name in names_in}
            if keeping:
                held = await asyncio.wait_for(keeping[0], timeout)
                copies = {name: Held(key) for key, names_in in held for name in names_in}
            return {**dict.fromkeys(missing, extra), **copies}

        try:
            return await self._transact(ticket, names | missing, load, keep, spec, timeout)
        except BaseException:
            self._formation = None  # the engines dropped a group a transfer failed on
            raise

    async def _transact(self, ticket: int, names: set[str],
                        load: Callable[[list[int]], Coroutine[Any, Any, list[Any]]],
                        keep: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
                        spec: WeightSpec, timeout: float) -> int:
        """The one load/commit path of every weight update: pause ("keep") unless paused,
        `load` on every live engine, then commit (the engines all loaded and `keep` gave the
        blobs the pool keeps, whole modules: what restores a restarted engine) or undo, then
        resume. The commit is recorded before resuming:
        a version every engine serves stays committed, whatever fails after."""
        was_paused = self._paused is not None
        started = time.perf_counter()
        if not was_paused:
            await self._pause("keep", timeout)
        quiet = time.perf_counter()
        try:
            ranks = self._live()
            values = dict(zip(ranks, await load(ranks)))
            engines = [_updates.outcome(r, values[r]) if r in values
                       else EngineUpdate(r, "dead", "dead or restarting when the update began")
                       for r in range(self.mesh.size)]
            committed, problem, kept = _updates.landed(engines), "", {}
            if committed:
                try:
                    kept = await keep()
                except Exception as err:  # noqa: BLE001 - no copy to keep: undo
                    committed, problem = False, str(err)
            loaded = time.perf_counter()
            if committed:
                sequence = next(self._kept_sequence)
                self._kept.update({name: (sequence, ref) for name, ref in kept.items()})
                self.weight_version = ticket
            else:
                engines = await self._undo(engines, names, spec, timeout)
            report = self._last_update = WeightUpdate(ticket, committed, tuple(engines), problem,
                                                      quiet - started, loaded - quiet)
        finally:
            if not was_paused:
                await self._resume(timeout)
        if not committed:
            log.error("%s; undone", report)
            raise WeightUpdateError(report, self.weight_version)
        log.info("weights version %d loaded (%d tensors)", ticket, len(names))
        return ticket

    async def _undo(self, engines: list[EngineUpdate], names: set[str], spec: WeightSpec,
                    timeout: float) -> list[EngineUpdate]:
        """Bring every engine that loaded (or tried to) back to the weights all engines served
        before; restart those that cannot be (a load that timed out may still land)."""
        again = [e.rank for e in engines if e.outcome in ("loaded", "failed")]
        restart = {e.rank for e in engines if e.outcome == "timed out"}
        restored: dict[int, _updates.Restored] = {}
        try:
            previous = await self._current(names, timeout)
            ref = await asyncio.to_thread(_pack_and_put, previous, spec)
            values = await self._on_engines(again, "load_weights", timeout, self.weight_version,
                                            [ref])
        except Exception as err:  # noqa: BLE001 - the previous weights cannot be had: restart
            log.error("rolling back a weight update failed (%s); restarting the engines", err)
            values = [err] * len(again)
        for rank, value in zip(again, values):
            if isinstance(value, (am.ActorDiedError, am.NoLiveActorsError)):
                continue  # it restarts with the pool's weights anyway
            if isinstance(value, BaseException):
                restart.add(rank)
            else:
                restored[rank] = "rolled back"
        for rank in sorted(restart):
            restored[rank] = self._restart(rank)
        return [dataclasses.replace(e, restored=restored.get(e.rank, "")) for e in engines]

    def _restart(self, rank: int) -> _updates.Restored:
        """Kill an engine whose weights are unknown: with restarts it comes back and is restored
        with the pool's weights before it serves; without, it is gone for good."""
        self._stopped.add(rank)
        try:
            ray.kill(self.mesh.actors[rank], no_restart=not self._restarts)
        except Exception as err:  # noqa: BLE001 - already gone
            log.warning("stopping engine %d failed: %s", rank, err)
        log.warning("engine %d %s: its weights may differ from the others'", rank,
                    "restarted" if self._restarts else "stopped for good")
        return "restarted" if self._restarts else "removed"

    async def _on_engines(self, ranks: Iterable[int], method: str, timeout: float,
                          *args: Any) -> list[Any]:
        """`method(*args)` sent to each engine of `ranks` (restarting or not): its value, or
        the error it ended with."""
        futures = [getattr(self._engines[rank].methods, method)
                   .options(return_exceptions=True, timeout=timeout).all(*args)
                   for rank in ranks]
        return [list(await f)[0] for f in futures]

    def _live(self) -> list[int]:
        """The engines alive now, but those the pool has just killed (a kill is seen a moment
        later: hence `_stopped`)."""
        alive = self.mesh.load().alive
        return [r for r in range(self.mesh.size) if alive[r] and r not in self._stopped]

    def _on_restart(self, view: am.ActorMesh[Engine]) -> None:
        """A restarted engine answers again: have the loop restore it (it holds requests until
        then). Returns at once, whatever thread the mesh calls it on."""
        if not self._closed:
            asyncio.run_coroutine_threadsafe(self._restore(view), self._loop).add_done_callback(
                _log_failure(f"restoring engine {view.points[0].rank}"))

    async def _restore(self, view: am.ActorMesh[Engine]) -> None:
        async with self._control:
            self._stopped.discard(view.points[0].rank)
            self._formation = None  # the new process is in no sender's group
            self._places.pop(view.points[0].rank, None)  # and may run elsewhere
            copies = {kept: sequence for sequence, kept in self._kept.values()}
            blobs: list[Blob] = [await self._blob(kept)
                                 for kept in sorted(copies, key=copies.__getitem__)]
            # (oldest first: a newer blob's value of a name wins)
            await view.methods.restore.options(timeout=self._timeout_s).all(
                self.weight_version, self._paused, blobs)
            log.info("engine %d restarted and restored (weights version %d)",
                     view.points[0].rank, self.weight_version)

    # -- state and lifetime -----------------------------------------------------------------
    def stats(self, *, timeout: float | None = None) -> PoolStats:
        """The pool's counters and, per engine, requests outstanding (from the balancer) and
        what the engine reports (running, waiting, prefix-cache hits, ...). Blocks; not for
        a done-callback (those run on the pool's loop thread)."""
        limit = self._limit(timeout)
        loads = self.mesh.load()
        replies = list(self.mesh.methods.stats.options(return_exceptions=True, timeout=limit)
                       .all().get(limit))
        engines = []
        for rank, reply in enumerate(replies):
            base = reply if isinstance(reply, EngineStats) else EngineStats(rank)
            alive = loads.alive[rank] and isinstance(reply, EngineStats)
            engines.append(dataclasses.replace(base, alive=alive, outstanding=loads[rank]))

        async def counters() -> PoolStats:
            return PoolStats(weight_version=self.weight_version, paused=self._paused,
                             held=self._held, requests_done=self._done,
                             interruptions=self._interruptions, failovers=self._failovers,
                             engines=engines, weight_update=self._last_update)

        return self._submit(counters(), "stats").get(limit)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every engine has started (raises if one failed to)."""
        self.mesh.wait_ready(timeout=self._limit(timeout))

    def shutdown(self) -> None:
        """Stop the engines; requests not finished fail with `am.MeshError`."""
        if self._closed:
            return
        self._closed = True
        self.mesh.shutdown()
        if self._port is not None:
            try:
                ray.kill(self._port, no_restart=True)  # senders' copies go with it
            except Exception as err:  # noqa: BLE001 - gone with the cluster
                log.debug("stopping the weight port failed: %s", err)
        self._loop.call_soon_threadsafe(self._open.set)  # held requests wake up and fail
        if self._serving is not None:
            serving = self._serving

            async def stop_serving() -> None:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(stop_serving(), self._loop).result(timeout=30)
        pending = list(self._pending)
        done, _ = cf.wait(pending, timeout=30)
        for future in pending:
            if future not in done:
                future.cancel()
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> EnginePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.shutdown)

    def __repr__(self) -> str:
        return f"EnginePool({self.model!r}, {self.mesh.size} engines)"

    # -- helpers ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise am.MeshError("the engine pool is shut down")

    def _limit(self, timeout: float | None) -> float:
        if timeout is None:
            return self._timeout_s
        return seconds("timeout", timeout)

    def _controlled(self, label: str, fn: Callable[P, Coroutine[Any, Any, R]],
                    *args: P.args, **kwargs: P.kwargs) -> PoolFuture[R]:
        """`fn(*args, **kwargs)` on the loop thread, under the control lock (one control
        operation at a time)."""

        async def run() -> R:
            async with self._control:
                return await fn(*args, **kwargs)

        return self._submit(run(), label)

    def _submit(self, coro: Coroutine[Any, Any, R], label: str) -> PoolFuture[R]:
        if self._closed:
            coro.close()
            raise am.MeshError(f"{label}: the engine pool is shut down")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return PoolFuture(future, label)


def _pack_and_put(weights: Mapping[str, Any], spec: WeightSpec) -> ray.ObjectRef[bytes]:
    return ray.put(_weights.pack(weights, spec))  # once: every engine reads the same object


async def _stage(weights: Mapping[str, Any] | ray.ObjectRef[Any],
                 spec: WeightSpec) -> tuple[set[str], ray.ObjectRef[bytes]]:
    """The names of an update and an ObjectRef of its blob, names and shapes checked. Tensors
    the driver holds are packed here; an ObjectRef (of the mapping, or of its values) is read,
    checked and packed by a task where the weights are: never on the driver."""
    refs = isinstance(weights, ray.ObjectRef) or any(
        isinstance(v, ray.ObjectRef) for v in weights.values())
    if not refs:
        assert isinstance(weights, Mapping)
        _weights.check(weights, spec)
        return set(weights), await asyncio.to_thread(_pack_and_put, weights, spec)
    staged: Any = _stage_task.remote(weights, spec)
    names_ref, blob_ref = staged
    try:
        names: list[str] = await names_ref
    except RayTaskError as err:  # the check's own error, as the caller made it
        raise err.cause from None
    return set(names), blob_ref


def _stage_in_task(weights: Any, spec: WeightSpec) -> tuple[list[str], bytes]:
    """In a Ray task: resolve the weights (the mapping, its values), check and pack them."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights ObjectRef holds {type(weights).__name__}, not a mapping")
    tensors = {name: ray.get(value) if isinstance(value, ray.ObjectRef) else value
               for name, value in weights.items()}
    _weights.check(tensors, spec)
    return sorted(tensors), _weights.pack(tensors, spec)


_stage_task = ray.remote(num_cpus=0, num_returns=2, max_retries=0)(_stage_in_task)


def _merge_options(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The user's mesh options over the engine's defaults; `runtime_env` env_vars merged."""
    out = {**defaults, **given}
    default_env = defaults.get("runtime_env")
    if default_env is not None and given.get("runtime_env") is not None:
        env = {**default_env, **given["runtime_env"]}
        env["env_vars"] = {**default_env.get("env_vars", {}),
                           **given["runtime_env"].get("env_vars", {})}
        out["runtime_env"] = env
    return out


def _log_failure(what: str) -> Callable[[cf.Future[Any]], None]:
    def check(future: cf.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("%s failed: %s", what, future.exception())

    return check
