"""`VllmEngine`: one vLLM `AsyncLLM` inside an async Ray actor, speaking the engine protocol.

vLLM is imported inside the actor only. The actor keeps its own count of the sequences it holds
(`_live`, with an event when it drops to zero): a pause returns when that count says so, never
after a guessed grace period. Requests are added with `AsyncLLM.add_request` and read from its
output queue (what `AsyncLLM.generate` does), so that a request added while an abort-pause is
being made can abort itself: whichever of the two reaches the engine core last, the request is
cut. Aborts never go by request id: vLLM rewrites the ids it is given.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
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
from ._worker import EXTENSION

log = logging.getLogger("actormesh.vllm")

DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "kv_cache_memory_bytes": 64 * 2**20,
    "seed": 0,
}
"""Engine arguments the pool sets unless the user does: a small KV cache (without a size vLLM
wants most of the machine's memory on the CPU) and a fixed seed."""

ENV_VARS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # else start-up is ~3x slower, with an extra process
    "TORCH_COMPILE_DISABLE": "1",  # else the first request with logprobs compiles for seconds
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
"""Environment of the engine actors (the user's `runtime_env` env_vars win)."""

_RESERVED = ("model", "worker_extension_cls")


class _SchedulerCounts:
    """A vLLM stat logger that keeps the scheduler's latest counts for `stats()`."""

    def __init__(self) -> None:
        self.running: int | None = None
        self.waiting: int | None = None
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.generated_tokens = 0  # counted per engine step, so it moves while requests run

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        counts = self

        class Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any,
                       mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
                if iteration_stats is not None:
                    counts.generated_tokens += int(iteration_stats.num_generation_tokens)
                if scheduler_stats is None:
                    return
                counts.running = int(scheduler_stats.num_running_reqs)
                counts.waiting = int(scheduler_stats.num_waiting_reqs)
                prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
                if prefix is not None:
                    counts.prefix_queries += int(prefix.queries)
                    counts.prefix_hits += int(prefix.hits)

            def log_engine_initialized(self) -> None:
                pass

        return Logger(vllm_config, engine_index)


def stat_loggers(engine_args: Mapping[str, Any], counts: _SchedulerCounts) -> list[Any]:
    """The engine's stat loggers: the pool's own (for `stats()`), and, unless
    `disable_log_stats=True`, vLLM's metrics through Ray's (`ray_vllm_*` beside
    `ray_actormesh_*`): in an actor, vLLM's default Prometheus registry is served by no one.
    vLLM's Ray logger needs Ray Serve importable (`ray[serve]`); without it vLLM keeps its own
    loggers, in the actor only."""
    loggers: list[Any] = [counts.factory]
    if engine_args.get("disable_log_stats", False):
        return loggers
    from vllm.v1.metrics import ray_wrappers

    if getattr(ray_wrappers, "ray_metrics", None) is None:  # imported with Ray Serve, or not
        log.warning("vLLM's own metrics stay inside the engine actor: exporting them through "
                    "Ray's metrics needs Ray Serve (pip install 'ray[serve]')")
    else:
        loggers.append(ray_wrappers.RayPrometheusStatLogger)
    return loggers


class VllmEngine(Engine):
    """A vLLM `AsyncLLM` (engine core in one process, no extra workers) on the CPU or a GPU."""

    @classmethod
    def check_args(cls, model: str, engine_args: Mapping[str, Any]) -> None:
        for key in _RESERVED:
            if key in engine_args:
                raise ValueError(
                    f"engine_args[{key!r}]={engine_args[key]!r}: the pool sets {key!r} itself"
                )
        looks_local = os.sep in model or model.startswith(".")
        if looks_local and not os.path.isdir(model):
            raise ValueError(f"model={model!r}: no such directory")

    @classmethod
    def mesh_defaults(cls) -> dict[str, Any]:
        return {"num_cpus": 1, "runtime_env": {"env_vars": dict(ENV_VARS)}}

    def __init__(self, model: str, engine_args: Mapping[str, Any]) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args: dict[str, Any] = {**DEFAULT_ENGINE_ARGS, **engine_args,
                                "worker_extension_cls": EXTENSION}
        self._counts = _SchedulerCounts()
        self._llm: Any = AsyncLLM.from_engine_args(
            AsyncEngineArgs(model=model, **args), stat_loggers=stat_loggers(args, self._counts)
        )
        self._live = 0
        self._start_engine(am.current_rank().rank)

    # -- generation -------------------------------------------------------------------------
    @am.method
    async def generate(self, requests: list[SubRequest]) -> list[Piece]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # Every request's settings are checked before any starts: none is left running alone.
        params = [SamplingParams(**r.sampling, logprobs=0, detokenize=False,
                                 output_kind=RequestOutputKind.FINAL_ONLY) for r in requests]
        return list(await asyncio.gather(*(self._one(r, p) for r, p in zip(requests, params))))

    async def _one(self, request: SubRequest, params: Any) -> Piece:
        from vllm.v1.engine.exceptions import EngineDeadError

        cut = await self._admit()
        if cut is not None:
            return cut
        self._live += 1
        self._quiet.clear()
        queue: Any = None
        try:
            queue = await self._llm.add_request(
                request.key, {"prompt_token_ids": request.token_ids}, params
            )
            if self._cutting:  # an abort-pause began while this request was being added
                await self._llm.abort(queue.request_id, internal=True)
            out: Any = None
            while out is None or not out.finished:
                out = queue.get_nowait() or await queue.get()
            return self._piece(request.key, out.outputs[0])
        except EngineDeadError:
            # The engine core is gone and this actor cannot serve again: end the process, so the
            # mesh sees a death (and Ray restarts it if it may) and the pool fails over.
            log.critical("vLLM engine core of engine %d died; ending its actor", self._rank)
            os._exit(1)
        except asyncio.CancelledError:
            if queue is not None:
                await self._llm.abort(queue.request_id, internal=True)
            raise
        finally:
            if queue is not None:
                queue.close()
            self._live -= 1
            if self._live == 0:
                self._quiet.set()

    def _piece(self, key: str, completion: Any) -> Piece:
        tokens = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs or (), tokens)]
        versions: list[int] = []
        for span in completion.weight_versions or ():
            label = 0 if span.version == "default" else int(span.version)
            versions.extend([label] * (span.end - span.start))
        versions.extend([self._version] * (len(tokens) - len(versions)))
        reason = str(completion.finish_reason)
        if reason not in ("stop", "length", "abort"):  # resending would fail again
            raise RuntimeError(f"vLLM ended request {key} with finish_reason={reason!r}")
        return Piece(tokens, logprobs, versions[: len(tokens)], reason,  # type: ignore[arg-type]
                     self._rank)

    # -- pausing ----------------------------------------------------------------------------
    @am.method
    async def pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self._cutting = True
            await self._pause_scheduler("abort")
            await self._quiet.wait()
        elif mode == "wait":
            await self._quiet.wait()  # vLLM's own "wait" leaves queued requests waiting
            await self._pause_scheduler("keep")
        else:
            await self._pause_scheduler("keep")
        self._now_paused(mode)

    async def _pause_scheduler(self, mode: PauseMode) -> None:
        """`AsyncLLM.pause_generation` without its last step, a 20 ms sleep that vLLM says is
        "not required for correctness", there so that in-flight requests' last outputs come
        out before it returns: an abort-pause here waits for this engine's own count of live
        requests instead, a keep-pause freezes them (their tokens' weight versions are
        tagged inside the engine core), so the sleep was 20 ms of each update's pause for
        nothing. Another vLLM without the client's call gets its public way."""
        pause = getattr(getattr(self._llm, "engine_core", None), "pause_scheduler_async", None)
        if pause is None:
            await self._llm.pause_generation(mode=mode, clear_cache=False)
        else:
            await pause(mode=mode, clear_cache=False)

    @am.method
    async def resume(self) -> None:
        self._now_resumed()
        await self._llm.resume_generation()

    # -- state ------------------------------------------------------------------------------
    @am.method
    async def stats(self) -> EngineStats:
        c = self._counts
        return EngineStats(self._rank, sequences=self._live, running=c.running,
                           waiting=c.waiting, paused=self._paused,
                           weight_version=self._version, generated_tokens=c.generated_tokens,
                           prefix_queries=c.prefix_queries, prefix_hits=c.prefix_hits)

    # -- weights ----------------------------------------------------------------------------
    @am.method
    async def weight_spec(self) -> WeightSpec:
        raw = (await self._llm.collective_rpc("actormesh_weight_spec"))[0]
        return WeightSpec.from_wire(raw)

    @am.method
    async def read_weights(self, names: list[str]) -> bytes:
        blob: bytes = (await self._llm.collective_rpc("actormesh_read_weights", args=(names,)))[0]
        return blob

    @am.method
    async def load_weights(self, version: int, blobs: list[Blob]) -> int:
        loaded = int((await self._llm.collective_rpc("actormesh_load_weights",
                                                     args=(await fetch(blobs),)))[0])
        await self._now_serving(version)
        return loaded

    @am.method
    async def receive_weights(self, formation: Formation, extra: list[Blob],
                              version: int) -> int:
        received = int((await self._llm.collective_rpc(
            "actormesh_receive_weights",
            args=(formation.wire(), formation.rank_of(self._rank), await fetch(extra))))[0])
        await self._now_serving(version)
        return received

    async def _now_serving(self, version: int) -> None:
        # Cached KV of the old weights would give wrong tokens; frozen requests are preempted
        # and recompute theirs on the new weights when they resume.
        await self._llm.reset_prefix_cache(reset_running_requests=True)
        await self._llm.update_weight_version(str(version))
        self._version = version
