"""The engine pool on `FakeEngine`s: the resend bookkeeping (property tests, no Ray), then
routing, pauses, weights and failover on real actors with deterministic fake engines."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_faults import RESTART_GATE, FlakyEngine, arm
from workers import Signal, wait_until, waiters

import actormesh as am
from actormesh.integrations.trainer import AsyncTrainer, RolloutError
from actormesh.integrations.vllm import EnginePool, FakeEngine, Piece, WeightUpdateError
from actormesh.integrations.vllm import _engine as engine_mod
from actormesh.integrations.vllm import _weights as weights_mod
from actormesh.integrations.vllm._requests import (
    Sequence,
    check_prompt,
    check_sampling,
    group,
)
from actormesh.integrations.vllm.fake import fake_checkpoint, fake_spec, reference

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


# -- the bookkeeping, without Ray ---------------------------------------------------------------
@st.composite
def cut_schedules(draw: st.DrawFn) -> tuple[int, list[tuple[str, int]]]:
    """max_tokens, and a list of events: ("cut", tokens produced before the cut) or
    ("died", tokens the dead engine had produced and lost)."""
    max_tokens = draw(st.integers(1, 40))
    events = draw(st.lists(st.tuples(st.sampled_from(["cut", "died"]), st.integers(0, 12)),
                           max_size=8))
    return max_tokens, events


@given(cut_schedules())
def test_resends_rebuild_the_uninterrupted_sequence(schedule: tuple[int, list[tuple[str, int]]]) -> None:
    max_tokens, events = schedule
    want, want_logprobs = reference(PROMPT, max_tokens)
    seq = Sequence(list(PROMPT), check_sampling({"max_tokens": max_tokens, "min_tokens": 5}))
    expected_interruptions = 0
    for kind, produced in events:
        if seq.done:
            break
        request = seq.request("k")
        assert request.token_ids == PROMPT + seq.tokens
        assert request.sampling["max_tokens"] == max_tokens - len(seq.tokens)
        assert request.sampling["min_tokens"] == max(0, 5 - len(seq.tokens))
        n = min(produced, request.sampling["max_tokens"])
        tokens, logprobs = reference(request.token_ids, n)
        if kind == "died":
            seq.lost()
            expected_interruptions += 1
            continue
        seq.add(Piece(tokens, logprobs, [0] * n, "abort", 0))
        if n and not seq.done:
            expected_interruptions += 1
    while not seq.done:
        request = seq.request("k")
        n = request.sampling["max_tokens"]
        tokens, logprobs = reference(request.token_ids, n)
        seq.add(Piece(tokens, logprobs, [0] * n, "length", 1))
    result = seq.result()
    assert result.token_ids == want
    assert result.logprobs == want_logprobs
    assert len(result.token_ids) == max_tokens
    assert result.finish_reason == "length"
    assert result.interruptions == expected_interruptions


def test_an_engine_returning_too_many_tokens_is_an_error() -> None:
    seq = Sequence([1], check_sampling({"max_tokens": 2}))
    with pytest.raises(RuntimeError, match="3 tokens for a request of 2"):
        seq.add(Piece([1, 2, 3], [0.0] * 3, [0] * 3, "length", 0))


def test_group_samples_get_consecutive_seeds() -> None:
    samples = group([1, 2], check_sampling({"seed": 7}), 3)
    assert [s.sampling["seed"] for s in samples] == [7, 8, 9]
    assert all("seed" not in s.sampling for s in group([1], check_sampling(None), 2))


@pytest.mark.parametrize(("sampling", "match"), [
    ({"n": 4}, "'n' is not supported"),
    ({"logprobs": 5}, "'logprobs' is not supported"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"max_tokens": "8"}, "max_tokens='8'"),
    ({"temperature": None}, "temperature=None"),
    ({"temperature": -1.0}, "temperature=-1.0"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
])
def test_bad_sampling_is_refused_naming_the_field(sampling: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_sampling(sampling)


@pytest.mark.parametrize(("prompt", "error"), [
    ("hello", TypeError), ([], ValueError), ([1, -1], ValueError), ([1, 2.0], ValueError),
])
def test_bad_prompts_are_refused(prompt: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_prompt(prompt)


def test_weight_checks_name_unknown_names_and_wrong_shapes() -> None:
    spec = fake_spec()
    with pytest.raises(ValueError, match=r"unknown weight name\(s\) \['lm_head.wieght'\]"):
        weights_mod.check({"lm_head.wieght": np.zeros((1000, 8))}, spec)
    with pytest.raises(ValueError, match=r"lm_head.weight: \(8, 8\) instead of \(1000, 8\)"):
        weights_mod.check({"lm_head.weight": np.zeros((8, 8))}, spec)


def test_a_fused_member_needs_its_siblings() -> None:
    spec = fake_spec()
    q = "layers.0.self_attn.q_proj.weight"
    assert weights_mod.missing_members({q}, spec) == {
        "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight"}
    assert weights_mod.missing_members({"lm_head.weight"}, spec) == set()


def test_packed_weights_round_trip_in_the_checkpoint_dtype() -> None:
    spec = fake_spec()
    blob = weights_mod.pack({"lm_head.weight": np.ones((1000, 8), np.float64)}, spec)
    out = weights_mod.unpack(blob)
    assert list(out) == ["lm_head.weight"]
    assert str(out["lm_head.weight"].dtype).endswith("float32")


# -- the pool on fake engines -------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(ray_cluster: None) -> Iterator[EnginePool]:
    # FlakyEngine: a FakeEngine whose weight loads fail only where a test arms them.
    with EnginePool("fake", 3, engine_cls=FlakyEngine, num_cpus=0.25, max_restarts=2,
                    engine_args={"step_s": 0.004, "max_num_seqs": 2}) as p:
        p.wait_ready(timeout=120)
        yield p


def _check(gen: Any, prompt: list[int], max_tokens: int, weights: Any = None) -> None:
    want, want_logprobs = reference(prompt, max_tokens, weights)
    assert gen.token_ids == want
    assert gen.logprobs == want_logprobs
    assert gen.finish_reason == "length"


@pytest.mark.usefixtures("ray_cluster")
def test_generate_matches_the_engines_model(pool: EnginePool) -> None:
    gen = pool.generate(PROMPT, {"max_tokens": 12}).get(timeout=60)
    _check(gen, PROMPT, 12)
    assert gen.interruptions == 0 and gen.weight_versions == [0] * 12


@pytest.mark.usefixtures("ray_cluster")
def test_bad_requests_fail_before_anything_is_sent(pool: EnginePool) -> None:
    with pytest.raises(ValueError, match="'n' is not supported"):
        pool.generate(PROMPT, {"n": 2})
    with pytest.raises(ValueError, match="n=0"):
        pool.generate_group(PROMPT, None, n=0)
    with pytest.raises(ValueError, match="mode='later'"):
        pool.pause("later")  # type: ignore[arg-type]


@pytest.mark.usefixtures("ray_cluster")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(modes=st.lists(st.sampled_from(["keep", "abort", "wait"]), min_size=3, max_size=4),
       lengths=st.lists(st.integers(10, 60), min_size=4, max_size=7))
def test_pauses_never_change_what_a_caller_gets(pool: EnginePool, modes: list[str],
                                                lengths: list[int]) -> None:
    async def run() -> list[Any]:
        futures = [pool.generate(PROMPT + [i], {"max_tokens": n}) for i, n in enumerate(lengths)]
        for mode in modes:
            await _tokens_generated(pool, 4)
            await pool.pause(mode)  # type: ignore[arg-type]
            await pool.resume()
        return [await f for f in futures]

    for i, (gen, n) in enumerate(zip(asyncio.run(run()), lengths)):
        _check(gen, PROMPT + [i], n)


async def _tokens_generated(pool: EnginePool, more: int) -> None:
    """Wait until the engines have produced `more` tokens beyond now (a signal, no sleep)."""
    start = sum(e.generated_tokens for e in (await asyncio.to_thread(pool.stats))["engines"])
    for _ in range(2000):
        stats = await asyncio.to_thread(pool.stats)
        if sum(e.generated_tokens for e in stats["engines"]) >= start + more:
            return
        if not any(e.sequences for e in stats["engines"]):
            return  # nothing left running
    raise AssertionError("the engines produced no tokens")


@pytest.mark.usefixtures("ray_cluster")
def test_abort_counts_only_cuts_that_had_tokens(pool: EnginePool) -> None:
    async def run() -> list[Any]:
        # 3 engines x max_num_seqs 2: the last requests wait in an engine's queue, unstarted.
        futures = [pool.generate(PROMPT + [i], {"max_tokens": 200}) for i in range(9)]
        await _tokens_generated(pool, 6)
        await pool.pause("abort")
        stats = await asyncio.to_thread(pool.stats)
        assert all(e.sequences == 0 for e in stats["engines"])  # quiet: nothing held
        await pool.resume()
        return [await f for f in futures]

    gens = asyncio.run(run())
    for i, gen in enumerate(gens):
        _check(gen, PROMPT + [i], 200)
    counts = sorted(g.interruptions for g in gens)
    assert counts[0] == 0 and counts[-1] == 1


@pytest.mark.usefixtures("ray_cluster")
def test_a_paused_pool_holds_new_requests_until_resume(pool: EnginePool) -> None:
    pool.pause("keep").get(timeout=60)
    future = pool.generate(PROMPT, {"max_tokens": 5})
    try:
        with pytest.raises(TimeoutError):
            future.get(timeout=0.5)
        assert pool.stats()["held"] == 1
        assert sum(e.sequences for e in pool.stats()["engines"]) == 0
    finally:
        pool.resume().get(timeout=60)
    _check(future.get(timeout=60), PROMPT, 5)


@pytest.mark.usefixtures("ray_cluster")
def test_wait_finishes_requests_queued_beyond_max_num_seqs(pool: EnginePool) -> None:
    futures = [pool.generate(PROMPT + [i], {"max_tokens": 30}) for i in range(12)]
    pool.pause("wait").get(timeout=120)
    try:
        assert all(f.done() for f in futures)
    finally:
        pool.resume().get(timeout=60)
    for i, f in enumerate(futures):
        gen = f.get(timeout=5)
        _check(gen, PROMPT + [i], 30)
        assert gen.interruptions == 0


@pytest.mark.usefixtures("ray_cluster")
def test_requests_go_to_the_least_loaded_engine(pool: EnginePool) -> None:
    futures = [pool.generate(PROMPT + [i], {"max_tokens": 40}) for i in range(3)]
    assert sorted(f.get(timeout=60).engine for f in futures) == [0, 1, 2]


@pytest.mark.usefixtures("ray_cluster")
def test_a_session_sticks_to_its_engine(pool: EnginePool) -> None:
    engines = {pool.generate(PROMPT + [t], {"max_tokens": 3}, session="chat-7").get(timeout=60).engine
               for t in range(6)}
    assert len(engines) == 1


@pytest.mark.usefixtures("ray_cluster")
def test_a_group_runs_on_one_engine(pool: EnginePool) -> None:
    gens = pool.generate_group(PROMPT, {"max_tokens": 8}, n=5).get(timeout=60)
    assert len(gens) == 5 and len({g.engine for g in gens}) == 1
    for gen in gens:
        _check(gen, PROMPT, 8)


@pytest.mark.usefixtures("ray_cluster")
def test_weights_change_the_output_and_restoring_restores_it(pool: EnginePool) -> None:
    spec = fake_spec()
    original = fake_checkpoint(spec)
    rigged = dict(original, **{"lm_head.weight": np.full((1000, 8), 0.5, np.float32)})
    version = pool.update_weights({"lm_head.weight": rigged["lm_head.weight"]}).get(timeout=60)
    try:
        assert version == pool.weight_version
        gen = pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60)
        _check(gen, PROMPT, 6, rigged)
        assert gen.weight_versions == [version] * 6
    finally:
        pool.update_weights({"lm_head.weight": original["lm_head.weight"]}).get(timeout=60)
    _check(pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60), PROMPT, 6)


@pytest.mark.usefixtures("ray_cluster")
def test_a_partial_update_keeps_the_other_fused_members(pool: EnginePool) -> None:
    q = "layers.0.self_attn.q_proj.weight"
    original = fake_checkpoint(fake_spec())
    changed = dict(original, **{q: np.eye(8, dtype=np.float32)})
    pool.update_weights({q: ray.put(changed[q])}).get(timeout=60)  # an ObjectRef works too
    try:
        _check(pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60), PROMPT, 6, changed)
    finally:
        pool.update_weights({q: original[q]}).get(timeout=60)


@pytest.mark.usefixtures("ray_cluster")
def test_a_wrong_weight_name_is_refused_and_engines_keep_serving(pool: EnginePool) -> None:
    version = pool.weight_version
    with pytest.raises(ValueError, match="lm_head.wieght"):
        pool.update_weights({"lm_head.wieght": np.zeros((1000, 8), np.float32)}).get(timeout=60)
    assert pool.weight_version == version
    _check(pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60), PROMPT, 6)


@pytest.mark.usefixtures("ray_cluster")
def test_updating_while_generating_tags_later_tokens(pool: EnginePool) -> None:
    original = fake_checkpoint(fake_spec())

    async def run() -> Any:
        future = pool.generate(PROMPT, {"max_tokens": 300})
        await _tokens_generated(pool, 5)
        version = await pool.update_weights({"lm_head.weight": original["lm_head.weight"]})
        return version, await future

    version, gen = asyncio.run(run())
    old = gen.weight_versions[0]
    assert gen.weight_versions[-1] == version != old
    switch = gen.weight_versions.index(version)
    assert 0 < switch and set(gen.weight_versions[switch:]) == {version}
    _check(gen, PROMPT, 300)  # the same weights: the same tokens


@pytest.mark.usefixtures("ray_cluster")
def test_a_killed_engine_loses_no_request_and_comes_back_restored(pool: EnginePool) -> None:
    rigged = dict(fake_checkpoint(fake_spec()),
                  **{"lm_head.weight": np.full((1000, 8), 0.25, np.float32)})
    pool.update_weights({"lm_head.weight": rigged["lm_head.weight"]}).get(timeout=60)
    try:
        futures = [pool.generate(PROMPT + [i], {"max_tokens": 150}) for i in range(6)]
        asyncio.run(_tokens_generated(pool, 10))
        ray.kill(pool.mesh.actors[0], no_restart=False)
        for i, f in enumerate(futures):
            _check(f.get(timeout=120), PROMPT + [i], 150, rigged)
        assert pool.stats()["failovers"] >= 1
        # The restarted engine serves the current weights, never its checkpoint's.
        request = Sequence(PROMPT, check_sampling({"max_tokens": 4})).request("direct")
        pieces = pool.mesh[0].methods.generate.choose([request]).get(timeout=120)
        assert pieces[0].token_ids == reference(PROMPT, 4, rigged)[0]
    finally:
        original = fake_checkpoint(fake_spec())
        pool.update_weights({"lm_head.weight": original["lm_head.weight"]}).get(timeout=60)


@contextlib.contextmanager
def restarts_held() -> Iterator[Any]:
    """Inside: a restarted FlakyEngine waits in its constructor (on the Signal yielded) until
    the block ends."""
    gate = Signal.options(name=RESTART_GATE).remote()  # type: ignore[attr-defined]
    try:
        yield gate
    finally:
        ray.get(gate.send.remote(), timeout=60)
        ray.kill(gate)


def _served_by_each(pool: EnginePool, max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, weight versions) of one greedy request sent to each engine directly."""
    request = Sequence(PROMPT, check_sampling({"max_tokens": max_tokens})).request("direct")
    pieces = [pool.mesh[rank].methods.generate.choose([request]).get(timeout=120)[0]
              for rank in range(pool.mesh.size)]
    return [(p.token_ids, p.versions) for p in pieces]


