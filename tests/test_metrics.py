"""A mesh's metrics reach Prometheus through Ray's metrics agent, with the names and tags of
DESIGN.md "Observability", and `mesh.stats()` holds the same figures; deaths, restarts and
ejections are logged at WARNING on the `actormesh` logger."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import ray
from metrics_export import scrape
from workers import Worker, wait_until

import actormesh as am
from actormesh import _metrics
from actormesh._metrics import MeshMetrics
from actormesh._native import Scheduler

WANTED = ('ray_actormesh_actor_events_total{', 'event="died"', 'event="restarted"',
          "ray_actormesh_in_flight{", "ray_actormesh_queued{", 'outcome="ok"', 'outcome="error"',
          "ray_actormesh_call_seconds_count{", "ray_actormesh_batch_calls_count{")


def _exported(lines: list[str], *parts: str) -> float:
    """The value of the first line holding every part (-1 if none does)."""
    found = [line for line in lines if all(p in line for p in parts)]
    return float(found[0].rsplit(" ", 1)[1]) if found else -1.0


def _settled(lines: list[str]) -> bool:
    """Whether the export holds every call and event made (Ray's agent exports in turns)."""
    return (all(any(w in line for line in lines) for w in WANTED)
            and _exported(lines, 'outcome="ok"', 'method="f"') == 3
            and _exported(lines, 'outcome="error"') == 1
            and _exported(lines, 'event="died"') == 1
            and _exported(lines, 'event="restarted"') == 1)


def test_calls_actor_events_and_gauges_reach_prometheus_tagged_with_the_mesh_name(
    metrics_port: int,
) -> None:
    with am.ActorMesh(Worker, shape=2, num_cpus=0.25, max_restarts=1, name="metered") as mesh:
        assert am.get([mesh.methods.f.choose(i) for i in range(3)], timeout=60) == [0, 1, 2]
        failed = mesh.methods.fail.options(return_exceptions=True).choose("boom").get(timeout=60)
        assert isinstance(failed, am.ActorError)
        pid = mesh[0].methods.pid.choose().get(timeout=60)
        ray.kill(mesh.actors[0], no_restart=False)
        wait_until(lambda: mesh.stats()["actor_events"]["restarted"] >= 1, timeout=60)
        assert mesh[0].methods.pid.choose().get(timeout=60) != pid
        lines: list[str] = []
        deadline = time.monotonic() + 90  # Ray's agent exports every few seconds
        while not _settled(lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.5)  # polling an HTTP endpoint: no signal to wait on
            try:
                lines = scrape(metrics_port, "actormesh", 'mesh="metered"')
            except OSError:
                lines = []
        stats = mesh.stats()
    assert stats["actor_events"]["died"] == 1 and stats["actor_events"]["restarted"] == 1
    assert stats["mesh"] == "metered" and stats["in_flight"] == 0 and stats["queued"] == 0

    def value(*parts: str) -> float:
        assert _exported(lines, *parts) >= 0, (parts, lines)
        return _exported(lines, *parts)

    assert value("ray_actormesh_actor_events_total{", 'event="died"') == 1
    assert value("ray_actormesh_actor_events_total{", 'event="restarted"') == 1
    assert value("ray_actormesh_calls_total{", 'method="f"', 'outcome="ok"') == 3
    assert value("ray_actormesh_calls_total{", 'method="fail"', 'outcome="error"') == 1
    assert stats["calls"]["f"]["ok"] == 3 and stats["calls"]["fail"]["error"] == 1
    assert value("ray_actormesh_call_seconds_count{", 'method="f"') == 3
    assert value("ray_actormesh_batch_calls_count{", 'method="f"') >= 1
    assert value("ray_actormesh_in_flight{") == 0
    assert value("ray_actormesh_queued{") == 0


def test_each_call_of_a_task_is_counted_with_the_tasks_duration() -> None:
    metrics = MeshMetrics("counted")
    try:
        metrics.task_ended([("f", "ok")] * 3, 0.002)
        metrics.task_ended([("f", "ok"), ("f", "error"), ("g", "ok")], 0.02)
        stats = metrics.stats()
    finally:
        metrics.close()
    assert stats["calls"]["f"] == {"ok": 4, "error": 1, "cancelled": 0, "timeout": 0, "lost": 0}
    assert stats["calls"]["g"]["ok"] == 1
    assert stats["call_seconds"]["f"]["count"] == 5
    assert stats["call_seconds"]["f"]["sum"] == pytest.approx(3 * 0.002 + 2 * 0.02)
    assert stats["call_seconds"]["f"]["buckets"]["0.003"] == 3
    assert stats["batch_calls"]["f"]["count"] == 2  # a task counts under its first method
    assert "g" not in stats["batch_calls"]


def warned(caplog: pytest.LogCaptureFixture, *parts: str) -> bool:
    """Whether the `actormesh` logger said, at WARNING, one line holding every part."""
    return said(caplog, logging.WARNING, *parts) > 0


def said(caplog: pytest.LogCaptureFixture, level: int, *parts: str) -> int:
    """How many lines the `actormesh` logger said at `level` holding every part."""
    return sum(r.name == "actormesh" and r.levelno == level
               and all(p in r.getMessage() for p in parts) for r in caplog.records)


class _Awaited(logging.Handler):
    """Signals the first line of the `actormesh` logger that holds every part."""

    def __init__(self, *parts: str) -> None:
        super().__init__()
        self.parts = parts
        self.seen = threading.Event()
        self.record: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if not self.seen.is_set() and all(p in record.getMessage() for p in self.parts):
            self.record = record
            self.seen.set()


def fail_a_call(s: Scheduler, actor: int, at: float) -> None:
    s.acquire(actor)
    s.complete(actor, at, at, 1)


def test_an_ejection_is_logged_by_the_call_that_caused_it_not_by_the_next_flush(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_metrics, "FLUSH_S", 3600.0)
    awaited = _Awaited("flaky: rank 1 was ejected")
    logger = logging.getLogger("actormesh")
    logger.addHandler(awaited)
    s = Scheduler(2, "least_loaded", eject_after=3, eject_base_s=10.0)
    metrics = MeshMetrics("flaky", s)
    try:
        for _ in range(3):
            fail_a_call(s, 1, at=1.0)
        assert awaited.seen.wait(timeout=30)
    finally:
        logger.removeHandler(awaited)
        metrics.close()
    assert awaited.record is not None and awaited.record.levelno == logging.WARNING
    assert "3 or more of its calls failed in a row" in awaited.record.getMessage()


def test_ejections_and_readmissions_are_counted_and_logged_exactly_however_many(
        caplog: pytest.LogCaptureFixture) -> None:
    s = Scheduler(2, "least_loaded", eject_after=1, eject_base_s=1.0, eject_max_s=1.0)
    metrics = MeshMetrics("flaky", s)
    try:
        with caplog.at_level(logging.INFO, logger="actormesh"):
            for cycle in range(50):  # ejected, then readmitted by the next call a second later
                at = 10.0 * cycle
                fail_a_call(s, 1, at)
                decision = s.submit(0, now_s=at + 1.0)
                s.complete(decision.actor, at + 1.0, at + 1.0, 0)
            events = metrics.stats()["actor_events"]
    finally:
        metrics.close()
    assert events == {"died": 0, "restarted": 0, "ejected": 50, "readmitted": 50}
    assert said(caplog, logging.WARNING, "flaky: rank 1 was ejected") == 50
    assert said(caplog, logging.INFO, "flaky: rank 1 is routed to again") == 50


@pytest.mark.usefixtures("ray_cluster")
def test_a_death_and_the_restart_are_logged_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="actormesh"), \
            am.ActorMesh(Worker, shape=1, num_cpus=0.1, max_restarts=1) as mesh:
        mesh.wait_ready(timeout=60)
        ray.kill(mesh.actors[0], no_restart=False)
        wait_until(lambda: warned(caplog, "Worker: rank 0", "is back after a restart"))
        assert warned(caplog, "Worker: rank 0", "died; Ray is restarting it")


