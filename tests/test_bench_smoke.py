"""The benchmark harness runs end to end at tiny sizes and writes what it promises.

A smoke test of the harness, not a benchmark: it asserts that results.json, report.md,
headline.md and the plots are written and carry what makes their figures honest (the commit, an
A/A control and intervals beside every ratio, the check against queueing theory), never how
fast anything was.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("rich")

from benchmarks import __main__ as bench  # noqa: E402  (the repository root is on pythonpath)
from benchmarks import metrics, sim, stats, theory  # noqa: E402
from benchmarks.workloads import Service  # noqa: E402

SECTIONS = ["straggler", "tiny_noop", "killed", "sim", "theory", "decision_cost"]
# Both sides of the A/A control, the default and the strongest baseline; kept few: each run of
# the kill scenario waits for a restart.
CONTENDERS = ["random", "pow2", "ray-random", "ActorPool"]


@pytest.fixture(scope="module")
def smoke_run(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--smoke", "--out", str(out), "--only", *SECTIONS, "--contenders", *CONTENDERS]
    assert bench.main(argv) == 0
    return out


def _load(out: Path) -> dict[str, Any]:
    with open(out / "results.json") as f:
        return json.load(f)


def test_writes_results_report_headline_and_plots(smoke_run: Path) -> None:
    names = set(os.listdir(smoke_run))
    assert {"results.json", "report.md", "headline.md"} <= names
    assert any(n.endswith(".png") for n in names)
    for name in names:
        if name.endswith(".png"):
            assert (smoke_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_record_commit_tree_state_machine_and_versions(smoke_run: Path) -> None:
    results = _load(smoke_run)
    assert results["git"]["commit"] and results["git"]["dirty"] in (True, False)
    assert results["machine"]["nproc"] >= 1 and results["machine"]["cpu_model"]
    assert results["versions"]["ray"] and results["versions"]["actormesh"]
    assert [s["name"] for s in results["scenarios"]] == ["straggler", "tiny_noop", "killed"]


def test_every_scenario_has_every_contender_with_repeats(smoke_run: Path) -> None:
    results = _load(smoke_run)
    expected = {c["name"] for c in results["contenders"]}
    assert expected == set(CONTENDERS)
    for scenario in results["scenarios"]:
        assert {c["name"] for c in scenario["contenders"]} == expected
        for c in scenario["contenders"]:
            assert len(c["runs"]) == scenario["repeats"] >= 1
            assert c["runs"][0]["calls"] > 0


def test_every_metric_has_an_aa_control_or_says_why_not(smoke_run: Path) -> None:
    for scenario in _load(smoke_run)["scenarios"]:
        for metric in scenario["metrics"]:
            control = scenario["comparisons"][metric]["control"]
            if scenario["name"] == "killed":  # the pair retries differently there
                assert control is None and "retries differently" in scenario["control_note"]
                continue
            assert (control["contender"], control["baseline"]) == ("random", "ray-random")
            assert {"value", "lo", "hi"} <= control.keys()


def test_default_is_compared_with_the_strongest_baseline_with_an_interval(
        smoke_run: Path) -> None:
    for scenario in _load(smoke_run)["scenarios"]:
        comparison = scenario["comparisons"][scenario["metrics"][0]]
        assert comparison["strongest"] in ("ray-random", "ActorPool")
        r = stats.find(comparison, "pow2", comparison["strongest"])
        assert r is not None and r.value > 0
        if stats.METRICS[r.metric].kind != "scalar":  # one repeat: only calls resample
            assert r.lo <= r.hi


def test_straggler_is_judged_on_a_fraction_of_slow_calls_beside_p99(smoke_run: Path) -> None:
    straggler = _load(smoke_run)["scenarios"][0]
    assert straggler["metrics"] == ["slow_frac", "p99_ms"]
    assert all(0 <= c["runs"][0]["slow_frac"] <= 1 for c in straggler["contenders"])


def test_headline_names_commit_contender_baseline_interval_and_control(smoke_run: Path) -> None:
    text = (smoke_run / "headline.md").read_text()
    assert f"`{_load(smoke_run)['git']['commit']}`" in text
    assert "(pow2) ÷ strongest baseline" in text and "A/A: am random ÷ random.choice" in text
    assert "One actor 20× slower · calls slower than 10× the mean service time" in text
    assert "vs ActorPool" in text or "vs random.choice" in text
    assert "×  [" not in text and "× [" in text  # ratios carry their interval


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
    assert bench.main(["--report", str(smoke_run / "results.json"), "--out", str(tmp_path)]) == 0
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
        done = native.complete(actor, started, clock, True)
        assert [(d.ticket, d.actor) for d in done] == [
            (d.ticket, d.actor) for d in twin.complete(actor, started, clock, True)]
        running += [(d.actor, clock) for d in done]
    assert native.in_flight() == twin.in_flight()


def test_a_ratio_inside_the_aa_noise_is_no_difference() -> None:
    control = stats.Ratio("p99_ms", "random", "ray-random", 1.1, 0.8, 1.4)
    def r(value: float, lo: float, hi: float) -> stats.Ratio:
        return stats.Ratio("p99_ms", "pow2", "ActorPool", value, lo, hi)
    assert stats.verdict(r(1.3, 1.2, 1.5), control) == stats.NO_DIFFERENCE
    assert stats.verdict(r(2.0, 1.5, 2.5), control) == "better"
    assert stats.verdict(r(0.7, 0.6, 0.75), control) == "worse"
    # Without a control the band is 1 alone.
    assert stats.verdict(r(1.3, 1.2, 1.5), None) == "better"


def test_a_side_scenario_headline_gets_the_same_verdict_rule() -> None:
    from benchmarks import headline

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

    from benchmarks.driver import Run

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
