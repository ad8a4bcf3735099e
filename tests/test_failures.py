"""Failures on a real cluster: deaths fail only their calls, restarts keep identity, retries."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import logging
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
import ray
from workers import AsyncWorker, ComesBackOnSignal, Worker, signal, wait_until, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_a_death_fails_only_the_calls_on_that_actor() -> None:
    with am.ActorMesh(Worker, shape={"x": 3}, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        sig = signal()
        doomed = mesh[1].methods.block.choose(sig)
        waiters(sig, 1)
        ray.kill(mesh.actors[1])
        with pytest.raises(am.ActorDiedError, match=r"rank 1 \(x=1\)") as info:
            doomed.get(timeout=60)
        assert info.value.rank == 1 and info.value.coords == {"x": 1}
        assert list(mesh[0:1].methods.rank.all().get(timeout=60)) == [0]
        wait_until(lambda: mesh.load().alive == [True, False, True])
        assert mesh.load() == [0, 0, 0]


def test_choose_stops_routing_to_an_idle_actor_that_died() -> None:
    with am.ActorMesh(Worker, shape=3, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[2])  # no call in flight: the death notice alone marks it
        wait_until(lambda: not mesh.load().alive[2])
        picks = {mesh.methods.rank.choose().get(timeout=60) for _ in range(30)}
        assert picks <= {0, 1}


def test_retries_reroute_a_call_whose_actor_died() -> None:
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        sig = signal()
        future = mesh.methods.block.options(retries=1).choose(sig)
        waiters(sig, 1)
        victim = mesh.load().index(1)
        ray.kill(mesh.actors[victim])
        sig.send.remote()
        assert future.get(timeout=60) == 1 - victim  # answered once, by the survivor
        assert mesh.load() == [0, 0]


def test_without_live_actors_choose_fails_at_once_and_queued_calls_fail_too() -> None:
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1, max_in_flight=1) as mesh:
        mesh.wait_ready(60)
        sig = signal()
        running = mesh.methods.block.choose(sig)
        queued = mesh.methods.sleep.choose(0)
        waiters(sig, 1)
        ray.kill(mesh.actors[0])
        with pytest.raises(am.ActorDiedError):
            running.get(timeout=60)
        with pytest.raises(am.NoLiveActorsError):
            queued.get(timeout=60)
        with pytest.raises(am.NoLiveActorsError):
            mesh.methods.rank.choose().get(timeout=60)
        assert mesh.load() == [0]


def test_a_restarted_actor_keeps_rank_and_environment_and_is_routed_again() -> None:
    restarted: list[int] = []
    with am.ActorMesh(
        Worker, shape={"dp": 2}, num_cpus=0.1, max_restarts=1,
        on_restart=lambda view: restarted.append(view.points[0].rank),
    ) as mesh:
        before = mesh.methods.identity.all().get(timeout=60)
        old_pid = mesh[1].methods.pid.choose().get(timeout=60)
        ray.kill(mesh.actors[1], no_restart=False)
        # Ray reports the death of a restartable actor (ActorUnavailableError) 1-2 s later, by
        # when it has often restarted: the probe may re-admit it within one poll. The hook runs
        # only once a death was noticed and the actor answered again.
        wait_until(lambda: restarted == [1] and mesh.load().alive[1])
        assert mesh[1].methods.pid.choose().get(timeout=60) != old_pid
        assert mesh.methods.identity.all().get(timeout=60) == before
        assert routed_to(mesh) == {0, 1}


def test_placement_bundles_hold_one_actor_each() -> None:
    placement = am.Placement(bundles=[{"CPU": 0.1}, {"CPU": 0.1}])
    with am.ActorMesh(Worker, shape=2, placement=placement) as mesh:
        assert list(mesh.methods.rank.all().get(timeout=60)) == [0, 1]


def test_stress_every_call_answered_once_while_actors_die() -> None:
    """Thousands of retried calls while actors are killed and restart: none lost, and none run
    twice on live actors (each actor counts what it executed)."""
    with am.ActorMesh(Worker, shape=4, num_cpus=0.1, max_restarts=-1, args=(1,)) as mesh:
        mesh.wait_ready(60)
        rng = random.Random(7)
        futures: list[am.MeshFuture[tuple[int, int]]] = []
        kills = 0
        for i in range(3000):
            futures.append(mesh.methods.counted.options(retries=8).choose(i))
            if i % 1000 == 500:
                ray.kill(mesh.actors[rng.randrange(4)], no_restart=False)
                kills += 1
        answers = [f.get(timeout=120) for f in futures]
        assert [x for x, _ in answers] == list(range(3000))
        assert kills == 3
        wait_until(lambda: all(mesh.load().alive))
        assert mesh.load() == [0, 0, 0, 0]
        executed: Counter[int] = Counter()
        for counts in mesh.methods.execution_counts.all().get(timeout=60):
            executed.update(counts)
        # Calls that ran on a killed incarnation are not counted there; any other double run is.
        live = {pid for pid in mesh.methods.pid.all().get(timeout=60)}
        for x, pid in answers:
            if pid in live:
                assert executed[x] == 1, (x, executed[x])


# -- restarts -----------------------------------------------------------------------------------
def routed_to(mesh: am.ActorMesh[Worker]) -> set[int]:
    """The ranks that `choose` routes a burst of calls to: sent at once, they need every live
    actor (one call at a time would go to the warm actor)."""
    return set(am.get([mesh.methods.rank.choose() for _ in range(30)], timeout=60))


def test_an_on_restart_hook_may_call_the_mesh_and_wait() -> None:
    """The hook runs on the library's user thread, so waiting on the mesh there is fine."""
    seen: list[Any] = []
    back = threading.Event()

    def hook(view: am.ActorMesh[Worker]) -> None:
        seen.append((list(view.methods.rank.all().get(timeout=20)), threading.current_thread().name))
        back.set()

    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, max_restarts=1, on_restart=hook) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[1], no_restart=False)
        assert back.wait(60)
        assert seen == [([1], "actormesh-user")]
        wait_until(lambda: mesh.load().alive == [True, True])
        assert routed_to(mesh) == {0, 1}


