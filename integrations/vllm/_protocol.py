"""The engine protocol: what the pool sends an engine actor, and what the engine answers.

An engine is an async actor class derived from `Engine`. The pool calls it only through its mesh
(`generate` through `choose`, the rest through `all`), so any class that implements these
methods, a real vLLM engine or the deterministic `FakeEngine`, runs under the same pool code.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import ray

import actormesh as am

from ._transfer import Formation

PauseMode = Literal["keep", "abort", "wait"]
PAUSE_MODES: tuple[PauseMode, ...] = ("keep", "abort", "wait")

FinishReason = Literal["stop", "length", "abort"]

RESTORE_TIMEOUT_S = 600.0
"""How long a restarted engine holds requests for the pool to restore it before serving anyway."""


@dataclasses.dataclass(frozen=True)
class SubRequest:
    """One sequence for an engine to extend: the context so far (the prompt, then any tokens
    generated before an interruption) and the sampling settings, `max_tokens` being what is left.
    `key` names it in the engine's logs; it is unique per pool request, sample and attempt."""

    key: str
    token_ids: list[int]
    sampling: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Piece:
    """What an engine produced for one `SubRequest` before it finished or was cut (`"abort"`):
    the new tokens, the log-probability of each, the weight version that produced each, and the
    engine's rank."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    engine: int


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """One engine's state. `outstanding` (generate calls in flight, counted by the mesh's
    balancer) and `alive` are filled in by the pool; `running` / `waiting` are the engine
    scheduler's own counts where it reports them (None otherwise)."""

    rank: int
    alive: bool = True
    outstanding: int = 0
    sequences: int = 0
    running: int | None = None
    waiting: int | None = None
    paused: PauseMode | None = None
    weight_version: int = 0
    generated_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """The parameters an engine's model loads, by checkpoint name: shape, dtype, and the engine
    module each loads into (`groups`). A module must be loaded whole: vLLM fuses q/k/v and
    gate/up into one module, and loading one member alone zeroes the others."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    groups: dict[str, str]

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> WeightSpec:
        """From the plain dict an engine's worker sends back (lists instead of tuples)."""
        return cls({n: tuple(int(d) for d in s) for n, s in raw["shapes"].items()},
                   dict(raw["dtypes"]), dict(raw["groups"]))


Blob = bytes | ray.ObjectRef[bytes]
"""A safetensors blob, or an ObjectRef of one: the pool passes refs inside a list, so that the
engine reads each from the object store itself, whatever path its call took."""


async def fetch(blobs: list[Blob]) -> list[bytes]:
    """The blobs' bytes, read from the object store where they are refs."""
    return [blob if isinstance(blob, bytes) else await blob for blob in blobs]


