"""The examples run as a newcomer would run them (each starts its own Ray)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import ray
import typing_extensions

import actormesh as am

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


def _source_tree_without_core(tmp: Path) -> Path:
    """A copy of the package's Python files, as a checkout has them before any build."""
    source = tmp / "checkout" / "actormesh"
    shutil.copytree(Path(am.__file__).parent, source,
                    ignore=shutil.ignore_patterns("_native.*", "__pycache__"))
    return source.parent


def _import_in(path: list[Path]) -> subprocess.CompletedProcess[str]:
    """`import actormesh` in a Python that sees only `path` and what actormesh imports (no .pth
    hooks: neither an editable install's nor any other)."""
    site = {str(Path(m.__file__).parent.parent) for m in (numpy, ray, typing_extensions)}
    code = ("import actormesh, actormesh._native as n, actormesh._core as c; "
            "print(n.__file__); print(c.borrowed_from)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), *sorted(site)])}
    return subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=path[0].parent)


def test_a_checkout_ahead_of_the_installed_package_uses_its_compiled_core(tmp_path: Path) -> None:
    # What a Ray worker sees for a driver run from the repository root after `pip install .`:
    # the driver's working directory (the checkout) comes first on the worker's path.
    checkout = _source_tree_without_core(tmp_path)
    installed = tmp_path / "site-packages" / "actormesh"
    installed.mkdir(parents=True)
    shutil.copy(am._native.__file__, installed)
    done = _import_in([checkout, installed.parent])
    assert done.returncode == 0, done.stderr[-3000:]
    native, borrowed = done.stdout.split()
    assert native.startswith(str(installed)) and borrowed == str(installed)


def test_a_checkout_with_no_core_anywhere_says_how_to_build_one(tmp_path: Path) -> None:
    done = _import_in([_source_tree_without_core(tmp_path)])
    assert done.returncode != 0
    assert "no installed actormesh on sys.path has one" in done.stderr
    assert "pip install ." in done.stderr