def test_an_on_restart_hook_that_raises_is_logged_and_the_actor_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def hook(view: am.ActorMesh[Worker]) -> None:
        raise OSError("could not rejoin the group")

    with caplog.at_level(logging.ERROR, logger="actormesh"), am.ActorMesh(
        Worker, shape=2, num_cpus=0.1, max_restarts=1, on_restart=hook
    ) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[0], no_restart=False)
        wait_until(lambda: "could not rejoin the group" in caplog.text)
        wait_until(lambda: mesh.load().alive == [True, True])
        assert routed_to(mesh) == {0, 1}
    assert "on_restart of rank 0" in caplog.text


def test_calls_only_a_restarting_actor_can_serve_wait_for_it() -> None:
    sig = signal()
    with am.ActorMesh(ComesBackOnSignal, shape=1, args=(sig,), num_cpus=0.1,
                      max_restarts=1) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[0], no_restart=False)
        wait_until(lambda: mesh.load().actors[0].restarting)
        waiting = mesh.methods.rank.choose()
        with pytest.raises(TimeoutError):
            waiting.get(timeout=0.5)  # no NoLiveActorsError: the actor is coming back
        sig.send.remote()
        assert waiting.get(timeout=60) == 0


def test_a_restart_that_outlasts_restart_timeout_fails_the_waiting_calls_clearly() -> None:
    sig = signal()
    with am.ActorMesh(ComesBackOnSignal, shape=1, args=(sig,), num_cpus=0.1, max_restarts=1,
                      restart_timeout_s=1.0) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[0], no_restart=False)
        wait_until(lambda: mesh.load().actors[0].restarting)
        with pytest.raises(am.NoLiveActorsError, match=r"restart_timeout_s=1.0"):
            mesh.methods.rank.choose().get(timeout=60)
        sig.send.remote()
        wait_until(lambda: mesh.load().alive == [True])  # back after all: routed again
        assert mesh.methods.rank.choose().get(timeout=60) == 0


