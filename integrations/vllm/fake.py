"""`FakeEngine`: a deterministic stand-in for a vLLM engine, for tests and for benchmarks with
many engines on a small machine. It needs no vLLM and no accelerator.

It mirrors what the pool relies on: continuous batching (every running sequence gets one token
per step, at most `max_num_seqs` run, the rest wait), a prefix cache of token blocks (prefill
costs time per uncached prompt token), the three pause modes, abort returning the tokens so
far, a cancelled request leaving the engine, and weights that change the output (loading one member of a fused module alone zeroes the
others, as in vLLM). A token depends only on the sequence before it and the weights, so a
sequence cut and resent anywhere yields the same tokens and log-probabilities, like greedy
decoding on a real engine.

`engine_args` (all optional): `step_s` (seconds per decoding step, 0.002), `step_s_per_seq`
(added per running sequence, 0: a bigger batch makes a slower step), `prefill_s_per_token` (0:
added to the step that admits a sequence, per prompt token not in the prefix cache), `speeds` (a
speed factor per rank: every cost is divided by it), `max_num_seqs` (256), `block_size` (16),
`cache_blocks` (4096), `vocab_size` (1000), `eos_token_id` (None).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import actormesh as am

from ._protocol import (
    Blob,
    Engine,
    EngineStats,
    PauseMode,
    Piece,
    SubRequest,
    WeightSpec,
    fetch,
)
from ._transfer import Formation

_ARGS = {"step_s", "step_s_per_seq", "speeds", "max_num_seqs", "prefill_s_per_token", "block_size", "cache_blocks",
         "vocab_size", "eos_token_id", "hidden_size"}
_ROLE = "fake-engine"  # its group in `_transfer`
_CONTEXT = 8  # tokens of context a fake token depends on (besides the position)


def fake_spec(vocab_size: int = 1000, hidden_size: int = 8) -> WeightSpec:
    """The fake model's parameters: an embedding, one fused q/k/v module, a head."""
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (vocab_size, hidden_size),
        "layers.0.self_attn.q_proj.weight": (hidden_size, hidden_size),
        "layers.0.self_attn.k_proj.weight": (hidden_size, hidden_size),
        "layers.0.self_attn.v_proj.weight": (hidden_size, hidden_size),
        "lm_head.weight": (vocab_size, hidden_size),
    }
    groups = {n: n.rpartition(".")[0] for n in shapes}
    for member in ("q_proj", "k_proj", "v_proj"):
        groups[f"layers.0.self_attn.{member}.weight"] = "layers.0.self_attn.qkv_proj"
    return WeightSpec(shapes, dict.fromkeys(shapes, "float32"), groups)


def fake_checkpoint(spec: WeightSpec) -> dict[str, Any]:
    """The fake model's initial weights: fixed values, the same in every engine."""
    import numpy as np

    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in spec.shapes.items()}


