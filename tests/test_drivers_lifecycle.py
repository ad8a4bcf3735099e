"""Several drivers over time: what a driver leaves behind when it leaves, dies or forks, and a
mesh whose name is reused or whose registry dies."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from test_drivers import PeerDriver, unique
from workers import Signal, Worker, wait_until, waiters

import actormesh as am
from actormesh import _drivers, _named, _native

DEAD_WITHIN_S = 10.0  # "within seconds"


# -- a driver that forked, without Ray ----------------------------------------------------------
class Driver:
    """A driver process of its own with 3 calls in flight on actor 0 of the table at `path`,
    after it ran `then` (Python source that may fork; `keep` is a copy of its stdin, which a
    child reads to live until the test ends it)."""

    def __init__(self, path: str, then: str) -> None:
        code = textwrap.dedent("""
            import gc, multiprocessing, os, sys
            from actormesh import _native
            scheduler = _native.Scheduler(2, "least_loaded")
            scheduler.share_load(sys.argv[1])
            for _ in range(3):
                scheduler.acquire(0)
            keep = os.dup(0)
        """) + textwrap.dedent(then) + textwrap.dedent("""
            print("ready", flush=True)
            sys.stdin.read()
        """)
        self.process = subprocess.Popen([sys.executable, "-c", code, path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def end(self) -> None:
        """Kill it, and end the children it left (they read until its stdin closes)."""
        self.kill()
        assert self.process.stdin is not None
        self.process.stdin.close()


FORKS = {
    "os.fork": """
        if os.fork() == 0:
            os.read(keep, 1)
            os._exit(0)
    """,
    "multiprocessing fork": """
        child = multiprocessing.get_context("fork").Process(target=os.read, args=(keep, 1))
        child.start()
    """,
}


def others(scheduler: _native.Scheduler) -> list[int]:
    return [state[5] for state in scheduler.snapshot()]  # ActorLoad.others


@pytest.fixture
def reader(tmp_path: Any) -> Iterator[tuple[str, _native.Scheduler]]:
    """A driver of its own on the table `path`, which reads the others' calls."""
    path = str(tmp_path / "table")
    scheduler = _native.Scheduler(2, "least_loaded")
    scheduler.share_load(path)
    yield path, scheduler
    scheduler.unshare_load()


@pytest.mark.parametrize("fork", sorted(FORKS))
def test_the_calls_of_a_killed_driver_that_forked_stop_counting_within_seconds(
        reader: tuple[str, _native.Scheduler], fork: str) -> None:
    path, mine = reader
    driver = Driver(path, FORKS[fork])
    try:
        assert others(mine) == [3, 0]
        driver.kill()  # its child lives on
        wait_until(lambda: others(mine) == [0, 0], DEAD_WITHIN_S)
    finally:
        driver.end()


def test_a_forked_child_that_drops_its_copy_of_the_mesh_leaves_the_drivers_calls_counted(
        reader: tuple[str, _native.Scheduler]) -> None:
    path, mine = reader
    driver = Driver(path, """
        child = os.fork()
        if child == 0:
            del scheduler
            gc.collect()
            os._exit(0)
        os.waitpid(child, 0)
    """)
    try:
        assert others(mine) == [3, 0]
    finally:
        driver.end()


# -- the table's file --------------------------------------------------------------------------
def test_the_last_driver_to_leave_a_table_removes_its_file(tmp_path: Any) -> None:
    path = tmp_path / "table"
    one, two = (_native.Scheduler(2, "least_loaded") for _ in range(2))
    one.share_load(str(path))
    two.share_load(str(path))
    one.unshare_load()
    assert path.exists()
    two.unshare_load()
    assert not path.exists()


