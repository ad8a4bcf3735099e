"""`choose` through the native balancer on a real cluster: slots, policies, affinity, plug-ins."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Iterator, Sequence

import pytest
import ray
from workers import Worker, signal, wait_until, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def pair(ray_cluster: None) -> Iterator[am.ActorMesh[Worker]]:
    """Two actors, at most one call each in flight: extra calls wait in the native queue."""
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, max_in_flight=1) as mesh:
        mesh.wait_ready(60)
        yield mesh


def test_calls_beyond_max_in_flight_wait_and_are_sent_as_slots_free(
    pair: am.ActorMesh[Worker],
) -> None:
    futures = []
    for _i in range(20):
        futures.append(pair.methods.sleep.choose(0.01))
        assert max(pair.load()) <= 1
    served = Counter(f.get(timeout=60) for f in futures)
    # Every call answered once, by both actors; the split follows which actor frees first.
    assert sum(served.values()) == 20 and set(served) == {0, 1}
    assert pair.load() == [0, 0]


def test_a_queued_call_can_be_cancelled(pair: am.ActorMesh[Worker]) -> None:
    sig = signal()
    busy = [pair.methods.block.choose(sig) for _ in range(2)]
    waiting = pair.methods.rank.choose()
    assert pair.load() == [1, 1] and not waiting.done()
    waiting.cancel()
    with pytest.raises(Exception, match="cancelled"):
        waiting.get(timeout=60)
    sig.send.remote()
    for future in busy:
        future.get(timeout=60)
    assert pair.load() == [0, 0]


def test_a_queued_call_times_out_without_leaking_a_slot(pair: am.ActorMesh[Worker]) -> None:
    sig = signal()
    busy = [pair.methods.block.choose(sig) for _ in range(2)]
    late = pair.methods.rank.options(timeout=0.05).choose()
    with pytest.raises(am.MeshTimeoutError):
        late.get(timeout=60)
    sig.send.remote()
    for future in busy:
        future.get(timeout=60)
    assert pair.load() == [0, 0]
    assert pair.methods.rank.choose().get(timeout=60) in (0, 1)


@pytest.mark.parametrize("policy", ["pull", "sed", "least_loaded"])
def test_load_aware_policies_keep_calls_off_a_busy_actor(policy: str) -> None:
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=policy) as mesh:  # type: ignore[arg-type]
        mesh.wait_ready(60)
        sig = signal()
        stuck = mesh[0].methods.block.choose(sig)
        picks = [mesh.methods.rank.choose().get(timeout=60) for _ in range(10)]
        assert picks == [1] * 10
        sig.send.remote()
        stuck.get(timeout=60)


def test_affinity_sticks_to_the_actor_that_served_the_key() -> None:
    with am.ActorMesh(Worker, shape=4, num_cpus=0.1) as mesh:
        sticky = mesh.methods.rank.options(affinity="session-7")
        first = sticky.choose().get(timeout=60)
        assert [sticky.choose().get(timeout=60) for _ in range(10)] == [first] * 10


def test_affinity_escapes_an_overloaded_actor() -> None:
    policy = am.Policy("pow2", affinity_abs=1, affinity_rel=1.0)
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=policy) as mesh:
        sticky = mesh.methods.rank.options(affinity="k")
        home = sticky.choose().get(timeout=60)
        sig = signal()
        blockers = [mesh[home].methods.block.choose(sig) for _ in range(3)]
        assert sticky.choose().get(timeout=60) == 1 - home
        sig.send.remote()
        for future in blockers:
            future.get(timeout=60)


class LastCandidate(am.Balancer):
    """Always the last candidate; records what it was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], Hashable | None]] = []

    def pick(self, loads: Sequence[am.ActorLoad], affinity: Hashable | None) -> int:
        self.seen.append(([load.rank for load in loads], affinity))
        return len(loads) - 1


def test_a_python_balancer_picks_among_the_live_candidates() -> None:
    balancer = LastCandidate()
    with am.ActorMesh(Worker, shape=3, num_cpus=0.1, balancer=balancer) as mesh:
        assert mesh.methods.rank.options(affinity=("user", 1)).choose().get(timeout=60) == 2
        assert mesh[0:2].methods.rank.choose().get(timeout=60) == 1
        assert balancer.seen == [([0, 1, 2], ("user", 1)), ([0, 1], None)]


def test_a_python_balancer_returning_a_bad_index_fails_the_call_clearly() -> None:
    class Broken(am.Balancer):
        def pick(self, loads: Sequence[am.ActorLoad], affinity: Hashable | None) -> int:
            return 9

    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=Broken()) as mesh:
        with pytest.raises(ValueError, match="9"):
            mesh.methods.rank.choose().get(timeout=60)
        assert mesh.load() == [0, 0]


