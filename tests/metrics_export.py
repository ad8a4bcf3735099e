"""A mesh's metrics read back from Ray's Prometheus endpoint, in a process of its own (it needs
a cluster started with `_metrics_export_port`, and the tests' session cluster is not). Run by
tests/test_metrics.py; prints one JSON line: the mesh's stats() and the metric lines seen.

Needs Ray's metrics agent (Ray's `default` extra, `pip install actormesh[metrics]`).
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request

import ray
from workers import Worker

import actormesh as am

WANTED = ('ray_actormesh_actor_events_total{', 'event="died"', 'event="restarted"',
          "ray_actormesh_in_flight{", "ray_actormesh_queued{", 'outcome="ok"', 'outcome="error"',
          "ray_actormesh_call_seconds_count{", "ray_actormesh_batch_calls_count{")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int, *parts: str) -> list[str]:
    """The lines of Ray's Prometheus page that hold every one of `parts`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text: str = page.read().decode()
    return [line for line in text.splitlines() if all(p in line for p in parts)]


def settled(lines: list[str]) -> bool:
    """Whether the export holds every call and event made (Ray's agent exports in turns)."""
    def value(*parts: str) -> float:
        found = [line for line in lines if all(p in line for p in parts)]
        return float(found[0].rsplit(" ", 1)[1]) if found else -1.0

    return (value('outcome="ok"', 'method="f"') == 3 and value('outcome="error"') == 1
            and value('event="died"') == 1 and value('event="restarted"') == 1)


def main() -> None:
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _metrics_export_port=port)
    mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.25, max_restarts=1, name="metered")
    assert am.get([mesh.methods.f.choose(i) for i in range(3)], timeout=60) == [0, 1, 2]
    failed = mesh.methods.fail.options(return_exceptions=True).choose("boom").get(timeout=60)
    assert isinstance(failed, am.ActorError)
    pid = mesh[0].methods.pid.choose().get(timeout=60)
    ray.kill(mesh.actors[0], no_restart=False)
    deadline = time.monotonic() + 60
    while mesh.stats()["actor_events"]["restarted"] < 1:  # the death, then the restart
        if time.monotonic() > deadline:
            sys.exit(f"no restart seen: {mesh.stats()}")
        time.sleep(0.05)
    assert mesh[0].methods.pid.choose().get(timeout=60) != pid
    lines: list[str] = []
    deadline = time.monotonic() + 90  # Ray's agent exports every few seconds
    while time.monotonic() < deadline:
        try:
            lines = scrape(port, "actormesh", 'mesh="metered"')
        except OSError:
            lines = []
        if all(any(w in line for line in lines) for w in WANTED) and settled(lines):
            break
        time.sleep(1)
    print(json.dumps({"stats": mesh.stats(), "lines": lines}), flush=True)
    mesh.shutdown()


if __name__ == "__main__":
    main()
