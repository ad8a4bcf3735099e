"""The benchmark harness runs end to end at tiny sizes and writes what it promises.

A smoke test of the harness, not a benchmark: it asserts that results.json, report.md,
headline.md and the plots are written and carry what makes their figures honest (the commit, an
A/A control that is the default run twice, intervals beside every ratio, the library's overhead
apart, the check against queueing theory), never how fast anything was.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("rich")

import actormesh as am  # noqa: E402
from actormesh import _balancer  # noqa: E402
from benchmarks import cli  # noqa: E402  (the repository root is on pythonpath)
from benchmarks.config import SMOKE  # noqa: E402
from benchmarks.harness import metrics, runner, turns  # noqa: E402
from benchmarks.harness.contenders import FreshMesh, default_policy, twin_name  # noqa: E402
from benchmarks.harness.context import Context  # noqa: E402
from benchmarks.harness.workloads import Service  # noqa: E402
from benchmarks.report import headline, output, stats  # noqa: E402
from benchmarks.scenarios import call_path, drivers, hedged, kills  # noqa: E402
from benchmarks.without_ray import sim, theory  # noqa: E402

BALANCING = ["straggler", "tiny_noop", "killed"]
CALL_PATH = ["map", "choose_burst", "sequential"]
PREPARED = ["hedged", "drivers"]
SECTIONS = [*BALANCING, *CALL_PATH, *PREPARED, "sim", "theory", "decision_cost"]
# The default (which brings its A/A twin), random for the library's overhead, and the baselines
# that can be the strongest; kept few: each run of the kill scenario waits for a restart.
CONTENDERS = [default_policy(), "random", "ray-random", "ActorPool"]
DEFAULT = default_policy()


@pytest.fixture(scope="module")
def smoke_run(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--smoke", "--out", str(out), "--only", *SECTIONS, "--contenders", *CONTENDERS]
    assert cli.main(argv) == 0
    yield out


def _load(out: Path) -> dict[str, Any]:
    return output.read(str(out / "results.json"))  # null metric values back as NaN


def test_writes_results_report_headline_and_plots(smoke_run: Path) -> None:
    names = set(os.listdir(smoke_run))
    assert {"results.json", "report.md", "headline.md"} <= names
    assert any(n.endswith(".png") for n in names)
    for name in names:
        if name.endswith(".png"):
            assert (smoke_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _scenario(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in results["scenarios"] if s["name"] == name)


def test_results_record_commit_tree_state_machine_and_versions(smoke_run: Path) -> None:
    results = _load(smoke_run)
    assert results["git"]["commit"] and results["git"]["dirty"] in (True, False)
    assert results["machine"]["nproc"] >= 1 and results["machine"]["cpu_model"]
    assert results["versions"]["ray"] and results["versions"]["actormesh"]
    assert [s["name"] for s in results["scenarios"]] == [*BALANCING, *CALL_PATH, *PREPARED]


def test_the_default_and_the_policies_are_read_from_the_library(smoke_run: Path) -> None:
    results = _load(smoke_run)
    signature = inspect.signature(am.ActorMesh).parameters["balancer"].default
    assert results["default_policy"] == getattr(signature, "name", signature)
    assert results["policies"] == list(_balancer.POLICIES)


def test_every_balancing_scenario_has_every_contender_and_the_twin(smoke_run: Path) -> None:
    results = _load(smoke_run)
    for name in BALANCING:
        scenario = _scenario(results, name)
        # tiny calls also play the default through a mesh made anew before each turn
        fresh = {FreshMesh.FRESH} if name == "tiny_noop" else set()
        assert {c["name"] for c in scenario["contenders"]} == \
            {*CONTENDERS, twin_name(DEFAULT), *fresh}
        for c in scenario["contenders"]:
            assert len(c["runs"]) == scenario["repeats"] >= 1
            assert c["runs"][0]["calls"] > 0


def test_tiny_calls_say_how_the_default_s_mesh_compares_with_one_made_anew(
        smoke_run: Path) -> None:
    results = _load(smoke_run)
    tiny = _scenario(results, "tiny_noop")
    ratio = stats.find(tiny["comparisons"]["throughput_per_s"], DEFAULT, FreshMesh.FRESH)
    assert ratio is not None and ratio.value > 0
    [row] = [r for r in headline.ray_rows(results)
             if r["scenario"] == "tiny_noop" and "fresh" in r["title"]]
    assert row["vs_strongest"]["baseline"] == FreshMesh.FRESH


def test_the_aa_control_is_the_default_against_its_twin_in_every_scenario(
        smoke_run: Path) -> None:
    for scenario in _load(smoke_run)["scenarios"]:
        for metric in scenario["metrics"]:
            control = scenario["comparisons"][metric]["control"]
            assert (control["contender"], control["baseline"]) == (scenario["default"],
                                                                   scenario["twin"])
            assert control["value"] > 0
            assert control["lo"] <= control["hi"] or math.isnan(control["lo"])  # one repeat
            twin = next(c for c in scenario["contenders"] if c["name"] == scenario["twin"])
            assert twin["family"] == "aa"  # neither a contender nor a baseline of a ratio


def test_default_is_compared_with_the_strongest_baseline_with_an_interval(
        smoke_run: Path) -> None:
    for scenario in _load(smoke_run)["scenarios"]:
        comparison = scenario["comparisons"][scenario["metrics"][0]]
        baselines = {c["name"] for c in scenario["contenders"] if c["family"] == "baseline"}
        assert comparison["strongest"] in baselines
        r = stats.find(comparison, scenario["default"], comparison["strongest"])
        assert r is not None and r.value > 0
        assert r.lo <= r.hi or scenario["repeats"] == 1 and math.isnan(r.lo)


def test_straggler_is_judged_on_a_fraction_of_slow_calls_beside_p99(smoke_run: Path) -> None:
    straggler = _scenario(_load(smoke_run), "straggler")
    assert straggler["metrics"] == ["slow_frac", "p99_ms"]
    assert all(0 <= c["runs"][0]["slow_frac"] <= 1 for c in straggler["contenders"])


def test_call_path_scenarios_measure_the_raw_and_pool_baselines(smoke_run: Path) -> None:
    results = _load(smoke_run)
    names = {s: {c["name"] for c in _scenario(results, s)["contenders"]} for s in CALL_PATH}
    assert {"raw loop", "ray.util.ActorPool.map", "am.ActorPool.map"} <= names["map"]
    assert {"raw, ray.get per ref", "raw, one ray.get", call_path.AM_GET} <= names[
        "choose_burst"]
    assert "raw" in names["sequential"]
    sequential = _scenario(results, "sequential")
    assert sequential["metrics"][0] == "p50_ms"
    assert all(c["runs"][0]["p50_ms"] > 0 for c in sequential["contenders"])


def test_the_hedged_batch_counts_executions_and_its_lower_bound(smoke_run: Path) -> None:
    scenario = _scenario(_load(smoke_run), "hedged")
    assert scenario["default"] == hedged.HEDGED
    for c in scenario["contenders"]:
        run = c["runs"][0]
        assert run["executions_per_call"] >= 1.0  # counted in the actors: every call ran
        assert run["makespan_over_bound"] >= 1.0 - 1e-9


def test_several_drivers_report_p99_and_peaks_in_flight(smoke_run: Path) -> None:
    scenario = _scenario(_load(smoke_run), "drivers")
    assert scenario["default"] == drivers.CONNECTED
    assert {c["name"] for c in scenario["contenders"]} >= {drivers.ONE, drivers.RANDOM,
                                                           drivers.OWN, drivers.CONNECTED}
    for c in scenario["contenders"]:
        run = c["runs"][0]
        assert run["peak_over_mean"] >= 1.0 and run["failed"] == 0


def test_calls_under_kills_account_for_every_call_sent(ray_cluster: None) -> None:
    # Played on its own (not in `smoke_run`): each turn waits for the killed actors' restarts.
    ctx = Context(SMOKE, lambda _: None)
    try:
        scenario = kills.Scenario().run(ctx)
    finally:
        ctx.close()
    assert scenario["default"] == kills.DEFAULT
    assert {c["name"] for c in scenario["contenders"]} == {
        kills.DEFAULT, kills.TWIN, kills.ALONE, kills.RETRY, kills.RAW, kills.RAW_RETRY,
        kills.POOL}
    for c in scenario["contenders"]:
        run = c["runs"][0]
        assert run["calls"] == run["returned"] + run["failed"] + run["unfinished"] > 0
        assert run["finished_lost"] <= run["failed"]
        assert run["executions_per_call"] >= run["returned"] / run["calls"]


def test_headline_names_commit_contender_baseline_interval_and_control(smoke_run: Path) -> None:
    text = (smoke_run / "headline.md").read_text()
    assert f"`{_load(smoke_run)['git']['commit']}`" in text
    assert f"default ({DEFAULT}) ÷ strongest baseline" in text
    assert "A/A: default ÷ its twin" in text
    assert "One actor 20× slower · calls slower than 10× the mean service time" in text
    assert "map over no-op items · throughput" in text
    assert "One call at a time · median latency" in text
    assert "throughput, choose burst, one am.get ÷" in text
    assert "×  [" not in text and "× [" in text  # ratios carry their interval


def test_the_library_overhead_is_a_table_of_its_own(smoke_run: Path) -> None:
    rows = headline.overhead_rows(_load(smoke_run))
    assert [r[0] for r in rows][:2] == ["One actor 20× slower · calls slower than 10× the mean "
                                        "service time", "Tiny calls: no-op · throughput"]
    killed = next(r for r in rows if r[0].startswith("An actor killed"))
    assert "retries differently" in killed[1]
    assert "library overhead" in (smoke_run / "headline.md").read_text()


def test_report_states_the_noise_floor_and_its_repeats(smoke_run: Path) -> None:
    text = (smoke_run / "report.md").read_text()
    assert "## The noise floor" in text and "calls 1.2×" in text


def test_simulation_is_checked_against_queueing_theory(smoke_run: Path) -> None:
    rows = _load(smoke_run)["theory"]["rows"]
    assert {(r["policy"], r["load"]) for r in rows} == {
        (p, load) for p in ("random", "pow2") for load in (0.7, 0.9, 0.95)}
    for r in rows:
        assert r["measured"] > 0 and r["se"] >= 0 and isinstance(r["agrees"], bool)
    assert "SIMULATED mean time in system, random" in (smoke_run / "headline.md").read_text()


def test_decision_cost_compares_the_same_algorithm_and_checks_its_decisions(
        smoke_run: Path) -> None:
    rows = _load(smoke_run)["decision_cost"]["rows"]
    assert all(r["same_decisions"] for r in rows)
    assert {r["twin"] for r in rows if r["policy"] in ("least_loaded", "pull", "sed")} == {"heap"}
    assert all(r["scan_ns"] > 0 for r in rows if r["twin"] == "heap")


def test_the_simulation_makes_the_reference_decisions(smoke_run: Path) -> None:
    rows = _load(smoke_run)["simulation"]["reference"]["rows"]
    assert rows and all(r["identical"] for r in rows)


def test_report_can_be_rebuilt_from_results_json(smoke_run: Path, tmp_path: Path) -> None:
    assert cli.main(["--report", str(smoke_run / "results.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# actormesh benchmark results")
    assert (tmp_path / "headline.md").read_text() == (smoke_run / "headline.md").read_text()


@pytest.mark.parametrize("policy", ["least_loaded", "pull", "sed"])
def test_the_heap_twin_makes_the_native_decisions_queue_included(policy: str) -> None:
    import random

    from actormesh import _native
    from benchmarks import reference_heap

    native, twin = _native.Scheduler(7, policy, seed=3), reference_heap.Scheduler(7, policy, seed=3)
    rng = random.Random(policy)
    running: list[tuple[int, float]] = []
    clock = 0.0
    for _ in range(3000):
        if rng.random() < 0.55 or not running:
            a, b = native.submit(0), twin.submit(0)
            assert (a.ticket, a.actor) == (b.ticket, b.actor)
            if a.actor >= 0:
                running.append((a.actor, clock))
            continue
        actor, started = running.pop(rng.randrange(len(running)))
        clock += 0.001 + 0.01 * rng.random() * (actor + 1)  # actors of different speeds
        done = native.complete(actor, started, clock, 0)
        assert [(d.ticket, d.actor) for d in done] == [
            (d.ticket, d.actor) for d in twin.complete(actor, started, clock, 0)]
        running += [(d.actor, clock) for d in done]
    assert native.in_flight() == twin.in_flight()


def _ratio(value: float, lo: float, hi: float) -> stats.Ratio:
    return stats.Ratio("p99_ms", "pow2", "ActorPool", value, lo, hi)


def test_a_ratio_inside_the_aa_noise_is_no_difference() -> None:
    control = stats.Ratio("p99_ms", "pow2", "pow2 (A/A)", 1.1, 0.8, 1.4)
    assert stats.verdict(_ratio(1.3, 1.2, 1.5), control) == stats.NO_DIFFERENCE
    assert stats.verdict(_ratio(2.0, 1.5, 2.5), control) == "better"
    assert stats.verdict(_ratio(0.7, 0.6, 0.75), control) == "worse"


def test_a_ratio_whose_interval_holds_1_is_no_difference_even_outside_the_noise() -> None:
    control = stats.Ratio("p99_ms", "pow2", "pow2 (A/A)", 1.0, 0.9, 1.1)
    assert stats.verdict(_ratio(1.3, 0.95, 1.6), control) == stats.NO_DIFFERENCE
    assert stats.verdict(_ratio(0.7, 0.5, 1.02), control) == stats.NO_DIFFERENCE


def test_an_aa_interval_within_15_percent_calls_a_1_2x_difference() -> None:
    control = stats.Ratio("p99_ms", "pow2", "pow2 (A/A)", 1.0, 0.87, 1.15)
    assert stats.verdict(_ratio(1.2, 1.05, 1.36), control) == "better"
    assert stats.verdict(_ratio(1 / 1.2, 1 / 1.36, 1 / 1.05), control) == "worse"


def test_without_a_control_the_noise_band_is_1_alone() -> None:
    assert stats.verdict(_ratio(1.3, 1.2, 1.5), None) == "better"


def _runs(latencies: list[list[float]]) -> list[stats.RunSample | None]:
    import numpy as np

    return [stats.RunSample(np.array(lat), np.zeros(len(lat), dtype=bool), {}, {})
            for lat in latencies]


def test_ratios_are_paired_by_repeat() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    plans = [list(rng.exponential(10.0 * (1 + r), 200)) for r in range(6)]  # repeats differ
    samples = {"fast": _runs(plans), "slow": _runs([[2 * v for v in p] for p in plans]),
               "same": _runs(plans)}
    block = stats.compare(samples, ["p99_ms"], contenders=["fast"], baselines=["slow"],
                          control=("fast", "same"))["p99_ms"]
    r = stats.find(block, "fast", "slow")
    assert r is not None and r.lo == pytest.approx(2.0) and r.hi == pytest.approx(2.0)
    control = stats.control_of(block)
    assert control is not None and (control.lo, control.hi) == (1.0, 1.0)


def test_a_repeat_the_machine_stalled_in_is_trimmed() -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    plans = [list(rng.exponential(10.0, 300)) for _ in range(10)]
    stalled = [[v * (10 if r == 3 else 1) for v in p] for r, p in enumerate(plans)]
    block = stats.compare({"a": _runs(plans), "b": _runs(stalled)}, ["p99_ms"],
                          contenders=["a"], baselines=["b"], control=None)["p99_ms"]
    r = stats.find(block, "a", "b")
    assert r is not None and r.value == pytest.approx(1.0)


def test_a_contender_that_sat_repeats_out_is_compared_on_the_shared_ones() -> None:
    import numpy as np

    rng = np.random.default_rng(2)
    plans = [list(rng.exponential(10.0, 100)) for _ in range(4)]
    sparse = [run if i % 2 else None for i, run in enumerate(_runs([[3 * v for v in p]
                                                                    for p in plans]))]
    block = stats.compare({"a": _runs(plans), "b": sparse}, ["p50_ms"], contenders=["a"],
                          baselines=["b"], control=None)["p50_ms"]
    r = stats.find(block, "a", "b")
    assert r is not None and r.value == pytest.approx(3.0)


def test_where_baselines_play_every_2nd_repeat_the_default_and_its_twin_play_every_one() -> None:
    names = ["adaptive", "adaptive (A/A)", "random", "pow2", "fresh mesh", "ray-random"]
    others = ["random", "pow2", "fresh mesh"]
    played = {name: [] for name in names}
    for r in range(48):
        headline = {"adaptive", "adaptive (A/A)", "fresh mesh"}  # a headline row's reference
        out = runner.sitting_out(names, headline, others, r, 48, 2, 2)
        for name in set(names) - out:
            played[name].append(r)
    assert played["adaptive"] == played["adaptive (A/A)"] == played["fresh mesh"] == list(
        range(48))
    assert played["ray-random"] == list(range(0, 48, 2))
    for name in ("random", "pow2"):  # every 4th, each on repeats the baselines played, in turns
        assert len(played[name]) == 12 and set(played[name]) <= set(played["ray-random"])
    assert played["random"] != played["pow2"]


def test_a_contender_sits_no_repeat_out_unless_it_still_plays_two() -> None:
    names, headline = ["adaptive", "random", "ray-random"], {"adaptive"}
    assert all(runner.sitting_out(names, headline, ["random"], r, 2, 2, 2) == set()
               for r in range(2))
    assert runner.sitting_out(names, headline, ["random"], 1, 4, 2, 2) == {"random",
                                                                           "ray-random"}


def test_a_fraction_with_no_counted_calls_gives_a_finite_ratio() -> None:
    import numpy as np

    def runs(slow: int) -> list[stats.RunSample | None]:
        flags = np.array([1.0] * slow + [0.0] * (100 - slow))
        return [stats.RunSample(np.zeros(100), np.zeros(100, dtype=bool),
                                {"slow_frac": flags}, {}) for _ in range(4)]

    block = stats.compare({"none": runs(0), "some": runs(10)}, ["slow_frac"],
                          contenders=["none"], baselines=["some"], control=None)["slow_frac"]
    r = stats.find(block, "none", "some")
    assert r is not None and r.value == pytest.approx((10.5 / 101) / (0.5 / 101))
    assert block["estimates"]["none"]["value"] == 0.0


def test_a_failed_call_has_no_latency_but_counts_as_lost() -> None:
    import numpy as np

    from benchmarks.harness.driver import Run

    n = 4
    run = Run(planned_s=np.arange(n) * 0.1, duration_s=np.full(n, 0.01), sent=np.arange(n) * 0.1,
              ended=np.array([0.01, 0.12, math.nan, 0.31]), ok=np.array([True, False, False, True]),
              rank=np.zeros(n, dtype=np.int64), took_s=np.full(n, 0.01), start=0.0,
              deadline=5.0, errors=[], events={})
    m = metrics.run_metrics(run, warmup_s=0.0, slowdowns=[1.0], slow_ms=25.0)
    sample = metrics.sample(run, m, 0.0, slow_ms=25.0)
    assert np.isnan(sample.latencies_ms[1])  # failed: in its place in the plan, no latency
    assert sample.censored.tolist() == [False, False, True, False]
    assert sample.flags["lost_frac"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert sample.flags["slow_frac"][2] == 1.0 and np.isnan(sample.flags["slow_frac"][1])


def test_contenders_take_turns_in_a_fresh_order_every_repeat() -> None:
    names = list("ABCDE")
    orders = [turns.order(names, r, "scenario") for r in range(6)]
    assert all(sorted(o) == names for o in orders)
    assert len({tuple(o) for o in orders}) > 1
    assert orders == [turns.order(names, r, "scenario") for r in range(6)]  # seeded


def test_peaks_in_flight_count_calls_sent_and_not_yet_ended() -> None:
    import numpy as np

    sent = np.array([0.0, 0.1, 0.2, 0.0, 1.0])
    ended = np.array([1.0, 0.3, 0.25, 0.5, 1.5])
    rank = np.array([0, 0, 0, 1, 1])
    assert drivers.peak_in_flight(sent, ended, rank, 3).tolist() == [3.0, 1.0, 0.0]


def test_headline_and_report_text_import_no_report_document() -> None:
    code = ("import sys, benchmarks.report.headline; "
            "print('benchmarks.report.document' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parents[1], check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("script", ["choose_overhead", "queued_send", "death_notice",
                                    "shard_transfer", "jax_broadcast", "torch_world",
                                    "pool_routing", "pool_map", "async_trainer"])
def test_every_side_script_keeps_its_entry_point(script: str) -> None:
    import importlib

    module = importlib.import_module(f"benchmarks.side.{script}")
    assert callable(module.main)
    assert f"python -m benchmarks.side.{script}" in (module.__doc__ or "")


def test_list_names_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in (*BALANCING, *CALL_PATH, *PREPARED, "kills", "decision_cost", "pool_map"):
        assert f"\n{name} " in f"\n{out}"
    assert "prepared" not in out


def test_a_side_scenario_headline_gets_the_same_verdict_rule() -> None:
    results = {"side": [{"name": "t", "title": "Trainer", "result": {"headline": {
        "what": "samples/s, async ÷ sync", "median": 2.0, "min": 1.8, "max": 2.2,
        "aa_noise": 0.05}}}]}
    [(what, ratio, control, verdict)] = headline.side_rows(results)
    assert what == "Trainer: samples/s, async ÷ sync"
    assert ratio == "2.00× [1.80–2.20]" and control == "1.00× [0.950–1.05]"
    assert verdict == "better"


def test_queueing_formulas() -> None:
    assert theory.mm1(0.9) == pytest.approx(10.0)
    assert theory.pow2_limit(0.9) == pytest.approx(2.614, abs=1e-3)  # Mitzenmacher: 2.6
    assert theory.pow2_limit(0.99) == pytest.approx(5.4, abs=0.1)


def test_simulated_batch_never_beats_its_lower_bound() -> None:
    scenario = sim.SimScenario("b", "batch", Service("exp", 1.0), None, 0.25, 4.0)
    for policy in ("random", "pull", "sed"):
        out, _ = sim.run_policy(sim.native_factory, policy, scenario, 8, 200, seed=3)
        assert out["makespan_over_bound"] >= 1.0 - 1e-9


def test_percentiles_count_unfinished_calls_as_lower_bounds() -> None:
    import numpy as np

    from benchmarks.harness.driver import Run

    n = 4
    run = Run(planned_s=np.zeros(n), duration_s=np.full(n, 0.01), sent=np.zeros(n),
              ended=np.array([0.01, 0.02, 0.03, math.nan]), ok=np.array([True] * 3 + [False]),
              rank=np.zeros(n, dtype=np.int64), took_s=np.full(n, 0.01), start=0.0,
              deadline=5.0, errors=[], events={})
    m = metrics.run_metrics(run, warmup_s=0.0, slowdowns=[1.0], slow_ms=25.0)
    assert m["unfinished"] == 1 and m["failed"] == 0 and m["lost"] == 1
    assert m["p99_ms"] > 4000 and m["p99_censored"]
    assert not m["p50_censored"]
    assert m["slow"] == 2  # the 30 ms call and the unfinished one
