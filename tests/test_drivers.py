"""Several drivers on one mesh: `ActorMesh.connect` from another process, and the load each
driver's balancer sees (its own calls and the other drivers')."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from workers import TESTS, AsyncWorker, Signal, Worker, script_env, wait_until, waiters

import actormesh as am
from actormesh import _drivers, _native


class PeerDriver:
    """A driver process of its own (tests/peer_driver.py) in this cluster and namespace."""

    def __init__(self) -> None:
        context = ray.get_runtime_context()
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(TESTS, "peer_driver.py"), context.gcs_address,
             context.namespace],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=script_env())
        assert self._answer(120) == "ready"

    def ask(self, op: str, *args: Any, timeout: float = 120) -> Any:
        """Run `op` in the peer and return its value; raise what it raised (an actormesh error
        or a TypeError, else an AssertionError) with the peer's message."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.process.stdin.flush()
        return self._answer(timeout)

    def _answer(self, timeout: float) -> Any:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"the peer driver did not answer within {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the peer driver exited ({self.process.wait(10)})")
        answer = json.loads(line)
        if "error" in answer:
            kind, message = answer["error"]
            error = getattr(am, kind, None)
            if not (isinstance(error, type) and issubclass(error, am.MeshError)):
                error = TypeError if kind == "TypeError" else AssertionError
            raise error(f"{kind}: {message}")
        return answer["ok"]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


@pytest.fixture(scope="module")
def peer(ray_cluster: None) -> Iterator[PeerDriver]:
    driver = PeerDriver()
    yield driver
    driver.kill()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def named_signal() -> tuple[Any, str]:
    name = unique("signal")
    return Signal.options(name=name).remote(), name  # type: ignore[attr-defined]


# -- connect ------------------------------------------------------------------------------------
def test_a_second_driver_calls_every_verb_of_a_named_mesh(peer: PeerDriver) -> None:
    name = unique("verbs")
    with am.ActorMesh(Worker, shape={"dp": 2, "tp": 2}, num_cpus=0.1, name=name):
        joined = peer.ask("connect", name)
        assert joined["shape"] == {"dp": 2, "tp": 2} and joined["size"] == 4
        assert name in joined["repr"]
        assert peer.ask("verbs", name) == {
            "all": [0, 1, 2, 3],
            "choose": 5,
            "shard": [11, 12, 13, 14, 15],  # `process`'s own dispatch (split), from the creator
            "map": [0, 1, 2, 3, 4, 5],
            "view": [2, 3],
        }
        peer.ask("shutdown", name)


def test_shutting_down_a_joined_mesh_leaves_the_actors_to_their_creator(
        peer: PeerDriver) -> None:
    name = unique("leave")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        peer.ask("connect", name)
        peer.ask("shutdown", name)
        with pytest.raises(am.MeshError, match="shut down"):
            peer.ask("choose_ranks", name, 1)
        assert list(mesh.methods.rank.all().get(timeout=60)) == [0, 1]


def test_connecting_to_an_unknown_name_is_an_error_naming_it(peer: PeerDriver) -> None:
    with pytest.raises(am.MeshError, match="no mesh named 'nowhere-to-be-found'"):
        peer.ask("connect", "nowhere-to-be-found")


def test_a_mesh_shut_down_by_its_creator_can_no_longer_be_connected(
        ray_cluster: None) -> None:
    name = unique("gone")
    am.ActorMesh(Worker, shape=1, num_cpus=0.1, name=name).shutdown()
    with pytest.raises(am.MeshError, match=f"no mesh named '{name}'"):
        am.ActorMesh.connect(name)


def test_connecting_while_the_creator_shuts_the_mesh_down_is_refused(
        ray_cluster: None, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("closing")
    mesh = am.ActorMesh(Worker, shape=1, num_cpus=0.1, name=name)
    killing, go_on = threading.Event(), threading.Event()
    kill = ray.kill

    def slow_kill(handle: Any, **kwargs: Any) -> None:
        killing.set()
        go_on.wait(60)
        kill(handle, **kwargs)

    monkeypatch.setattr(ray, "kill", slow_kill)
    shutting = threading.Thread(target=mesh.shutdown)
    shutting.start()
    try:
        assert killing.wait(60)
        with pytest.raises(am.MeshError, match=f"mesh '{name}' is being shut down"):
            am.ActorMesh.connect(name)
    finally:
        go_on.set()
        shutting.join(60)


def test_connecting_to_a_mesh_with_an_actor_gone_is_an_error_naming_the_mesh_and_rank(
        ray_cluster: None) -> None:
    name = unique("incomplete")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        ray.kill(mesh.actors[1], no_restart=True)
        wait_until(lambda: not mesh.load().alive[1])
        wait_until(lambda: not _named_actor_exists(f"{name}.1"))
        with pytest.raises(am.MeshError, match=rf"mesh '{name}' is incomplete.*rank 1"):
            am.ActorMesh.connect(name)


def _named_actor_exists(name: str) -> bool:
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def test_connect_with_the_class_types_the_mesh_and_refuses_another_class(
        ray_cluster: None) -> None:
    name = unique("typed")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name):
        joined = am.ActorMesh.connect(name, Worker)
        assert joined.methods.add.choose(1, 2).get(timeout=60) == 3
        joined.shutdown()
        with pytest.raises(TypeError, match=f"mesh '{name}' is a mesh of Worker"):
            am.ActorMesh.connect(name, AsyncWorker)