def test_a_janitor_removes_the_unused_tables_it_finds_and_nothing_else(
        reader: tuple[str, _native.Scheduler], tmp_path: Any) -> None:
    in_use, _ = reader
    left = str(tmp_path / "table-left")
    Driver(left, "").end()  # a driver without a janitor, killed: its table stays
    notes = tmp_path / "table-notes"
    notes.write_text("not a table")
    # With nothing to watch (stdin closed), the janitor sweeps the folder and exits.
    subprocess.run([sys.executable, "-I", "-S", _drivers._JANITOR, str(tmp_path), "table"],
                   stdin=subprocess.DEVNULL, timeout=60, check=True)
    assert os.path.exists(in_use) and notes.exists()
    assert not os.path.exists(left)


def test_the_table_of_a_killed_creator_is_removed_within_seconds(ray_cluster: None) -> None:
    creator = PeerDriver()
    try:
        path = creator.ask("create", unique("killed-creator"), 2)
        assert os.path.exists(path)
    finally:
        creator.kill()
    wait_until(lambda: not os.path.exists(path), DEAD_WITHIN_S)


def test_a_joined_driver_on_another_host_removes_its_table_when_it_leaves(
        ray_cluster: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("other-host")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name):
        monkeypatch.setattr(_drivers, "table_path", lambda token: str(tmp_path / token))
        joined = am.ActorMesh.connect(name)
        assert joined.methods.f.choose(3).get(timeout=60) == 3
        (table,) = tmp_path.iterdir()
        joined.shutdown()
        wait_until(lambda: not table.exists())


# -- the mesh's registry -----------------------------------------------------------------------
def test_a_joined_driver_of_a_shut_down_mesh_never_shares_with_a_newer_mesh_of_its_name(
        ray_cluster: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    name = unique("reused")
    first = am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name)
    old = am.ActorMesh.connect(name)
    with caplog.at_level(logging.INFO, logger="actormesh"):
        first.shutdown()
        with am.ActorMesh(Worker, shape=3, num_cpus=0.1, name=name) as second:
            wait_until(lambda: "the mesh was shut down by its creator" in caplog.text)
            # The newer mesh's drivers on two hosts still share their calls.
            monkeypatch.setattr(_drivers, "table_path", lambda token: str(tmp_path / token))
            joined = am.ActorMesh.connect(name)
            sig = Signal.remote()  # type: ignore[attr-defined]
            held = joined[2].methods.block.choose(sig)
            waiters(sig, 1)
            wait_until(lambda: [a.others for a in second.load().actors] == [0, 0, 1])
            sig.send.remote()
            assert held.get(timeout=60) == 2
            joined.shutdown()
    old.shutdown()


def test_a_registry_that_dies_is_started_again_and_drivers_share_through_it(
        ray_cluster: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("registry")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        monkeypatch.setattr(_drivers, "table_path", lambda token: str(tmp_path / token))
        joined = am.ActorMesh.connect(name)
        registry = _named.registry_name(_named.find(name)[0])
        ray.kill(ray.get_actor(registry), no_restart=True)
        sig = Signal.remote()  # type: ignore[attr-defined]
        held = joined[1].methods.block.choose(sig)
        waiters(sig, 1)
        wait_until(lambda: [a.others for a in mesh.load().actors] == [0, 1])
        sig.send.remote()
        assert held.get(timeout=60) == 1
        joined.shutdown()


def test_a_registry_outlives_the_failed_exchanges_of_the_driver_that_started_it(
        ray_cluster: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_drivers, "_CALL_S", 1e-9)  # every exchange times out
    name = unique("kept")
    with caplog.at_level(logging.DEBUG, logger="actormesh"), \
            am.ActorMesh(Worker, shape=1, num_cpus=0.1, name=name):
        registry = ray.get_actor(_named.registry_name(_named.find(name)[0]))
        wait_until(lambda: caplog.text.count("exchanging load with other hosts failed") >= 3)
        assert "the load registry of the mesh was gone" not in caplog.text
        assert ray.get(registry.__ray_ready__.remote(), timeout=60)  # the same actor, alive
