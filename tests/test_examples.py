"""The examples run as a newcomer would run them (each starts its own Ray)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run(name: str) -> list[str]:
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_quickstart_prints_what_the_readme_says() -> None:
    assert run("quickstart.py") == ["[2, 2, 2, 2]", "2", "[6, 7, 8, 9]", "[4, 4]"]


def test_jax_data_parallel_loss_falls_and_parameters_agree() -> None:
    pytest.importorskip("jax")
    lines = run("jax_data_parallel.py")
    assert any(line.endswith("written by processes [0]") for line in lines), lines  # one writer


@pytest.mark.slow
def test_inference_pool_routes_around_the_straggler() -> None:
    lines = run("inference_pool.py")
    served = {int(line.split()[1]): int(line.split()[3]) for line in lines if line.startswith("rank")}
    assert sum(served.values()) == 400
    assert served[0] < min(served[r] for r in (1, 2, 3))  # the slow replica got the least
    assert lines[-1].count("rank") == 1  # the session stayed on one replica
