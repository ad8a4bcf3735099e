"""`WeightSender`: weights from a trainer's process straight to every engine worker.

```python
sender = pool.weight_sender()                  # on the driver; picklable
trainer[0].methods.push.all(sender)            # in the trainer's rank 0:
version = sender.send(model.state_dict())      #   returns once every engine serves them
```

A send streams buckets over one collective group between the sender's process and every engine
worker (`_transfer`), or, when every engine is on the sender's host, shares each bucket's memory
with them (`ipc`, `_shared`); the weights never pass through the driver. Which backend, when:
`choose_backend`. The pool on the driver keeps
the one load/commit path that `update_weights` takes (version ticket, pause "keep", load on every
engine, commit or undo, resume); the sender and the pool meet at the pool's `WeightPort`:

    sender (any process)            WeightPort (actor)             pool (driver, its loop)
    check names, shapes, devices
    submit(request) ─────────────▶  queue  ─────────────────────▶  ticket, pause ("keep")
    ◀───────────────────────────── go (formation) ◀─────────────── engines: receive_weights
    join the group, broadcast       keep: join, receive, hold      (join, receive, load)
    each bucket
    sent() ──────────────────────▶  ────────────────────────────▶  every engine loaded and the
    ◀───────────────────────────── the version, or the error ◀──── port holds the blobs:
                                                                   commit; else undo; resume

The port is the last rank of a gloo group (and of an ipc send of CPU tensors from its own host):
it receives the buckets with the engines and holds them in its own memory, the copy of the weights the pool keeps (a restarted engine is restored
from it, a partial update completed, a failed one undone); it puts a blob in the object store
only when one is asked for. Keeping costs no copy in the sender, no object-store space, and
outlives the sender. An nccl group has GPUs only (and a port elsewhere cannot map an ipc
bucket): there the sender puts a copy of each bucket, which a task of the port copies again so
that the port owns it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import ray

from .._checks import check_optional_int, seconds
from . import _shared, _transfer, _weights
from ._protocol import WeightSpec
from ._transfer import BACKENDS, Formation

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore

log = logging.getLogger("actormesh.vllm")

DEFAULT_BUCKET_BYTES = 32 * 2**20
"""Tensor bytes per bucket: what a send holds in flight beyond the model (see the README)."""

_ENDED_KEPT = 16
"""How many ended sends' outcomes a port keeps for a sender that reports after the end."""

_SETTLE_S = 30.0
"""How long a sender waits for the pool beyond the send's own deadline."""


@dataclasses.dataclass(frozen=True)
class SendRequest:
    """What a sender asks of the pool: load these tensors (streamed from `host:port`'s group)."""

    id: str
    host: str  # the sender's store: its process, so a new process forms a new group
    port: int
    backend: str
    node: str  # the sender's Ray node (ipc: every engine must be on it)
    device: str  # "cpu" or "cuda": where the buckets are
    names: tuple[str, ...]
    version: int | None
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class Go:
    """The pool's answer: the engines are paused and joining `formation`; stream."""

    formation: Formation
    version: int


@dataclasses.dataclass(frozen=True)
class Sent:
    """What the sender reports once its stream ended: the copies it put (nccl), or what
    failed."""

    copies: tuple[tuple[tuple[str, ...], ray.ObjectRef[bytes]], ...] = ()
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Held:
    """A bucket the pool's port holds in its memory (`key`): kept weights, like an ObjectRef
    of a blob; `WeightPort.blob` puts it in the object store when it is needed."""

    key: str


_KEEPER = "keeper"
"""The role of the port's group in `_transfer`."""


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a process runs: its Ray node, and the GPUs Ray gave it (ids as Ray names them)."""

    node: str
    gpus: tuple[str, ...] = ()


def place(_: Any = None) -> Place:
    """This process's place (`mesh.run_in_actors(place)` asks an engine for its own)."""
    context = ray.get_runtime_context()
    return Place(context.get_node_id(),
                 tuple(str(g) for g in context.get_accelerator_ids().get("GPU", ())))


