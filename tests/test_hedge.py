"""Hedged calls, holding calls back from a straggler, and estimates that forget start-up, on
a real cluster (the mechanics in every order are in test_call_path.py, without Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import pytest
import ray
from hedge_workers import Gate, Hedged, Paced, SlowStart, Threaded
from workers import signal, wait_until, waiters

import actormesh as am
from actormesh import _loop

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def trio(ray_cluster: None) -> Iterator[am.ActorMesh[Hedged]]:
    with am.ActorMesh(Hedged, shape=3, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        yield mesh


def runs(mesh: am.ActorMesh[Any]) -> list[int]:
    return list(mesh.methods.run_count.all().get(timeout=60))


def test_a_late_call_is_answered_by_its_copy_and_both_slots_are_freed(
    trio: am.ActorMesh[Hedged],
) -> None:
    before = sum(runs(trio))
    gate, sig = Gate.remote(), signal()  # type: ignore[attr-defined]
    future = trio.methods.first_waits.options(hedge=0.05).choose(gate, sig)
    waiters(sig, 1)
    rank = future.get(timeout=60)  # the copy's answer: the first run still waits
    assert trio.load()[rank] == 0 and sum(trio.load()) == 1
    sig.send.remote()
    wait_until(lambda: sum(trio.load()) == 0)  # the loser ran to its end on its actor
    assert sum(runs(trio)) - before == 2
    assert future.get(timeout=60) == rank


def test_a_hedge_never_goes_to_the_actor_running_the_first_copy(
    trio: am.ActorMesh[Hedged],
) -> None:
    before = runs(trio)
    gate, sig = Gate.remote(), signal()  # type: ignore[attr-defined]
    future = trio[0:1].methods.first_waits.options(hedge=0.01).choose(gate, sig)
    waiters(sig, 1)
    try:
        wait_until(lambda: bool(trio._root.router.hedges.due))  # late, and no other actor in its view
        assert trio.load() == [1, 0, 0]
    finally:
        sig.send.remote()
    assert future.get(timeout=60) == 0
    assert [a - b for a, b in zip(runs(trio), before)] == [1, 0, 0]


def test_a_loser_that_never_started_never_runs() -> None:
    actors = [Threaded.remote(tag) for tag in range(2)]  # type: ignore[attr-defined]
    mesh = am.ActorMesh.from_actors(actors)
    hog = signal()
    hogged = [mesh[1].methods.hog.choose(hog) for _ in range(2)]
    waiters(hog, 2)  # actor 1 runs two calls at once: it is full
    gate, sig = Gate.remote(), signal()  # type: ignore[attr-defined]
    future = mesh.methods.first_waits.options(hedge=0.05).choose(gate, sig)
    waiters(sig, 1)  # the first copy waits on actor 0
    try:
        wait_until(lambda: mesh.load()[1] == 3)  # the copy waits in actor 1
    finally:
        sig.send.remote()
    assert future.get(timeout=60) == 0
    # The winner's end posted the loser's cancel before the value was given: once the library's
    # loop has run what was posted, the cancel has gone to Ray, ahead of the hogs' release.
    _loop.submit(asyncio.sleep(0)).result(timeout=30)
    hog.send.remote()
    for call in hogged:
        call.get(timeout=60)
    wait_until(lambda: mesh.load() == [0, 0])
    assert ray.get([a.run_count.remote() for a in actors]) == [1, 0]  # cancelled, never run
    for actor in actors:
        ray.kill(actor)


def test_a_copy_on_an_actor_that_dies_is_just_a_lost_copy() -> None:
    with am.ActorMesh(Hedged, shape=2, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        sig = signal()
        future = mesh.methods.block.options(hedge=0.05).choose(sig)  # both copies block
        waiters(sig, 2)
        first = future._calls[0].actor
        ray.kill(mesh.actors[first], no_restart=True)
        wait_until(lambda: not mesh.load().alive[first])
        sig.send.remote()
        assert future.get(timeout=60) == 1 - first


def test_map_takes_hedge_and_yields_every_result_once(trio: am.ActorMesh[Hedged]) -> None:
    assert list(trio.methods.f.options(hedge=True).map(range(40))) == list(range(40))


def test_hedge_is_refused_for_all_and_shard_before_any_call(trio: am.ActorMesh[Hedged]) -> None:
    with pytest.raises(ValueError, match="hedge=0.1 is for choose and map"):
        trio.methods.rank.options(hedge=0.1).all()
    with pytest.raises(ValueError, match="hedge=True is for choose and map"):
        trio.methods.process.options(hedge=True).shard([1, 2, 3], 1)
    assert trio.load() == [0, 0, 0]


# -- the default policy holds a call back from a straggler, and never strands it ---------------
def test_a_call_held_back_from_a_straggler_still_goes_when_the_fast_actors_hang() -> None:
    with am.ActorMesh(Paced, shape=3, num_cpus=0.1, args=(2, 20.0)) as mesh:
        mesh.wait_ready(60)
        for _ in range(6):  # each actor's speed: 10 ms, 10 ms and 200 ms a call
            mesh.methods.work.all(0.01).get(timeout=60)
        sig = signal()
        hung = [mesh[rank].methods.block.choose(sig) for rank in (0, 1)]
        waiters(sig, 2)
        held = mesh.methods.work.choose(0.01)
        assert mesh.load() == [1, 1, 0]  # held back: a fast actor is expected to free soon
        assert held.get(timeout=60) == 2  # none does: it goes to the straggler all the same
        sig.send.remote()
        assert [f.get(timeout=60) for f in hung] == [0, 1]


# -- estimates that forget start-up -----------------------------------------------------------
def test_service_times_forget_the_start_up_the_first_call_waited_for() -> None:
    with am.ActorMesh(SlowStart, shape=2, num_cpus=0.1) as mesh:
        for _ in range(3):  # the first round is sent while the actors still start (1 s)
            mesh.methods.sleep.all(0.005).get(timeout=60)
        assert all(a.mean_latency_s < 0.1 for a in mesh.load().actors)


# -- affinity keys by value -------------------------------------------------------------------
class Recorder(am.Balancer):
    def __init__(self) -> None:
        self.keys: list[Hashable | None] = []

    def pick(self, loads: Sequence[am.ActorLoad], affinity: Hashable | None) -> int:
        self.keys.append(affinity)
        return len(self.keys) % len(loads)


def test_keys_with_one_hash_are_two_sessions_and_reach_a_balancer_as_given() -> None:
    recorder = Recorder()
    with am.ActorMesh(Hedged, shape=2, num_cpus=0.1, balancer=recorder) as mesh:
        first = mesh.methods.rank.options(affinity=-1).choose().get(timeout=60)
        second = mesh.methods.rank.options(affinity=-2).choose().get(timeout=60)
        assert hash(-1) == hash(-2) and recorder.keys == [-1, -2]
        assert first != second
        assert mesh.methods.rank.options(affinity=-1.0).choose().get(timeout=60) == first