class Engine(abc.ABC):
    """Base class of engine actors (the protocol). Every method is async; the pool guarantees
    that it sends no new `generate` while the engine is paused, but calls sent just before a
    pause may arrive after it (an async actor runs calls out of order), so an engine handles
    them as the pause mode says.

    Subclasses take `(model: str, engine_args: dict)` in `__init__` and call
    `_start_engine(rank)` there; each sequence of a `generate` starts with `_admit()`, a pause
    ends with `_now_paused(mode)` and a resume starts with `_now_resumed()`. They may override
    `check_args` (driver side, before any actor starts) and `mesh_defaults`.

    The base keeps the pause bookkeeping: `_rank`, `_version` (the weights' version),
    `_paused` (the mode, for `stats`), `_cutting` (paused with `"abort"`: every sequence ends at
    once; the engine sets it where its abort begins) and `_quiet` (set while the engine holds
    no sequence; the engine clears and sets it).

    A restarted engine (Ray re-ran `__init__`) must not serve with its checkpoint's weights: it
    holds `generate` calls until the pool's `restore` has loaded the current weights (and
    paused it, if the pool is paused), whatever order the calls arrive in.
    """

    _rank: int
    _version: int
    _paused: PauseMode | None
    _cutting: bool
    _quiet: asyncio.Event
    _restore_gate: asyncio.Event

    def _start_engine(self, rank: int) -> None:
        """The protocol's state of a new engine (of rank `rank`): weights version 0, not paused,
        quiet, and (if Ray restarted this actor) holding requests until `restore`."""
        self._rank = rank
        self._version = 0
        self._paused = None
        self._cutting = False
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._restore_gate = asyncio.Event()
        with warnings.catch_warnings():  # Ray 2.60 warns about its own use of a deprecated API
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        if not restarted:
            self._restore_gate.set()

    async def _restored(self) -> None:
        if not self._restore_gate.is_set():
            try:
                await asyncio.wait_for(self._restore_gate.wait(), RESTORE_TIMEOUT_S)
            except asyncio.TimeoutError:
                self._restore_gate.set()
                raise RuntimeError(
                    f"engine restarted but not restored by its pool within {RESTORE_TIMEOUT_S} s"
                ) from None

    async def _admit(self) -> Piece | None:
        """Before a sequence starts: wait for `restore` if the engine restarted; then the empty
        cut `Piece` to return at once if the engine is paused with "abort", else None."""
        await self._restored()
        if self._cutting:
            return Piece([], [], [], "abort", self._rank)
        return None

    def _now_paused(self, mode: PauseMode) -> None:
        """The engine is quiet: record the pause ("abort" once cut, whatever mode came since)."""
        self._paused = "abort" if self._cutting else mode

    def _now_resumed(self) -> None:
        self._cutting = False
        self._paused = None

    @am.method
    async def restore(self, version: int, paused: PauseMode | None, blobs: list[Blob]) -> None:
        """After a restart: load the pool's current weights (the blobs it keeps, if it changed
        any), pause as the pool is paused, then serve the `generate` calls held meanwhile."""
        if blobs:
            await self.load_weights(version, blobs)
        if paused is not None:
            await self.pause(paused)
        self._restore_gate.set()

    @classmethod
    def check_args(cls, model: str, engine_args: Mapping[str, Any]) -> None:
        """Refuse bad `model` / `engine_args` on the driver, naming the bad value (an engine
        that takes any leaves this as it is)."""
        return

    @classmethod
    def mesh_defaults(cls) -> dict[str, Any]:
        """`ActorMesh` options the engine needs unless the user sets them (e.g. CPUs, env)."""
        return {}

    @am.method
    @abc.abstractmethod
    async def generate(self, requests: list[SubRequest]) -> list[Piece]:
        """Run every sub-request (concurrently, on this engine); return one `Piece` each when all
        have finished or been cut by `pause("abort")`. One call is one balancer slot."""
        ...

    @am.method
    @abc.abstractmethod
    async def pause(self, mode: PauseMode) -> None:
        """Stop producing tokens; return once quiet. `"keep"`: sequences freeze in place.
        `"abort"`: every sequence is cut (its `generate` returns what it has), and calls that
        arrive while paused return at once with nothing. `"wait"`: the sequences held finish
        (queued ones included), then the engine freezes. Pausing again with `"abort"` cuts
        what a `"keep"` pause froze."""
        ...

    @am.method
    @abc.abstractmethod
    async def resume(self) -> None:
        """Produce tokens again; frozen sequences go on where they stopped."""
        ...

    @am.method
    @abc.abstractmethod
    async def stats(self) -> EngineStats:
        ...

    @am.method
    @abc.abstractmethod
    async def weight_spec(self) -> WeightSpec:
        ...

    @am.method
    @abc.abstractmethod
    async def read_weights(self, names: list[str]) -> bytes:
        """The checkpoint's values of `names` as safetensors bytes (to complete a partial update)."""
        ...

    @am.method
    @abc.abstractmethod
    async def load_weights(self, version: int, blobs: list[Blob]) -> int:
        """Load the tensors of safetensors blobs in one go (whole modules only; a name in a
        later blob wins), reset the prefix cache, tag later tokens with `version`; return the
        number of tensors loaded. `fetch(blobs)` reads them."""
        ...

    @am.method
    @abc.abstractmethod
    async def receive_weights(self, formation: Formation, extra: list[Blob],
                              version: int) -> int:
        """As `load_weights`, for tensors streamed by a `WeightSender`: join `formation`'s group
        (unless already in it) as rank `formation.rank_of(rank)`, receive what its rank 0
        broadcasts and load it, with the `extra` blobs (the current values that complete its
        modules) in the same load. Returns the number of tensors received."""
        ...