def choose_backend(asked: str | None, tensors: list[tuple[str, Any]], here: Place,
                   engines: list[Place]) -> str:
    """The backend a send takes, or a ValueError naming what rules the asked one out.

    None picks `ipc` when every engine is on the sender's host and can map the tensors' memory
    (CPU tensors; CUDA tensors only where Ray gave every engine the sender's GPU): each byte is
    then written once, into memory the engines read, instead of once per receiver through a
    socket. Otherwise `nccl` for CUDA tensors and `gloo` for CPU tensors. `here.gpus` are the
    GPUs the tensors are on."""
    devices = {name: _device_type(value) for name, value in tensors}
    on_gpu = sorted(name for name, kind in devices.items() if kind == "cuda")
    elsewhere = sorted(f"{name} ({kind})" for name, kind in devices.items()
                       if kind not in ("cpu", "cuda"))
    if elsewhere:
        raise ValueError(f"tensors on {elsewhere[:3]}: a send takes CPU or CUDA tensors")
    sparse = sorted(name for name, value in tensors
                    if str(getattr(value, "layout", "torch.strided")) != "torch.strided")
    if sparse:
        raise ValueError(f"{sparse[:3]} are not dense (strided) tensors: a send takes dense "
                         "tensors (e.g. tensor.to_dense())")
    away = [f"engine {rank} on node {p.node[:12]}" for rank, p in enumerate(engines)
            if p.node != here.node]
    if asked == "ipc":
        if away:
            raise ValueError(f"backend 'ipc' shares memory within one host, and {away[:3]} "
                             f"not on the sender's node {here.node[:12]}: use backend='gloo' "
                             "or 'nccl' (or None)")
        return asked
    if asked == "gloo" and on_gpu:
        raise ValueError(f"backend 'gloo' sends CPU tensors, and {on_gpu[:3]} are on a "
                         "GPU: use backend='nccl' (or None), or move them to the CPU")
    if asked is not None:
        return asked
    shares_gpu = bool(here.gpus) and all(set(here.gpus) <= set(p.gpus) for p in engines)
    if engines and not away and (shares_gpu or not on_gpu):
        return "ipc"
    return "nccl" if on_gpu else "gloo"