@pytest.mark.usefixtures("ray_cluster")
def test_a_version_that_is_not_newer_than_the_served_one_is_refused_before_any_load(
    pool: EnginePool,
) -> None:
    served = pool.update_weights(fake_checkpoint(fake_spec())).get(timeout=60)
    rigged = np.full((1000, 8), 0.5, np.float32)
    for stale in (served, served - 1):
        with pytest.raises(ValueError, match=f"version={stale}: the engines serve weights "
                                             f"version {served}"):
            pool.update_weights({"lm_head.weight": rigged}, version=stale).get(timeout=60)
    assert pool.weight_version == served
    _check(pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60), PROMPT, 6)


@pytest.mark.usefixtures("ray_cluster")
def test_a_load_failing_on_one_engine_is_undone_everywhere_and_its_version_never_reused(
    pool: EnginePool,
) -> None:
    """Issue 25, finding 1: engine 0 kept serving the new weights as version 1 while engine 1
    served the old ones, and the next update was numbered 1 again."""
    served = pool.weight_version
    arm_load = pool.mesh[1].run_in_actors(arm, "raise")
    arm_load.get(timeout=60)
    rigged = np.full((1000, 8), 0.5, np.float32)
    with pytest.raises(WeightUpdateError, match="engine 1 failed .*could not load") as info:
        pool.update_weights({"lm_head.weight": rigged}).get(timeout=60)
    report = info.value.report
    assert report.version > served and not report.committed
    assert [(e.rank, e.outcome, e.restored) for e in report.engines] == [
        (0, "loaded", "rolled back"), (1, "failed", "rolled back"), (2, "loaded", "rolled back")]
    assert pool.weight_version == served
    assert pool.stats()["weight_update"] == report
    want = reference(PROMPT, 6)[0]
    assert _served_by_each(pool, 6) == [(want, [served] * 6)] * 3  # one weight set, one label
    original = fake_checkpoint(fake_spec())["lm_head.weight"]
    assert pool.update_weights({"lm_head.weight": original}).get(timeout=60) == report.version + 1


