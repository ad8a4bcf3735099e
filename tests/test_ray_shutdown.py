"""After `ray.shutdown()`, a mesh never starts Ray again: its calls fail naming the cause, its
own threads stop, and the process exits at once (a GCS client left behind kills the process
with status 1 after 60 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_shutdown.py")


def _env() -> dict[str, str]:
    """The environment of a script of its own: the test workers importable by name."""
    here = os.path.dirname(SCRIPT)
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}


def test_a_mesh_that_outlives_ray_fails_its_calls_and_never_starts_a_cluster() -> None:
    start = time.monotonic()
    run = subprocess.run([sys.executable, SCRIPT], env=_env(), capture_output=True, text=True,
                         timeout=180)
    took = time.monotonic() - start
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    for verb in ("choose", "all", "read"):
        assert "ray.shutdown() was called" in seen[verb], (verb, seen[verb])
    assert seen["initialized"] is False
    assert took < 60, f"the script took {took:.0f} s: something waited for the cluster that ended"


EXITS_WITHOUT_SHUTDOWN = """
import logging, ray, actormesh as am
from workers import Worker
logging.basicConfig(level=logging.WARNING)
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         configure_logging=False)
mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.25)
print(list(mesh.methods.f.all(1).get(timeout=60)), flush=True)
"""


def test_a_script_that_ends_without_shutting_its_mesh_down_warns_of_no_death() -> None:
    # Ray shuts down at the interpreter's exit and the actors this driver owns die with it:
    # expected, so no "rank 0 died and will not be restarted" on the way out.
    run = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_SHUTDOWN], env=_env(),
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[1, 1]"
    assert "actormesh" not in run.stderr, run.stderr[-3000:]