class WeightPort:
    """Where senders meet their pool (an async actor of 0 CPUs that the pool owns): it queues
    send requests for the pool's loop, carries the answers back, and keeps the weights sent
    (it receives them as the last rank of a gloo group; over nccl it owns copies of the blobs
    senders put). One send at a time: a second one while a send is under way is refused."""

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}  # Held.key -> a blob (uint8 tensor) received (or mapped)
        self._queue: asyncio.Queue[SendRequest] = asyncio.Queue()
        self._active: str | None = None
        self._abandoned: set[str] = set()
        self._go: dict[str, asyncio.Future[Go | BaseException]] = {}
        self._sent: dict[str, asyncio.Future[Sent]] = {}
        self._done: dict[str, asyncio.Future[int | BaseException]] = {}
        self._ended: dict[str, int | BaseException] = {}  # the latest sends' outcomes

    # -- the sender's side ----------------------------------------------------------------------
    async def submit(self, request: SendRequest) -> Go | BaseException:
        """Queue a send; answer once the pool has paused the engines and formed the group (or
        refused the send)."""
        if self._active is not None:
            return RuntimeError(f"another send ({self._active}) is under way: a pool takes one "
                                "send at a time")
        loop = asyncio.get_running_loop()
        self._active = request.id
        self._go[request.id] = loop.create_future()
        self._sent[request.id] = loop.create_future()
        self._done[request.id] = loop.create_future()
        self._queue.put_nowait(request)
        try:
            return await asyncio.wait_for(asyncio.shield(self._go[request.id]),
                                          request.timeout_s)
        except asyncio.TimeoutError:
            if self._go[request.id].done():
                return self._go[request.id].result()
            self._abandoned.add(request.id)
            self._forget(request.id)
            return TimeoutError(f"the pool did not take the send within {request.timeout_s} s "
                                "(busy with another update?)")

    async def sent(self, request_id: str, sent: Sent) -> int | BaseException:
        """The sender's stream ended: hand its report to the pool, with copies of its blobs
        that this port owns (the sender's own go with its process); answer with the outcome.
        The sender holds its refs until then."""
        future = self._done.get(request_id)
        if future is None:  # the pool ended it first (its deadline passed)
            return self._ended.get(request_id, RuntimeError(f"send {request_id} is unknown"))
        if not self._sent[request_id].done():
            self._sent[request_id].set_result(await self._owned(sent))
        return await asyncio.shield(future)

    @staticmethod
    async def _owned(sent: Sent) -> Sent:
        """`sent` with each copy made again by a task of this actor: a task's value is owned by
        its caller. The bytes never enter this process."""
        if sent.error or not sent.copies:
            return sent
        copies = tuple((names, _own.remote(ref)) for names, ref in sent.copies)
        refs = [ref for _, ref in copies]
        try:
            await asyncio.to_thread(ray.wait, refs, num_returns=len(refs), fetch_local=False)
            return Sent(copies)
        except Exception as err:  # noqa: BLE001 - the pool undoes the update
            return Sent((), f"keeping a copy of the weights failed: {err}")

    # -- the keeper -----------------------------------------------------------------------------
    async def keep(self, request_id: str, formation: Formation) -> list[tuple[str, list[str]]]:
        """Join the send's group as its keeper and hold every bucket the sender broadcasts;
        answer with each bucket's key and names once the stream ended (raises if it broke)."""

        def receive() -> list[Any]:
            try:
                group = _transfer.join(_KEEPER, formation, formation.keeper_rank)
                return list(_transfer.receive_blobs(group, "cpu"))
            except BaseException:
                _transfer.drop(_KEEPER, formation.id)
                raise

        blobs = await asyncio.to_thread(receive)
        if request_id not in self._done:  # the pool declared the send over first: no one keeps
            return []                     # what arrived after (`finish`)
        out = []
        for i, blob in enumerate(blobs):
            key = f"{request_id}.{i}"
            self._held[key] = blob
            out.append((key, list(_transfer.header(blob)[1])))
        return out

    async def node(self) -> str:
        """The Ray node this port runs on (it keeps an ipc send's buckets only from there)."""
        return place().node

    async def blob(self, key: str) -> list[ray.ObjectRef[bytes]]:
        """A held bucket put in the object store (owned by this port), inside a list."""
        held = self._held.get(key)
        if held is None:
            raise KeyError(f"the weight port holds no bucket {key!r}")
        return [ray.put(held.numpy().tobytes())]

    async def retain(self, keys: list[str]) -> None:
        """Hold only the buckets of `keys` (those the pool keeps) from now on."""
        wanted = set(keys)
        for key in [k for k in self._held if k not in wanted]:
            del self._held[key]

    async def held_bytes(self) -> int:
        """The bytes of the buckets this port holds (read-only; for tests and diagnostics)."""
        return sum(blob.numel() for blob in self._held.values())

    # -- the pool's side ------------------------------------------------------------------------
    async def take(self, wait_s: float) -> SendRequest | None:
        """The next send request (None if none came within `wait_s`)."""
        try:
            while True:
                request = await asyncio.wait_for(self._queue.get(), wait_s)
                if request.id not in self._abandoned:
                    return request
                self._abandoned.discard(request.id)
        except asyncio.TimeoutError:
            return None

    async def go(self, request_id: str, answer: Go | BaseException) -> None:
        future = self._go.get(request_id)
        if future is not None and not future.done():
            future.set_result(answer)

    async def wait_sent(self, request_id: str, wait_s: float) -> Sent | None:
        """The sender's report, or None if it gave none within `wait_s` (it died?)."""
        future = self._sent.get(request_id)
        if future is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait_s)
        except asyncio.TimeoutError:
            return None

    async def finish(self, request_id: str, outcome: int | BaseException,
                     kept: list[str]) -> None:
        """The send is over (committed, undone or refused): hold only the buckets of `kept`
        (those the pool keeps; a failed send's are not among them), tell the sender, take the
        next. A receive of this send that ends later keeps nothing (`keep`): whichever comes
        first, the port holds none of a send the pool did not keep."""
        await self.retain(kept)
        future = self._done.get(request_id)
        if future is not None and not future.done():
            future.set_result(outcome)
        self._ended[request_id] = outcome
        while len(self._ended) > _ENDED_KEPT:
            self._ended.pop(next(iter(self._ended)))
        go = self._go.get(request_id)
        if go is not None and not go.done():
            go.set_result(outcome if isinstance(outcome, BaseException)
                          else RuntimeError(f"send {request_id} ended before it began"))
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        if self._active == request_id:
            self._active = None
        for table in (self._go, self._sent):
            table.pop(request_id, None)
        done = self._done.pop(request_id, None)
        if done is not None and not done.done():
            done.set_result(RuntimeError(f"send {request_id} was abandoned"))