def test_on_restart_without_restarts_is_refused() -> None:
    with pytest.raises(ValueError, match="max_restarts=0"):
        am.ActorMesh(Worker, shape=1, on_restart=lambda view: None)


# -- the balancer sees failures -------------------------------------------------------------------
def test_an_actor_that_fails_every_call_at_once_draws_little_traffic() -> None:
    with am.ActorMesh(Worker, shape=3, num_cpus=0.1, balancer="least_loaded") as mesh:
        mesh.wait_ready(60)
        served: Counter[int] = Counter()
        for _ in range(10):
            futures = [mesh.methods.fail_on.options(return_exceptions=True).choose(0, 0.02)
                       for _ in range(6)]
            for future in futures:
                result = future.get(timeout=60)
                served[result.rank if isinstance(result, am.ActorError) else result] += 1
        assert served[0] <= 10, served  # ejected after 5 failures in a row (1 s, then 2 s)
        assert served[1] + served[2] >= 50


# -- bad input and cleanup --------------------------------------------------------------------
def test_constructor_arguments_that_do_not_fit_init_are_refused_before_any_actor_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import actormesh._mesh

    def no_actors(cls: type) -> Any:
        raise AssertionError("an actor class was built")

    monkeypatch.setattr(actormesh._mesh, "remote_class", no_actors)
    with pytest.raises(TypeError, match=r"Worker.__init__.* args=\(1, 2\)"):
        am.ActorMesh(Worker, shape=2, args=(1, 2))
    with pytest.raises(TypeError, match=r"scal"):
        am.ActorMesh(Worker, shape=2, kwargs={"scal": 3})


def test_a_mesh_dropped_without_shutdown_is_cleaned_up() -> None:
    mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.1)
    mesh.wait_ready(60)
    handle = mesh.actors[0]
    assert mesh.methods.rank.choose().get(timeout=60) in (0, 1)
    del mesh
    gc.collect()

    def dead() -> bool:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        return False

    wait_until(dead)


# -- issue 25: liveness, cancellation, chaos --------------------------------------------------
def test_an_actor_killed_for_good_during_its_hook_is_never_routed_to_again() -> None:
    """Finding 3: the end of the hook put the dead actor back into rotation."""
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def hook(view: am.ActorMesh[Worker]) -> None:
        rank = view.points[0].rank
        if rank == 1:
            started.set()
            release.wait(60)
        ran.append(rank)

    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, max_restarts=1, on_restart=hook) as mesh:
        mesh.wait_ready(60)
        ray.kill(mesh.actors[1], no_restart=False)
        assert started.wait(60)
        ray.kill(mesh.actors[1], no_restart=True)
        wait_until(lambda: not mesh.load().actors[1].restarting)  # known dead, hook running
        assert mesh.load().alive == [True, False]
        release.set()
        ray.kill(mesh.actors[0], no_restart=False)  # its hook runs after rank 1's has ended
        wait_until(lambda: ran == [1, 0] and mesh.load().alive[0])
        assert mesh.load().alive == [True, False]
        with pytest.raises(am.NoLiveActorsError):
            mesh[1].methods.rank.choose().get(timeout=60)


def test_cancelling_a_call_cancels_it_in_an_async_actor() -> None:
    """Finding 6: `cancel()` never reached the actor."""
    with am.ActorMesh(AsyncWorker, shape=1, num_cpus=0.1) as mesh:
        sig = signal()
        future = mesh.methods.cancellable.choose(sig)
        waiters(sig, 1)
        future.cancel()
        with pytest.raises(cf.CancelledError):
            future.get(timeout=60)
        wait_until(lambda: mesh.methods.cancelled.choose().get(timeout=60))
        wait_until(lambda: mesh.load() == [0])
        sig.send.remote()