def test_a_joined_mesh_refuses_arguments_that_do_not_fit_at_the_call(ray_cluster: None) -> None:
    name = unique("checked")
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1, name=name):
        joined = am.ActorMesh.connect(name)
        try:
            with pytest.raises(TypeError, match=r"Worker\.add\(x, y\): missing a required"):
                joined.methods.add.choose(1)
            assert joined.methods.add.choose(1, y=2).get(timeout=60) == 3
        finally:
            joined.shutdown()


def test_connect_refuses_bad_settings_before_it_looks_the_mesh_up(ray_cluster: None) -> None:
    with pytest.raises(ValueError, match="restart_timeout_s=0"):
        am.ActorMesh.connect("any", restart_timeout_s=0)
    with pytest.raises(TypeError, match="name of a mesh"):
        am.ActorMesh.connect("")


# -- the load every driver sees ----------------------------------------------------------------
def test_a_driver_sees_the_calls_another_driver_has_in_flight(peer: PeerDriver) -> None:
    name = unique("seen")
    with am.ActorMesh(Worker, shape=4, num_cpus=0.1, name=name) as mesh:
        peer.ask("connect", name)
        sig, signal_name = named_signal()
        peer.ask("hold", name, signal_name, 3)
        waiters(sig, 3)
        load = mesh.load()
        assert sum(load) == 3 and sum(a.others for a in load.actors) == 3
        free = load.index(0)
        # The creator's balancer routes around the other driver's calls.
        assert mesh.methods.rank.choose().get(timeout=60) == free
        sig.send.remote()
        held = peer.ask("release")
        assert sorted(held) == sorted(r for r in range(4) if r != free)
        wait_until(lambda: sum(mesh.load()) == 0)


def test_the_joined_driver_sees_the_creators_calls(peer: PeerDriver) -> None:
    name = unique("seen-back")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        peer.ask("connect", name)
        sig = Signal.remote()  # type: ignore[attr-defined]
        held = mesh[1].methods.block.choose(sig)
        waiters(sig, 1)
        assert peer.ask("load", name) == [[0, 0, True], [1, 1, True]]
        assert peer.ask("choose_ranks", name, 3) == [0, 0, 0]
        sig.send.remote()
        assert held.get(timeout=60) == 1


def test_an_actor_killed_is_seen_by_both_drivers(peer: PeerDriver) -> None:
    name = unique("killed")
    with am.ActorMesh(Worker, shape=3, num_cpus=0.1, name=name) as mesh:
        peer.ask("connect", name)
        ray.kill(mesh.actors[1], no_restart=True)
        wait_until(lambda: not mesh.load().alive[1])
        assert peer.ask("wait_dead", name, 1)
        assert 1 not in peer.ask("choose_ranks", name, 6)
        assert 1 not in [mesh.methods.rank.choose().get(timeout=60) for _ in range(6)]


def test_when_the_creator_shuts_the_mesh_down_a_joined_driver_has_no_actor_left(
        peer: PeerDriver) -> None:
    name = unique("creator-gone")
    mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name)
    peer.ask("connect", name)
    mesh.shutdown()
    assert peer.ask("wait_dead", name, 0) and peer.ask("wait_dead", name, 1)
    with pytest.raises(am.NoLiveActorsError, match="no live actor"):
        peer.ask("choose_ranks", name, 1)
    peer.ask("shutdown", name)


def test_the_calls_of_a_driver_that_died_stop_counting(ray_cluster: None) -> None:
    name = unique("crashed")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        doomed = PeerDriver()
        try:
            doomed.ask("connect", name)
            sig, signal_name = named_signal()
            doomed.ask("hold", name, signal_name, 2)
            waiters(sig, 2)
            assert [a.others for a in mesh.load().actors] == [1, 1]
        finally:
            doomed.kill()
        wait_until(lambda: sum(a.others for a in mesh.load().actors) == 0)
        sig.send.remote()


