"""The examples run as a newcomer would run them (each starts its own Ray).

Each example is a process of its own with a cluster of its own, and most of its time is Ray and
its workers starting (seconds of waiting on two cores), so the module starts every example it
runs at once, when its first example test begins, and each test reads its example's output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import ray
import typing_extensions

import actormesh as am

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
TIMEOUT_S = 300

# The example each test runs, and the module it needs (None: nothing beyond the test's own).
EXAMPLE_OF_TEST = {
    "test_quickstart_prints_what_the_readme_says": ("quickstart.py", None),
    "test_jax_data_parallel_loss_falls_and_parameters_agree": ("jax_data_parallel.py", "jax"),
    "test_inference_pool_routes_around_the_straggler": ("inference_pool.py", None),
    "test_the_ddp_example_trains_and_keeps_the_ranks_identical": ("torch_ddp.py", "torch"),
}


class Runs:
    """The example processes of this session's tests, started together."""

    def __init__(self, names: list[str]) -> None:
        self.processes = {
            name: subprocess.Popen([sys.executable, os.path.join(EXAMPLES, name)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "RAY_ADDRESS": ""})
            for name in names}

    def lines(self, name: str) -> list[str]:
        """The stdout lines of example `name`, once it has exited with status 0."""
        process = self.processes[name]
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 0, stderr[-3000:]
        return stdout.strip().splitlines()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.fixture(scope="module")
def examples(request: pytest.FixtureRequest) -> Iterator[Runs]:
    """Every example a test of this module collected in this session runs, started at once."""
    wanted = [EXAMPLE_OF_TEST[item.originalname] for item in request.session.items
              if getattr(item, "module", None) is request.module
              and getattr(item, "originalname", "") in EXAMPLE_OF_TEST]
    names = [name for name, module in wanted
             if module is None or _importable(module)]
    runs = Runs(names)
    yield runs
    runs.stop()


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_quickstart_prints_what_the_readme_says(examples: Runs) -> None:
    assert examples.lines("quickstart.py") == ["[2, 2, 2, 2]", "2", "[6, 7, 8, 9]", "[4, 4]"]


def test_jax_data_parallel_loss_falls_and_parameters_agree(examples: Runs) -> None:
    pytest.importorskip("jax")
    lines = examples.lines("jax_data_parallel.py")
    assert any(line.endswith("written by processes [0]") for line in lines), lines  # one writer


@pytest.mark.slow
def test_inference_pool_routes_around_the_straggler(examples: Runs) -> None:
    lines = examples.lines("inference_pool.py")
    served = {int(line.split()[1]): int(line.split()[3]) for line in lines if line.startswith("rank")}
    assert sum(served.values()) == 400
    assert served[0] < min(served[r] for r in (1, 2, 3))  # the slow replica got the least
    assert lines[-1].count("rank") == 1  # the session stayed on one replica


def test_the_ddp_example_trains_and_keeps_the_ranks_identical(examples: Runs) -> None:
    pytest.importorskip("torch")
    lines = examples.lines("torch_ddp.py")
    assert lines[0] == "2 processes joined a gloo world"
    assert lines[-1].endswith("parameters identical on every rank"), lines


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
