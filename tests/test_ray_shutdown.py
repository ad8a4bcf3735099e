"""After `ray.shutdown()`, a mesh never starts Ray again: its calls fail naming the cause, its
own threads stop, and the process exits at once (a GCS client left behind kills the process
with status 1 after 60 s). Each script is a driver of its own that joins the session cluster:
its `ray.shutdown()` ends that driver, not the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import ray
from workers import TESTS, script_env

SCRIPT = os.path.join(TESTS, "ray_shutdown.py")


def test_a_mesh_that_outlives_ray_fails_its_calls_and_never_starts_a_cluster(
        ray_cluster: None) -> None:
    start = time.monotonic()
    run = subprocess.run([sys.executable, SCRIPT, ray.get_runtime_context().gcs_address],
                         env=script_env(), capture_output=True, text=True, timeout=180)
    took = time.monotonic() - start
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    for verb in ("choose", "all", "read"):
        assert "ray.shutdown() was called" in seen[verb], (verb, seen[verb])
    assert seen["initialized"] is False
    assert took < 60, f"the script took {took:.0f} s: something waited for the cluster that ended"


EXITS_WITHOUT_SHUTDOWN = """
import logging, sys, ray, actormesh as am
from workers import Worker
logging.basicConfig(level=logging.WARNING)
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.25)
print(list(mesh.methods.f.all(1).get(timeout=60)), flush=True)
"""


def test_a_script_that_ends_without_shutting_its_mesh_down_warns_of_no_death(
        ray_cluster: None) -> None:
    # Ray shuts down at the interpreter's exit and the actors this driver owns die with it:
    # expected, so no "rank 0 died and will not be restarted" on the way out.
    run = subprocess.run(
        [sys.executable, "-c", EXITS_WITHOUT_SHUTDOWN, ray.get_runtime_context().gcs_address],
        env=script_env(), capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[1, 1]"
    assert "actormesh" not in run.stderr, run.stderr[-3000:]
