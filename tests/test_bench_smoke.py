"""The benchmark harness runs end to end at tiny sizes and writes its three outputs.

A smoke test of the harness, not a benchmark: it asserts that results.json, report.md and the
plots are written and well-formed, never how fast anything was.
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
from benchmarks import metrics, sim  # noqa: E402
from benchmarks.workloads import Service  # noqa: E402

SECTIONS = ["uniform50", "tiny_noop", "killed", "sim", "decision_cost"]
# Every kind of contender, kept few: each run of the kill scenario waits for a restart.
CONTENDERS = ["pow2", "pull", "ray-random", "ActorPool"]


@pytest.fixture(scope="module")
def smoke_run(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    argv = ["--smoke", "--out", str(out), "--only", *SECTIONS, "--contenders", *CONTENDERS]
    assert bench.main(argv) == 0
    return out


def _load(out: Path) -> dict[str, Any]:
    with open(out / "results.json") as f:
        return json.load(f)


def test_writes_results_report_and_plots(smoke_run: Path) -> None:
    names = set(os.listdir(smoke_run))
    assert {"results.json", "report.md"} <= names
    assert any(n.endswith(".png") for n in names)
    for name in names:
        if name.endswith(".png"):
            assert (smoke_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_json_has_machine_versions_and_every_selected_section(smoke_run: Path) -> None:
    results = _load(smoke_run)
    assert results["machine"]["nproc"] >= 1 and results["machine"]["cpu_model"]
    assert results["versions"]["ray"] and results["versions"]["actormesh"]
    assert [s["name"] for s in results["scenarios"]] == ["uniform50", "tiny_noop", "killed"]
    assert results["decision_cost"]["rows"] and results["simulation"]["scenarios"]
    assert results["headlines"]


def test_every_scenario_has_every_contender_with_repeats(smoke_run: Path) -> None:
    results = _load(smoke_run)
    expected = {c["name"] for c in results["contenders"]}
    assert expected == set(CONTENDERS)
    for scenario in results["scenarios"]:
        assert {c["name"] for c in scenario["contenders"]} == expected
        for c in scenario["contenders"]:
            assert len(c["runs"]) == scenario["repeats"] >= 1
            assert c["runs"][0]["calls"] > 0


def test_report_names_a_winner_per_scenario(smoke_run: Path) -> None:
    text = (smoke_run / "report.md").read_text()
    assert "## Headlines" in text and "SIMULATED" in text
    for title in ("Uniform load, 50%", "Tiny calls: no-op", "An actor killed mid-run"):
        section = text.split(f"## {title}")[1].split("\n## ")[0]
        assert " won on " in section and "| contender |" in section


def test_the_simulation_makes_the_reference_decisions(smoke_run: Path) -> None:
    rows = _load(smoke_run)["simulation"]["reference"]["rows"]
    assert rows and all(r["identical"] for r in rows)


def test_report_can_be_rebuilt_from_results_json(smoke_run: Path, tmp_path: Path) -> None:
    assert bench.main(["--report", str(smoke_run / "results.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# actormesh benchmark results")


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
    m = metrics.run_metrics(run, warmup_s=0.0, slowdowns=[1.0])
    assert m["unfinished"] == 1 and m["failed"] == 0 and m["lost"] == 1
    assert m["p99_ms"] > 4000 and m["p99_censored"]
    assert not m["p50_censored"]