def test_threads_with_timeouts_and_cancels_leave_every_slot_free(pair: am.ActorMesh[Worker]) -> None:
    """Queued calls time out or are cancelled while completions drain the queue, from 4 threads."""
    import concurrent.futures as cf
    import random

    def client(seed: int) -> list[am.MeshFuture[int]]:
        rng = random.Random(seed)
        futures = []
        for _ in range(60):
            future = pair.methods.sleep.options(timeout=rng.choice([0.005, 0.02, 5.0])).choose(0.002)
            if rng.random() < 0.2:
                future.cancel()
            futures.append(future)
        return futures

    with cf.ThreadPoolExecutor(4) as pool:
        futures = [f for batch in pool.map(client, range(4)) for f in batch]
    outcomes = Counter()
    for future in futures:
        try:
            future.get(timeout=60)
            outcomes["done"] += 1
        except (am.MeshTimeoutError, cf.CancelledError):
            outcomes["dropped"] += 1
    assert outcomes["done"] + outcomes["dropped"] == 240 and outcomes["done"] > 0
    wait_until(lambda: pair.load() == [0, 0])  # calls cancelled once sent still finish
    assert pair.methods.rank.choose().get(timeout=60) in (0, 1)


def test_a_python_balancer_failing_on_a_queued_call_fails_that_call_only() -> None:
    class FailsSecondPick(am.Balancer):
        def __init__(self) -> None:
            self.picks = 0

        def pick(self, loads: Sequence[am.ActorLoad], affinity: Hashable | None) -> int:
            self.picks += 1
            if self.picks == 2:
                raise KeyError("no replica for this request")
            return 0

    with am.ActorMesh(Worker, shape=1, num_cpus=0.1, max_in_flight=1,
                      balancer=FailsSecondPick()) as mesh:
        sig = signal()
        first = mesh.methods.block.choose(sig)  # pick 1
        queued = mesh.methods.rank.choose()  # no free slot: queued without a pick
        assert not queued.done()
        sig.send.remote()
        assert first.get(timeout=60) == 0
        with pytest.raises(KeyError, match="no replica"):
            queued.get(timeout=60)  # pick 2, made when the slot freed, raised
        assert mesh.methods.rank.choose().get(timeout=60) == 0  # pick 3
        assert mesh.load() == [0]


def test_calls_backed_up_twice_over_are_sent_two_per_actor_and_each_answered_once() -> None:
    """Under a backlog of twice the actors, the default sends each freed actor a second call
    to start the instant its running one ends (calls of 6 and 18 ms: neither short nor steady,
    so no other rule would), and every call is answered once. That nothing sends it with
    `pipeline_backlog=False` is specified without Ray, in test_native_scheduler.py: on Ray a
    driver stalled by a loaded machine reads two replies at once, which can make an actor's
    calls look short for a moment, and the rule for short calls then sends a second one."""
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, balancer=am.Policy()) as mesh:
        mesh.wait_ready(60)
        durations = [0.006, 0.018] * 20
        for seconds in durations[:12]:  # the method's times, measured one call at a time
            mesh.methods.sleep.choose(seconds).get(timeout=60)
        scheduler = mesh._root.router.scheduler
        futures = [mesh.methods.sleep.choose(seconds) for seconds in durations]
        most, deadline = 0, time.monotonic() + 60
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            most = max(most, *scheduler.tasks())  # Ray tasks per actor, as the calls drain
        assert {f.get(timeout=60) for f in futures} <= {0, 1}  # every call answered
        assert most == 2
        assert scheduler.tasks() == [0, 0] and scheduler.queued() == 0


def test_the_pipeline_rule_holds_a_second_task_only_over_actors_that_run_one_call_at_a_time(
) -> None:
    """A task beyond an actor's first waits behind the running one only where the actor runs
    one call at a time (its default group, for a synchronous actor with concurrency groups)."""
    policy = am.Policy("adaptive", max_tasks=3, pipeline_s=0.005)
    assert policy.settings(1, concurrent=False)["pipeline_s"] == 0.005
    assert policy.settings(1, concurrent=True)["pipeline_s"] == 0.0  # asyncio, threaded
    assert policy.settings(1, concurrent=True, at_once=False)["pipeline_s"] == 0.005  # groups


def test_pipeline_backlog_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="pipeline_backlog=1: must be True or False"):
        am.Policy(pipeline_backlog=1)  # type: ignore[arg-type]


def test_a_call_sent_ahead_and_lost_with_its_actor_is_retried_on_another() -> None:
    """Under a backlog, actor 0 runs a blocked call with a second one waiting behind it in the
    actor; killed, it fails the one that ran (no retries) and the one sent ahead runs on 1."""
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1) as mesh:
        mesh.wait_ready(60)
        for seconds in [0.006, 0.018] * 6:  # `sleep` measured: neither short nor steady
            mesh.methods.sleep.choose(seconds).get(timeout=60)
        blocker, other = signal(), signal()
        held = mesh[1].methods.block.choose(other)
        waiters(other, 1)
        freeing = mesh[0].methods.sleep.choose(0.1)  # its end drains the queue below
        running = mesh.methods.block.choose(blocker)  # queued: actor 0's next call
        sleepy = mesh.methods.sleep.options(retries=1)
        ahead = [sleepy.choose(0.001) for _ in range(5)]  # a backlog of 2 per actor behind it
        assert freeing.get(timeout=60) == 0
        waiters(blocker, 1)
        scheduler = mesh._root.router.scheduler
        wait_until(lambda: scheduler.tasks()[0] == 2)  # ahead[0] waits inside actor 0
        ray.kill(mesh.actors[0])
        with pytest.raises(am.ActorDiedError):
            running.get(timeout=60)
        other.send.remote()
        assert held.get(timeout=60) == 1
        assert [f.get(timeout=60) for f in ahead] == [1] * 5  # each answered once, by 1
        wait_until(lambda: mesh.load() == [0, 0])