def test_a_call_that_times_out_is_cancelled_in_an_async_actor() -> None:
    with am.ActorMesh(AsyncWorker, shape=1, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        sig = signal()
        future = mesh.methods.cancellable.options(timeout=3).choose(sig)
        waiters(sig, 1)  # it runs: the timeout cancels it there
        with pytest.raises(am.MeshTimeoutError):
            future.get(timeout=60)
        wait_until(lambda: mesh.methods.cancelled.choose().get(timeout=60))
        sig.send.remote()


def test_cancelled_calls_of_a_sync_actor_run_their_results_dropped_and_never_stall_it() -> None:
    """A synchronous actor runs its calls in order; Ray 2.60 stalls it for 30 s when a call not
    yet delivered to it is cancelled, so its cancelled calls run, their results dropped."""
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1, balancer="least_loaded") as mesh:
        sig = signal()
        running = mesh.methods.block.choose(sig)
        waiters(sig, 1)
        queued = [mesh.methods.f.choose(i) for i in range(6)]
        for future in queued:
            future.cancel()
        sig.send.remote()
        assert running.get(timeout=60) == 0
        for future in queued:
            with pytest.raises(cf.CancelledError):
                future.get(timeout=60)
        wait_until(lambda: mesh.load() == [0])
        assert not mesh.load().actors[0].ejected
        assert mesh.methods.f.choose(3).get(timeout=60) == 3


def test_chaos_no_call_hangs_runs_twice_without_retries_or_goes_to_a_dead_actor(
    tmp_path: Any,
) -> None:
    """6 actors restarting forever, one killed every 200 ms, hooks of a second (longer than
    nothing else waits), 3,000 calls with and without retries: every call ends, every slot comes
    back, a call without retries runs at most once (the actors log each run to a file, which
    outlives them), and only calls in flight at a kill fail with it."""
    path = str(tmp_path / "runs")
    slots, kills_wanted = 4, 15

    def hook(view: am.ActorMesh[Worker]) -> None:
        list(view.methods.rank.all().get(timeout=60))  # the hook calls the actor, then works
        time.sleep(1.0)

    with am.ActorMesh(Worker, shape=6, num_cpus=0.1, max_restarts=-1, max_in_flight=slots,
                      restart_timeout_s=15.0, on_restart=hook) as mesh:
        mesh.wait_ready(60)
        rng = random.Random(25)
        kills: list[int] = []
        stop = threading.Event()

        def killer() -> None:
            while len(kills) < kills_wanted and not stop.wait(0.2):
                victim = rng.randrange(6)
                ray.kill(mesh.actors[victim], no_restart=False)
                kills.append(victim)

        chaos = threading.Thread(target=killer)
        chaos.start()
        try:
            calls = [(i, 3 if i % 2 else 0,
                      mesh.methods.logged.options(retries=3 if i % 2 else 0).choose(
                          i, path, 0.002))
                     for i in range(3000)]
            outcomes: dict[int, Any] = {}
            for i, _, future in calls:
                try:
                    outcomes[i] = future.get(timeout=120)
                except (am.ActorDiedError, am.NoLiveActorsError) as err:
                    outcomes[i] = err
        finally:
            stop.set()
            chaos.join(30)
        wait_until(lambda: all(mesh.load().alive), timeout=120)
        wait_until(lambda: mesh.load() == [0] * 6)
        with open(path) as log:
            runs = Counter(int(line) for line in log if line.strip())
        failed = [i for i, outcome in outcomes.items() if isinstance(outcome, BaseException)]
        assert not [i for i in failed if isinstance(outcomes[i], am.NoLiveActorsError)]
        for i, retries, _ in calls:
            if not isinstance(outcomes[i], BaseException):
                assert outcomes[i] == i and runs[i] >= 1
            if not retries:
                assert runs[i] <= 1, (i, runs[i])
        assert len(kills) == kills_wanted
        assert len(failed) <= len(kills) * slots, (len(failed), kills)