@ray.remote(num_cpus=0, max_retries=0)
def _own(blob: bytes) -> bytes:
    """A copy of `blob`, owned by whoever called this task."""
    return blob


# -- in the sender's process ----------------------------------------------------------------------
_node_ip_address: Callable[[], str] = ray.util.get_node_ip_address
_stores_lock = threading.Lock()
_stores: dict[str, tuple[str, TCPStore]] = {}  # pool id -> (host, store) this process serves


def _store(pool_id: str, timeout_s: float) -> tuple[str, TCPStore]:
    """This process's store for the groups of pool `pool_id`, bound once on a free port."""
    import datetime

    from torch._C._distributed_c10d import TCPStore

    with _stores_lock:
        held = _stores.get(pool_id)
        if held is None:
            host = _node_ip_address()
            store = TCPStore(host, 0, is_master=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout_s))
            held = _stores[pool_id] = (host, store)
        return held


class WeightSender:
    """Sends weights from the process it is used in straight to the engines of one pool.

    Made by `pool.weight_sender()`; picklable, so it can be passed to a trainer actor. Each
    process that sends serves its own group (formed on its first send, formed again after an
    engine restarted or another sender sent)."""

    def __init__(self, port: Any, pool_id: str, spec: WeightSpec, backend: str | None,
                 bucket_bytes: int, timeout_s: float, engines: list[Place]) -> None:
        self._port = port
        self._engines = engines  # where the engines were when the sender was made
        self._pool_id = pool_id
        self._spec = spec
        self._backend = backend
        self._bucket_bytes = bucket_bytes
        self._timeout_s = timeout_s

    @property
    def backend(self) -> str | None:
        """The backend asked for (None: ipc where every engine can map the tensors, else gloo
        for CPU tensors, nccl for CUDA tensors; see `choose_backend`)."""
        return self._backend

    @property
    def bucket_bytes(self) -> int:
        return self._bucket_bytes

    def send(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
             version: int | None = None, timeout: float | None = None) -> int:
        """Load `named_tensors` (checkpoint names to tensors or arrays, as a mapping or pairs)
        into every engine; return the version every engine now serves.

        As `pool.update_weights`: names and shapes are checked before any engine loads
        anything (`ValueError` naming them), a partial update is completed from the current
        weights, generation pauses ("keep") around the load, and the update is all or nothing
        (`WeightUpdateError`). `timeout` bounds each phase (the pool's `timeout_s` by default),
        and is the timeout of the group the send streams over: a send with another timeout
        than the last one forms its group anew (a group's timeout is fixed when it forms).
        """
        timeout_s = self._timeout_s if timeout is None else seconds("timeout", timeout)
        version = check_optional_int("version", version, 0)
        tensors = _pairs(named_tensors)
        _weights.check(dict(tensors), self._spec)
        here = _here(tensors)
        backend = choose_backend(self._backend, tensors, here, self._engines)
        device = _device(backend, tensors)
        host, store = _store(self._pool_id, timeout_s)
        request = SendRequest(uuid.uuid4().hex[:12], host, store.port, backend, here.node,
                              device.partition(":")[0], tuple(name for name, _ in tensors),
                              version, timeout_s)
        go = _answer(ray.get(self._port.submit.remote(request), timeout=timeout_s + _SETTLE_S))
        assert isinstance(go, Go)
        sent = self._stream(go.formation, store, tensors, device)
        outcome = ray.get(self._port.sent.remote(request.id, sent),
                          timeout=timeout_s * 3 + _SETTLE_S)
        done = _answer(outcome)
        assert isinstance(done, int)
        return done

    def close(self) -> None:
        """Let go of what this process keeps for its sends to this pool: its group, and over ipc
        of CPU tensors the memory files of its last two sends (twice the bytes it sends), which
        the next send writes over instead of asking the kernel for new memory. The next send
        makes them again; they also go with the process."""
        _transfer.drop(self._role)
        _shared.release_files(self._role)

    @property
    def _role(self) -> str:
        return f"sender.{self._pool_id}"

    def _stream(self, formation: Formation, store: TCPStore, tensors: list[tuple[str, Any]],
                device: str) -> Sent:
        """Broadcast (or share) every bucket over the formation's group (putting a copy of each
        where no keeper receives them); what the pool is told. A failure drops the group (the
        receivers' receives fail with it; a shared bucket is let go of)."""
        role = self._role
        copies = []
        try:
            group = _transfer.join(role, formation, 0, store)
            for bucket in _transfer.buckets(tensors, self._spec.dtypes, self._bucket_bytes,
                                            device):
                _transfer.send_bucket(group, bucket, device)
                if not formation.keeper:
                    copies.append((tuple(n for n, _ in bucket), ray.put(_transfer.blob(bucket))))
            _transfer.send_end(group, device)
            if formation.backend == "ipc":
                _transfer.drop(role)  # an ipc channel serves one send
        except Exception as err:  # noqa: BLE001 - reported to the pool, which undoes the update
            _transfer.drop(role)
            log.error("weight send over %s failed: %s", formation.backend, err)
            return Sent((), f"{type(err).__name__}: {err}")
        return Sent(tuple(copies))

    def __repr__(self) -> str:
        return f"WeightSender(pool {self._pool_id}, backend={self._backend!r})"


