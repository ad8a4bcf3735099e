"""One local Ray cluster for the whole test session (starting Ray per test costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address="local",  # a cluster of its own, even if another runs on this machine
        num_cpus=8,
        # Actor processes import the test workers by module name.
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        include_dashboard=False,
        object_store_memory=200 * 1024**2,
        log_to_driver=False,
        configure_logging=False,
    )
    yield
    ray.shutdown()