def weights_salt(weights: Mapping[str, Any]) -> bytes:
    """What the fake model's output depends on: a digest of all its weights."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].tobytes())
    return h.digest()


def reference(prompt: Sequence[int], max_tokens: int, weights: Mapping[str, Any] | None = None,
              vocab_size: int = 1000) -> tuple[list[int], list[float]]:
    """The tokens and log-probabilities a `FakeEngine` with `weights` (default: its checkpoint)
    produces for `prompt`, computed locally: the uninterrupted run to compare against."""
    if weights is None:
        weights = fake_checkpoint(fake_spec(vocab_size))
    salt = weights_salt(weights)
    context, logprobs = list(prompt), []
    for _ in range(max_tokens):
        token, logprob = next_token(context, salt, vocab_size)
        context.append(token)
        logprobs.append(logprob)
    return context[len(prompt):], logprobs


def next_token(context: Sequence[int], salt: bytes, vocab_size: int) -> tuple[int, float]:
    """The fake model: the token after `context` and its log-probability."""
    tail = list(context[-_CONTEXT:])
    digest = hashlib.blake2b(struct.pack(f"<q{len(tail)}q", len(context), *tail), key=salt,
                             digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % vocab_size, -1.0 - (value >> 32) % 1000 / 250.0


class _Seq:
    """One sequence held by the engine."""

    __slots__ = ("context", "sampling", "tokens", "logprobs", "versions", "done", "cached")

    def __init__(self, context: list[int], sampling: dict[str, Any], done: asyncio.Future[str]) -> None:
        self.context = context
        self.sampling = sampling
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.done = done
        self.cached = 0


class FakeEngine(Engine):
    """A deterministic engine: one token per running sequence per step (see the module doc)."""

    @classmethod
    def check_args(cls, model: str, engine_args: Mapping[str, Any]) -> None:
        unknown = sorted(set(engine_args) - _ARGS)
        if unknown:
            raise ValueError(f"FakeEngine: unknown engine_args {unknown}; it takes {sorted(_ARGS)}")
        speeds = engine_args.get("speeds")
        if speeds is not None and (not isinstance(speeds, Sequence)
                                   or not all(isinstance(s, (int, float)) and s > 0 for s in speeds)):
            raise ValueError(f"FakeEngine: speeds={speeds!r} must be a list of numbers > 0")

    def __init__(self, model: str, engine_args: Mapping[str, Any]) -> None:
        rank = am.current_rank().rank
        speeds = engine_args.get("speeds") or [1.0]
        speed = float(speeds[rank % len(speeds)])
        self._step_s = float(engine_args.get("step_s", 0.002)) / speed
        self._step_s_per_seq = float(engine_args.get("step_s_per_seq", 0.0)) / speed
        self._prefill_s = float(engine_args.get("prefill_s_per_token", 0.0)) / speed
        self._max_seqs = int(engine_args.get("max_num_seqs", 256))
        self._block = int(engine_args.get("block_size", 16))
        self._capacity = int(engine_args.get("cache_blocks", 4096))
        self._vocab = int(engine_args.get("vocab_size", 1000))
        self._eos = engine_args.get("eos_token_id")
        self._spec = fake_spec(self._vocab, int(engine_args.get("hidden_size", 8)))
        self._checkpoint = fake_checkpoint(self._spec)
        self._weights = dict(self._checkpoint)
        self._salt = weights_salt(self._weights)
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []
        self._cache: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._between_steps = asyncio.Event()  # set while no step is being computed
        self._between_steps.set()
        self._stepper: asyncio.Task[None] | None = None
        self._generated = 0
        self._queries = 0
        self._hits = 0
        self._start_engine(rank)

    # -- generation -------------------------------------------------------------------------
    @am.method
    async def generate(self, requests: list[SubRequest]) -> list[Piece]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: SubRequest) -> Piece:
        cut = await self._admit()
        if cut is not None:
            return cut
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        seq = _Seq(list(request.token_ids), request.sampling, done)
        self._waiting.append(seq)
        self._quiet.clear()
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.create_task(self._steps())
        try:
            reason = await done
        except asyncio.CancelledError:  # the caller cancelled (`ray.cancel`): abort it, as vLLM
            if seq in self._running or seq in self._waiting:
                self._finish(seq, "abort")
            raise
        return Piece(seq.tokens, seq.logprobs, seq.versions, reason, self._rank)  # type: ignore[arg-type]

    def _held(self) -> int:
        return len(self._waiting) + len(self._running)

    async def _steps(self) -> None:
        """Advance every running sequence one token per step while there is work."""
        while self._held():
            await self._resumed.wait()
            if not self._held():
                break
            prefill = 0
            while self._waiting and len(self._running) < self._max_seqs:
                seq = self._waiting.popleft()
                prefill += len(seq.context) - self._lookup(seq.context, record=True)
                self._running.append(seq)
            self._between_steps.clear()
            try:
                await asyncio.sleep(self._step_s + len(self._running) * self._step_s_per_seq
                                    + prefill * self._prefill_s)
                for seq in list(self._running):
                    self._advance(seq)
            finally:
                self._between_steps.set()

    def _lookup(self, context: list[int], record: bool) -> int:
        """Prefix-cache hit tokens for `context` (whole blocks from the start); caches it.
        `record`: count the lookup in the hit statistics (a prefill does, caching a finished
        sequence does not)."""
        hits, chained = 0, b""
        hit_so_far = True
        for start in range(0, len(context) - self._block + 1, self._block):
            block = struct.pack(f"<{self._block}q", *context[start:start + self._block])
            chained = hashlib.blake2b(chained + block, digest_size=16).digest()
            if hit_so_far and chained in self._cache:
                hits += self._block
                self._cache.move_to_end(chained)
            else:
                hit_so_far = False
                self._cache[chained] = None
                if len(self._cache) > self._capacity:
                    self._cache.popitem(last=False)
        if record:
            self._queries += len(context)
            self._hits += hits
        return hits

    def _advance(self, seq: _Seq) -> None:
        full = seq.context + seq.tokens
        token, logprob = next_token(full, self._salt, self._vocab)
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        seq.versions.append(self._version)
        self._generated += 1
        sampling = seq.sampling
        min_tokens = int(sampling.get("min_tokens", 0))
        stops = set(sampling.get("stop_token_ids", ()))
        if self._eos is not None and not sampling.get("ignore_eos", False):
            stops.add(int(self._eos))
        if len(seq.tokens) >= int(sampling["max_tokens"]):
            self._finish(seq, "length")
        elif token in stops and len(seq.tokens) >= min_tokens:
            self._finish(seq, "stop")

    def _finish(self, seq: _Seq, reason: str) -> None:
        if seq in self._running:
            self._running.remove(seq)
            self._lookup(seq.context + seq.tokens, record=False)  # what it leaves in the cache
        else:
            self._waiting.remove(seq)
        if not seq.done.done():
            seq.done.set_result(reason)
        if not self._held():
            self._quiet.set()

    def reset_cache(self) -> None:
        """Empty the prefix cache and zero the counters (between benchmark runs, through
        `pool.mesh.run_in_actors(FakeEngine.reset_cache)`)."""
        self._cache.clear()
        self._queries = self._hits = self._generated = 0

    # -- pausing ----------------------------------------------------------------------------
    @am.method
    async def pause(self, mode: PauseMode) -> None:
        if mode == "wait":
            await self._quiet.wait()
        self._resumed.clear()
        await self._between_steps.wait()  # a step under way completes, as in vLLM
        if mode == "abort":
            self._cutting = True
            self._cut_all()
        self._now_paused(mode)

    def _cut_all(self) -> None:
        for seq in list(self._running) + list(self._waiting):
            self._finish(seq, "abort")

    @am.method
    async def resume(self) -> None:
        self._now_resumed()
        self._resumed.set()

    # -- state ------------------------------------------------------------------------------
    @am.method
    async def stats(self) -> EngineStats:
        return EngineStats(self._rank, sequences=self._held(), running=len(self._running),
                           waiting=len(self._waiting), paused=self._paused,
                           weight_version=self._version, generated_tokens=self._generated,
                           prefix_queries=self._queries, prefix_hits=self._hits)

    # -- weights ----------------------------------------------------------------------------
    @am.method
    async def weight_spec(self) -> WeightSpec:
        return self._spec

    @am.method
    async def read_weights(self, names: list[str]) -> bytes:
        from safetensors.numpy import save

        missing = sorted(set(names) - set(self._checkpoint))
        if missing:
            raise KeyError(f"not in the checkpoint: {missing}")
        return bytes(save({n: self._checkpoint[n] for n in names}))

    @am.method
    async def load_weights(self, version: int, blobs: list[Blob]) -> int:
        from safetensors.numpy import load

        weights: dict[str, Any] = {}
        for blob in await fetch(blobs):
            weights.update(load(blob))
        self._load(weights, version)
        return len(weights)

    @am.method
    async def receive_weights(self, formation: Formation, extra: list[Blob],
                              version: int) -> int:
        from safetensors.numpy import load

        def receive() -> dict[str, Any]:  # on a thread: the engine's loop keeps serving
            from . import _transfer

            try:
                group = _transfer.join(_ROLE, formation, formation.rank_of(self._rank))
                device = _transfer.receive_device(formation.backend)  # a GPU's, if it has one
                return {name: tensor.cpu().numpy().copy()
                        for name, tensor in _transfer.receive(group, device)}
            except BaseException:
                _transfer.drop(_ROLE)
                raise

        completion: dict[str, Any] = {}
        for blob in await fetch(extra):
            completion.update(load(blob))
        received = await asyncio.to_thread(receive)
        self._load({**completion, **received}, version)
        return len(received)

    def _load(self, weights: Mapping[str, Any], version: int) -> None:
        import numpy as np

        touched = {self._spec.groups[n] for n in weights}
        for name, module in self._spec.groups.items():
            if module in touched:  # what vLLM does to the members of a module not loaded
                self._weights[name] = np.asarray(weights[name]) if name in weights else np.zeros(
                    self._spec.shapes[name], np.float32)
        self._salt = weights_salt(self._weights)
        self._cache.clear()
        self._version = version