def check_backend(backend: str | None) -> str | None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {list(BACKENDS)} or None")
    return backend


def _pairs(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    items: Iterable[Any] = (named_tensors.items() if isinstance(named_tensors, Mapping)
                            else named_tensors)
    pairs: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"named_tensors: expected (name, tensor) pairs, got {item!r:.80}")
        name: str = item[0]
        if name in seen:
            raise ValueError(f"weight {name!r} given twice")
        seen.add(name)
        pairs.append((name, item[1]))
    return pairs


def _device_type(value: Any) -> str:
    device = getattr(value, "device", None)
    return "cpu" if device is None else str(getattr(device, "type", device))


def _here(tensors: list[tuple[str, Any]]) -> Place:
    """The sender's place, with the Ray ids of the GPUs its CUDA tensors are on."""
    own = place()
    indices = {getattr(getattr(v, "device", None), "index", None) for _, v in tensors
               if _device_type(v) == "cuda"}
    gpus = tuple(sorted(own.gpus[i] for i in indices if isinstance(i, int) and i < len(own.gpus)))
    return Place(own.node, gpus if len(gpus) == len(indices) else ())


def _device(backend: str, tensors: list[tuple[str, Any]]) -> str:
    """Where the buckets are made: the CPU for gloo, and for ipc of CPU tensors; else a GPU."""
    if backend == "gloo" or (backend == "ipc" and all(_device_type(v) == "cpu"
                                                      for _, v in tensors)):
        return "cpu"
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def _answer(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value