@pytest.mark.usefixtures("ray_cluster")
def test_a_load_that_times_out_restarts_its_engine_and_the_update_is_undone(
    pool: EnginePool,
) -> None:
    """The update ends, and generation resumes, without waiting for the restart: the engine
    is held in its constructor until the update has returned (it restores the pool's weights
    when it is back)."""
    served = pool.weight_version
    with restarts_held() as gate:
        pool.mesh[2].run_in_actors(arm, "hang").get(timeout=60)
        rigged = np.full((1000, 8), 0.75, np.float32)
        with pytest.raises(WeightUpdateError, match="engine 2 timed out") as info:
            pool.update_weights({"lm_head.weight": rigged}, timeout=2).get(timeout=60)
        assert [(e.outcome, e.restored) for e in info.value.report.engines] == [
            ("loaded", "rolled back"), ("loaded", "rolled back"), ("timed out", "restarted")]
        assert pool.weight_version == served
        waiters(gate, 1)  # engine 2's restart is held back: the update did not wait for it
        want = reference(PROMPT, 6)[0]
        assert pool.generate(PROMPT, {"max_tokens": 6}).get(timeout=60).token_ids == want
    wait_until(lambda: all(pool.mesh.load().alive))
    assert _served_by_each(pool, 6) == [(want, [served] * 6)] * 3


