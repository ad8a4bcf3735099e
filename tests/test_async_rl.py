"""examples/async_rl.py end to end, run as a newcomer runs it, on FakeEngines: the whole loop
(rollouts on an engine pool, AsyncTrainer with max_staleness=1, learner steps on a TorchMesh
of two DDP processes, a weight push with its version after every step) in well under a minute.
FakeEngines ignore the sampling settings, so nothing is learnt: the real-engine run that learns
is the example's default (see the README's "RL end to end")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "async_rl.py"
STEPS = 6
BATCH = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, Any], Path]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("async_rl")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--fake", "--steps", str(STEPS), "--batch", str(BATCH),
         "--engines", "2", "--learners", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines(), json.loads((out / "results.json").read_text()), out


def test_every_step_is_trained_and_shown(run: tuple[list[str], dict[str, Any], Path]) -> None:
    lines, summary, _ = run
    assert summary["steps"] == STEPS
    assert [r["step"] for r in summary["per_step"]] == list(range(STEPS))
    assert all(len(r["rewards"]) == BATCH for r in summary["per_step"])
    shown = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in shown] == [f"{s}/{STEPS}" for s in range(1, STEPS + 1)]
    assert all("reward" in line and "staleness" in line and "tokens/s" in line for line in shown)


def test_both_learners_step_on_a_slice_of_every_batch(
    run: tuple[list[str], dict[str, Any], Path],
) -> None:
    _, summary, _ = run
    assert all(len(r["learner"]) == 2 for r in summary["per_step"])


def test_staleness_stays_within_one_step(run: tuple[list[str], dict[str, Any], Path]) -> None:
    _, summary, _ = run
    for record, metrics in zip(summary["per_step"], summary["trainer"]):
        assert len(record["staleness"]) == BATCH
        assert all(0 <= s <= 1 for s in record["staleness"])
        # The tokens were made by weights no older than the trainer says (often newer).
        assert all(0 <= t <= s for t, s in zip(record["token_staleness"], record["staleness"]))
        assert metrics["staleness"] == record["staleness"]
    assert summary["staleness_counts"].get("1", 0) > 0  # the loop did overlap


def test_weights_are_pushed_after_every_step_with_its_version(
    run: tuple[list[str], dict[str, Any], Path],
) -> None:
    _, summary, _ = run
    assert summary["weight_versions_pushed"] == list(range(1, STEPS + 1))
    assert summary["final_weight_version"] == STEPS
    # A FakeEngine loads a one-layer subset of the Llama: embeddings, q/k/v, head.
    assert summary["tensors_pushed"] == [5] * STEPS


def test_the_run_ends_with_the_reward_line_and_writes_the_plot(
    run: tuple[list[str], dict[str, Any], Path],
) -> None:
    lines, summary, out = run
    match = re.fullmatch(r"reward (\d\.\d{3}) -> (\d\.\d{3})", lines[-1])
    assert match, lines[-1]
    assert float(match[1]) == pytest.approx(summary["reward_first"], abs=1e-3)
    assert float(match[2]) == pytest.approx(summary["reward_last"], abs=1e-3)
    assert (out / "async_rl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
