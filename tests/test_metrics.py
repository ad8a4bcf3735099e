"""A mesh's metrics reach Prometheus through Ray's metrics agent, with the names and tags of
DESIGN.md "Observability", and `mesh.stats()` holds the same figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics_export.py")


def test_calls_actor_events_and_gauges_reach_prometheus_tagged_with_the_mesh_name() -> None:
    pytest.importorskip("opencensus", reason="Ray's metrics agent needs ray[default] "
                        "(pip install actormesh[metrics])")
    here = os.path.dirname(SCRIPT)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    stats, lines = seen["stats"], seen["lines"]
    assert stats["actor_events"]["died"] == 1 and stats["actor_events"]["restarted"] == 1
    assert stats["mesh"] == "metered" and stats["in_flight"] == 0 and stats["queued"] == 0

    def value(*parts: str) -> float:
        found = [line for line in lines if all(p in line for p in parts)]
        assert found, (parts, lines)
        return float(found[0].rsplit(" ", 1)[1])

    assert value("ray_actormesh_actor_events_total{", 'event="died"') == 1
    assert value("ray_actormesh_actor_events_total{", 'event="restarted"') == 1
    assert value("ray_actormesh_calls_total{", 'method="f"', 'outcome="ok"') == 3
    assert value("ray_actormesh_calls_total{", 'method="fail"', 'outcome="error"') == 1
    assert stats["calls"]["f"]["ok"] == 3 and stats["calls"]["fail"]["error"] == 1
    assert value("ray_actormesh_call_seconds_count{", 'method="f"') == 3
    assert value("ray_actormesh_batch_calls_count{", 'method="f"') >= 1
    assert value("ray_actormesh_in_flight{") == 0
    assert value("ray_actormesh_queued{") == 0