@pytest.mark.usefixtures("ray_cluster")
def test_pause_and_resume_skip_a_restarting_engine_which_comes_back_in_the_pools_state(
    pool: EnginePool,
) -> None:
    """A control operation does not wait for an engine that is restarting (it would spend its
    whole timeout there): the engine takes the pool's state (paused or not) when it is back."""
    with restarts_held() as gate:
        ray.kill(pool.mesh.actors[1], no_restart=False)
        wait_until(lambda: not pool.mesh.load().alive[1])
        waiters(gate, 1)  # engine 1 is restarting, held back
        pool.pause("keep", timeout=5).get(timeout=60)
    wait_until(lambda: all(pool.mesh.load().alive))
    wait_until(lambda: pool.stats()["engines"][1].paused == "keep")  # restored, paused
    assert [e.paused for e in pool.stats()["engines"]] == ["keep"] * 3
    pool.resume(timeout=5).get(timeout=60)
    assert [e.paused for e in pool.stats()["engines"]] == [None] * 3
    want = reference(PROMPT, 6)[0]
    assert [tokens for tokens, _ in _served_by_each(pool, 6)] == [want] * 3


@pytest.mark.usefixtures("ray_cluster")
def test_cancelling_a_request_aborts_it_in_its_engine(pool: EnginePool) -> None:
    """Issue 25, finding 6: a cancelled request went on generating in its engine."""
    future = pool.generate(PROMPT, {"max_tokens": 100_000})
    asyncio.run(_tokens_generated(pool, 5))
    assert future.cancel()
    wait_until(lambda: sum(e.sequences for e in pool.stats()["engines"]) == 0)
    with pytest.raises(cf.CancelledError):
        future.get(timeout=5)
    wait_until(lambda: sum(pool.mesh.load()) == 0)


