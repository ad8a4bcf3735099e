"""The Ray actormesh needs: refused at import, with the version found, when older (no Ray
cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import ray
import tomllib

from actormesh import _ray


def test_an_older_ray_is_refused_naming_the_version_found() -> None:
    with pytest.raises(ImportError, match=r"needs ray>=2\.60 \(found ray 2\.59\.0\)"):
        _ray.require("2.59.0", ray.ObjectRef)


def test_a_ray_without_the_completion_callback_is_refused() -> None:
    with pytest.raises(ImportError, match="ObjectRef._on_ready"):
        _ray.require("2.60.0", object)


def test_the_installed_ray_is_accepted_and_a_newer_one_would_be() -> None:
    _ray.require(ray.__version__, ray.ObjectRef)
    _ray.require("3.0.0.dev0", ray.ObjectRef)


def test_importing_actormesh_with_an_older_ray_fails_with_that_message() -> None:
    code = "import ray; ray.__version__ = '2.40.0'; import actormesh"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "actormesh needs ray>=2.60 (found ray 2.40.0)" in out.stderr


def test_the_package_requires_the_ray_the_code_checks_for() -> None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    major, minor = _ray.MIN_RAY
    assert f"ray>={major}.{minor}" in dependencies