@pytest.mark.usefixtures("ray_cluster")
def test_an_actor_killed_for_good_is_logged_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="actormesh"), \
            am.ActorMesh(Worker, shape=1, num_cpus=0.1) as mesh:
        mesh.wait_ready(timeout=60)
        ray.kill(mesh.actors[0], no_restart=True)
        wait_until(lambda: warned(caplog, "Worker: rank 0", "died and will not be restarted"))


@pytest.mark.usefixtures("ray_cluster")
def test_an_ejection_is_logged_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    policy = am.Policy(eject_after=5, eject_base_s=60.0, eject_max_s=60.0)
    with caplog.at_level(logging.WARNING, logger="actormesh"), \
            am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=policy) as mesh:
        failing = mesh[0:1].methods.fail_on.options(return_exceptions=True)
        for _ in range(5):  # one at a time: five failures in a row
            assert isinstance(failing.choose(0, 0.0).get(timeout=60), am.ActorError)
        wait_until(lambda: warned(caplog, "Worker: rank 0 was ejected"))
        assert mesh.stats()["actor_events"]["ejected"] == 1


@pytest.mark.usefixtures("ray_cluster")
def test_an_ejection_and_a_readmission_within_one_flush_are_counted_once_each_and_logged(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_metrics, "FLUSH_S", 3600.0)  # no flush looks meanwhile
    policy = am.Policy(eject_after=1, eject_base_s=1e-6, eject_max_s=1e-6)
    with caplog.at_level(logging.INFO, logger="actormesh"), \
            am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=policy) as mesh:
        rank_0 = mesh[0:1].methods.fail_on.options(return_exceptions=True)
        assert isinstance(rank_0.choose(0, 0.0).get(timeout=60), am.ActorError)
        assert rank_0.choose(1, 0.0).get(timeout=60) == 0  # its ejection ended before this call
        wait_until(lambda: said(caplog, logging.INFO, "Worker: rank 0 is routed to again") > 0)
        assert warned(caplog, "Worker: rank 0 was ejected", "1 or more of its calls failed")
        events = mesh.stats()["actor_events"]
    assert events["ejected"] == 1 and events["readmitted"] == 1
    assert said(caplog, logging.WARNING, "Worker: rank 0 was ejected") == 1
    assert said(caplog, logging.INFO, "Worker: rank 0 is routed to again") == 1