# -- the shared table, without Ray ---------------------------------------------------------------
def two_drivers(tmp_path: Any, actors: int, policy: str = "adaptive") -> list[_native.Scheduler]:
    """The schedulers of two drivers of one mesh on one host: they share a table."""
    schedulers = [_native.Scheduler(actors, policy, seed=1) for _ in range(2)]
    for scheduler in schedulers:
        scheduler.share_load(str(tmp_path / "table"))
    return schedulers


def test_two_schedulers_on_one_table_see_each_others_calls(tmp_path: Any) -> None:
    one, two = two_drivers(tmp_path, 3)
    one.acquire(0)
    one.acquire(0)
    two.acquire(2)
    assert [(s[0], s[5]) for s in one.snapshot()] == [(2, 0), (0, 0), (0, 1)]
    assert [(s[0], s[5]) for s in two.snapshot()] == [(0, 2), (0, 0), (1, 0)]
    assert two.in_flight() == [0, 0, 1]  # what it accounts for is its own


@pytest.mark.parametrize("policy", ["adaptive", "least_loaded", "pull", "sed", "pow2"])
def test_every_policy_counts_the_other_drivers_calls(tmp_path: Any, policy: str) -> None:
    other, mine = two_drivers(tmp_path, 2, policy)
    for _ in range(3):
        other.acquire(0)
    mine.snapshot()  # learn now rather than at the next refresh
    assert mine.submit(0).actor == 1


def test_slots_bound_a_drivers_own_calls_not_the_others(tmp_path: Any) -> None:
    other, mine = two_drivers(tmp_path, 1, "pull")
    other.acquire(0)
    assert mine.submit(0).actor == 0  # the other driver's call takes no slot of this one


def test_remote_counts_add_to_the_table() -> None:
    mine = _native.Scheduler(2, "least_loaded")
    mine.share_load(None)
    mine.set_remote_load([4, 1])
    assert [s[5] for s in mine.snapshot()] == [4, 1]
    assert mine.submit(0).actor == 1


def test_a_driver_without_a_usable_table_shares_through_the_registry(
        ray_cluster: None, tmp_path: Any, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("no-table")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        monkeypatch.setattr(_drivers, "table_path", lambda token: str(tmp_path / "no" / token))
        with caplog.at_level(logging.WARNING, logger="actormesh"):
            joined = am.ActorMesh.connect(name)
        assert f"{name}: cannot share the load with other drivers on this host" in caplog.text
        sig = Signal.remote()  # type: ignore[attr-defined]
        held = joined[0].methods.block.choose(sig)
        waiters(sig, 1)
        wait_until(lambda: [a.others for a in mesh.load().actors] == [1, 0])
        sig.send.remote()
        assert held.get(timeout=60) == 0
        joined.shutdown()


def test_drivers_on_two_hosts_see_each_others_calls_through_the_registry(
        ray_cluster: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique("hosts")
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, name=name) as mesh:
        # Another host: a table of its own (the creator's is in /dev/shm).
        monkeypatch.setattr(_drivers, "table_path", lambda token: str(tmp_path / token))
        joined = am.ActorMesh.connect(name)
        sig = Signal.remote()  # type: ignore[attr-defined]
        theirs = joined[1].methods.block.choose(sig)
        mine = mesh[0].methods.block.choose(sig)
        waiters(sig, 2)
        wait_until(lambda: [a.others for a in mesh.load().actors] == [0, 1])
        wait_until(lambda: [a.others for a in joined.load().actors] == [1, 0])
        sig.send.remote()
        assert (mine.get(timeout=60), theirs.get(timeout=60)) == (0, 1)
        joined.shutdown()
        wait_until(lambda: [a.others for a in mesh.load().actors] == [0, 0])


def test_a_table_made_for_another_number_of_actors_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "table")
    first = _native.Scheduler(2, "adaptive")
    first.share_load(path)
    with pytest.raises(RuntimeError, match="is for 2 actors, not 3|has .* bytes"):
        _native.Scheduler(3, "adaptive").share_load(path)


def test_unsharing_forgets_the_other_drivers(tmp_path: Any) -> None:
    other, mine = two_drivers(tmp_path, 1)
    other.acquire(0)
    assert mine.snapshot()[0][5] == 1
    mine.unshare_load()
    assert mine.snapshot()[0][5] == 0
    other.unshare_load()
    mine.share_load(str(tmp_path / "table"))
    assert mine.snapshot()[0][5] == 0  # the row of a driver that left counts nothing