@pytest.mark.usefixtures("ray_cluster")
def test_a_trainer_rollout_that_times_out_aborts_its_request_in_the_engine(
    pool: EnginePool,
) -> None:
    async def rollout(prompt: int, uid: int) -> list[int]:
        gen = await pool.generate(PROMPT + [prompt], {"max_tokens": 100_000})
        return gen.token_ids

    trainer = AsyncTrainer(list(range(2)), rollout, lambda groups, step: None, batch_size=2,
                           rollout_timeout_s=0.5, rollout_retries=0)
    with pytest.raises(RolloutError, match="rollout_timeout_s=0.5"):
        trainer.run()
    wait_until(lambda: sum(e.sequences for e in pool.stats()["engines"]) == 0)
    wait_until(lambda: sum(pool.mesh.load()) == 0)


def test_a_bad_engine_class_or_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="engine_cls"):
        EnginePool("fake", 1, engine_cls=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_engines=0"):
        EnginePool("fake", 0, engine_cls=FakeEngine)
    with pytest.raises(ValueError, match="unknown engine_args"):
        EnginePool("fake", 1, engine_cls=FakeEngine, engine_args={"tick": 1})



@pytest.mark.usefixtures("ray_cluster")
def test_an_async_context_shuts_the_pool_down() -> None:
    async def run() -> EnginePool:
        async with EnginePool("fake", 1, engine_cls=FakeEngine, num_cpus=0.25) as pool:
            _check(await pool.generate(PROMPT, {"max_tokens": 4}), PROMPT, 4)
        return pool

    pool = asyncio.run(run())
    with pytest.raises(am.MeshError, match="shut down"):
        pool.generate(PROMPT)


def test_vllm_engine_arguments_are_checked_on_the_driver(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="engine_args\\['model'\\]"):
        EnginePool(str(tmp_path), engine_args={"model": "other"})
    with pytest.raises(ValueError, match="no such directory"):
        EnginePool(str(tmp_path / "missing"))


@pytest.mark.parametrize("ray_metrics", [True, False], ids=["with Ray Serve", "without"])
def test_vllm_engines_export_vllms_own_metrics_through_ray_unless_switched_off(
        monkeypatch: pytest.MonkeyPatch, ray_metrics: bool) -> None:
    class RayPrometheusStatLogger:  # stands for vLLM's, without importing vLLM and torch
        pass

    wrappers = types.ModuleType("vllm.v1.metrics.ray_wrappers")
    wrappers.RayPrometheusStatLogger = RayPrometheusStatLogger  # type: ignore[attr-defined]
    wrappers.ray_metrics = object() if ray_metrics else None  # type: ignore[attr-defined]
    metrics = types.ModuleType("vllm.v1.metrics")
    metrics.ray_wrappers = wrappers  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, metrics.__name__, metrics)
    monkeypatch.setitem(sys.modules, wrappers.__name__, wrappers)
    counts = engine_mod._SchedulerCounts()
    exported = [RayPrometheusStatLogger] if ray_metrics else []
    assert engine_mod.stat_loggers({}, counts) == [counts.factory, *exported]
    assert engine_mod.stat_loggers({"disable_log_stats": True}, counts) == [counts.factory]


def test_importing_the_integration_imports_neither_vllm_nor_torch() -> None:
    code = ("import sys, actormesh.integrations.vllm; "
            "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
