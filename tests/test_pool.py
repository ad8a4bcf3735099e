"""`am.ActorPool`: `ray.util.ActorPool`'s behaviour (its own tests, ported), and what it adds:
deaths that fail or re-run a call instead of hanging, k slots per actor, the native balancer."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import pytest
import ray
from workers import killed, signal, wait_until, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@ray.remote(num_cpus=0, max_concurrency=4)
class Member:
    """A pool member: several calls at once (threads), so k slots can all be busy."""

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.seen: list[Any] = []

    def f(self, x: int) -> int:
        return x + 1

    def double(self, x: int) -> int:
        return 2 * x

    def tag_of(self, x: Any) -> tuple[int, Any]:
        self.seen.append(x)
        return self.tag, x

    def hold(self, sig: Any, x: Any) -> tuple[int, Any]:
        """Runs until `sig` is sent; returns (tag, x)."""
        self.seen.append(x)
        ray.get(sig.wait.remote())
        return self.tag, x

    @ray.method(num_returns=2)
    def pair(self, sig: Any) -> tuple[int, int]:
        if sig is not None:
            ray.get(sig.wait.remote())
        return 1, 2

    def fail(self, x: int) -> None:
        raise ValueError(f"bad {x}")

    def values_seen(self) -> list[Any]:
        return self.seen


_pools: list[am.ActorPool[Any]] = []


@pytest.fixture(autouse=True)
def pools_give_back_every_slot() -> Iterator[None]:
    """After each test, every pool's current mesh has no call in flight and none queued."""
    yield
    pools = list(_pools)
    _pools.clear()  # a pool left with calls fails this test only, not every test after it
    for pool in pools:
        scheduler = pool._gen.scheduler if pool._gen is not None else None
        if scheduler is not None:
            wait_until(lambda s=scheduler: not any(s.in_flight()) and not s.queued())


def members(count: int) -> list[Any]:
    """Fresh actors, tagged 0 … count-1: for a test that kills some."""
    handles = [Member.remote(tag) for tag in range(count)]  # type: ignore[attr-defined]
    ray.get([h.__ray_ready__.remote() for h in handles], timeout=60)
    return handles


@pytest.fixture(scope="module")
def shared() -> list[Any]:
    """Four actors tagged 0-3, shared by the tests that kill none (starting actors is slow)."""
    return members(4)


def pool_of(actors: Sequence[Any], **options: Any) -> am.ActorPool[Any]:
    pool: am.ActorPool[Any] = am.ActorPool(actors, **options)
    _pools.append(pool)
    return pool


def hold(sig: Any) -> Any:
    return lambda a, v: a.hold.remote(sig, v)


def tag_of(a: Any, v: Any) -> Any:
    return a.tag_of.remote(v)


# -- Ray's own tests (python/ray/tests/test_actor_pool.py), with signals where they raced ------
def test_get_next_returns_results_in_submission_order(shared: list[Any]) -> None:
    pool = pool_of(shared[:4])
    for i in range(5):
        pool.submit(lambda a, v: a.f.remote(v), i)
        assert pool.get_next(timeout=60) == i + 1


def test_get_next_unordered_returns_every_result(shared: list[Any]) -> None:
    pool = pool_of(shared[:4])
    for i in range(5):
        pool.submit(lambda a, v: a.f.remote(v), i)
    total = []
    while pool.has_next():
        total.append(pool.get_next_unordered(timeout=60))
    assert sorted(total) == [1, 2, 3, 4, 5]


def test_map_yields_results_in_order_and_map_unordered_every_result(shared: list[Any]) -> None:
    pool = pool_of(shared[:4])
    assert list(pool.map(lambda a, v: a.double.remote(v), range(5))) == [0, 2, 4, 6, 8]
    assert sorted(pool.map_unordered(lambda a, v: a.double.remote(v), range(5))) == [0, 2, 4, 6, 8]


def test_map_submits_every_value_before_it_is_iterated(shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    sig = signal()
    results = pool.map(hold(sig), ["a", "b"])
    waiters(sig, 2)  # both run, though nobody has asked for a result
    sig.send.remote()
    assert [value for _, value in results] == ["a", "b"]


def test_map_drops_leftovers_without_waiting_for_them(shared: list[Any]) -> None:
    actors = shared[:2]
    pool = pool_of(actors)
    sig = signal()
    pool.submit(hold(sig), "leftover")
    waiters(sig, 1)
    results = list(pool.map(tag_of, range(5)))  # the other actor serves them all
    assert [value for _, value in results] == [0, 1, 2, 3, 4]
    assert len({tag for tag, _ in results}) == 1
    assert not pool.has_next()
    sig.send.remote()


def test_leftovers_still_queued_are_never_sent(shared: list[Any]) -> None:
    actor = shared[0]
    pool = pool_of([actor])
    sig = signal()
    queued = f"queued by {pool!r} at {id(pool)}"
    pool.submit(hold(sig), "running")
    pool.submit(tag_of, queued)
    waiters(sig, 1)
    results = pool.map(tag_of, ["new"])
    sig.send.remote()
    assert list(results) == [(0, "new")]
    assert queued not in ray.get(actor.values_seen.remote(), timeout=60)


def test_get_next_timeout_leaves_the_result_pending(shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    sig = signal()
    pool.submit(hold(sig), 1)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.1)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1)
    assert pool.has_next()
    sig.send.remote()
    assert pool.get_next(timeout=60)[1] == 1


def test_ignore_if_timedout_drops_the_result_and_moves_on(shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    sig = signal()
    pool.submit(hold(sig), "slow")
    pool.submit(lambda a, v: a.f.remote(v), 1)
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert pool.get_next(timeout=60) == 2
    assert not pool.has_next()
    pool.submit(hold(sig), "slow again")
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next_unordered(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next()
    sig.send.remote()


def test_several_returns_come_back_as_a_list_and_time_out_cleanly(shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    for _ in range(4):
        pool.submit(lambda a, v: a.pair.remote(None), None)
    while pool.has_next():
        assert pool.get_next(timeout=None) == [1, 2]
    sig = signal()
    pool.submit(lambda a, v: a.pair.remote(v), sig)
    with pytest.raises(TimeoutError):  # Ray 2.60's pool raises TypeError here
        pool.get_next(timeout=0.1)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1)
    sig.send.remote()
    assert pool.get_next(timeout=60) == [1, 2]


def test_nothing_pending_raises_stop_iteration(shared: list[Any]) -> None:
    pool = pool_of(shared[:1])
    with pytest.raises(StopIteration):
        pool.get_next()
    with pytest.raises(StopIteration):
        pool.get_next_unordered()


def test_get_next_after_get_next_unordered_took_a_later_result_raises_value_error(
        shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    pool.submit(lambda a, v: a.f.remote(v), 1)
    assert pool.get_next_unordered(timeout=60) == 2
    pool.submit(lambda a, v: a.f.remote(v), 2)
    assert pool.get_next(timeout=60) == 3
    sig = signal()
    pool.submit(hold(sig), "first")
    pool.submit(lambda a, v: a.f.remote(v), 3)
    assert pool.get_next_unordered(timeout=60) == 4
    with pytest.raises(ValueError, match="get_next_unordered"):
        pool.get_next()
    sig.send.remote()
    assert pool.get_next_unordered(timeout=60)[1] == "first"


def test_pop_idle_returns_an_idle_actor_only(shared: list[Any]) -> None:
    actors = shared[:1]
    pool = pool_of(actors)
    sig = signal()
    pool.submit(hold(sig), 1)
    assert pool.pop_idle() is None
    assert pool.has_free() is False  # the actor is busy
    sig.send.remote()
    assert pool.get_next(timeout=60) == (0, 1)
    assert pool.has_free()
    assert pool.pop_idle() == actors[0]  # taken out of the pool
    assert pool.has_free() is False


def test_push_adds_an_actor_that_takes_waiting_submissions(shared: list[Any]) -> None:
    a1, a2, a3 = shared[:3]
    pool = pool_of([a1])
    sig = signal()
    pool.submit(hold(sig), 1)
    assert pool.has_free() is False  # a1 is busy
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(a1)
    pool.push(a2)
    assert pool.has_free()  # a2 is free
    pool.submit(hold(sig), 2)
    pool.submit(hold(sig), 3)  # waits: both busy
    assert pool.has_free() is False
    pool.push(a3)
    waiters(sig, 3)  # the waiting submission went to a3 at once
    assert pool.has_free() is False
    sig.send.remote()
    assert [pool.get_next(timeout=60) for _ in range(3)] == [(0, 1), (1, 2), (2, 3)]


# -- the pool's own semantics ------------------------------------------------------------------
def test_an_actor_is_free_once_its_call_ends_though_its_result_is_unread(
        shared: list[Any]) -> None:
    pool = pool_of(shared[:1])
    pool.submit(lambda a, v: a.f.remote(v), 1)
    wait_until(pool.has_free)
    assert pool.get_next(timeout=60) == 2


def held_then_queued(actor: Any, queued: Any) -> tuple[am.ActorPool[Any], Any, list[str]]:
    """A pool of `actor` running a call held on a signal (returned) with `queued` submitted
    behind it, and the names of the threads that will have sent `queued`."""
    pool = pool_of([actor])
    sig = signal()
    sent_from: list[str] = []

    def recorded(a: Any, v: Any) -> Any:
        sent_from.append(threading.current_thread().name)
        return a.tag_of.remote(v)

    pool.submit(hold(sig), "held")
    pool.submit(recorded, queued)
    waiters(sig, 1)
    return pool, sig, sent_from


def test_queued_submissions_go_out_from_the_thread_waiting_for_results(
        shared: list[Any]) -> None:
    """While a reader waits in `get_next`, a queued submission whose slot frees is sent by the
    reader, as Ray's pool sends from the caller's thread: no wake-up of another thread."""
    pool, sig, sent_from = held_then_queued(shared[0], "queued")

    def release_once_the_reader_waits() -> None:
        wait_until(lambda: pool._awaited is not None)  # the reader waits for "held"
        sig.send.remote()

    releaser = threading.Thread(target=release_once_the_reader_waits)
    releaser.start()
    assert pool.get_next(timeout=60) == (0, "held")
    releaser.join(60)
    assert sent_from == [threading.current_thread().name]
    assert pool.get_next(timeout=60) == (0, "queued")


def test_queued_submissions_go_out_with_no_reader_and_after_a_reader_timed_out(
        shared: list[Any]) -> None:
    queued = f"queued {uuid.uuid4()}"  # the shared actor saw others
    pool, sig, sent_from = held_then_queued(shared[0], queued)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.05)
    sig.send.remote()
    # Nobody reads: the library's loop thread sends it once the slot frees.
    wait_until(lambda: queued in ray.get(shared[0].values_seen.remote(), timeout=60))
    assert sent_from and sent_from[0] != threading.current_thread().name
    assert [pool.get_next(timeout=60) for _ in range(2)] == [(0, "held"), (0, queued)]


def test_a_method_error_reaches_the_caller_as_ray_raises_it(shared: list[Any]) -> None:
    pool = pool_of(shared[:1])
    pool.submit(lambda a, v: a.fail.remote(v), 3)
    pool.submit(lambda a, v: a.f.remote(v), 3)
    with pytest.raises(ValueError, match="bad 3") as raised:
        pool.get_next(timeout=60)
    assert isinstance(raised.value, ray.exceptions.RayTaskError)
    assert pool.get_next(timeout=60) == 4


def test_fn_that_raises_at_once_raises_from_submit_and_takes_no_place(
        shared: list[Any]) -> None:
    pool = pool_of(shared[:1])
    with pytest.raises(AttributeError):
        pool.submit(lambda a, v: a.no_such_method.remote(v), 1)
    assert not pool.has_next()
    pool.submit(lambda a, v: a.f.remote(v), 1)
    assert pool.get_next(timeout=60) == 2


def test_a_busy_actor_gets_no_second_call_while_another_is_free(shared: list[Any]) -> None:
    pool = pool_of(shared[:2])
    sig = signal()
    pool.submit(hold(sig), "held")
    waiters(sig, 1)
    for i in range(8):
        pool.submit(tag_of, i)
    served = [pool.get_next_unordered(timeout=60) for _ in range(8)]
    assert len({tag for tag, _ in served}) == 1
    sig.send.remote()
    held_by = pool.get_next_unordered(timeout=60)[0]
    assert held_by not in {tag for tag, _ in served}


def test_max_in_flight_gives_each_actor_that_many_slots(shared: list[Any]) -> None:
    pool = pool_of(shared[:2], max_in_flight=2)
    sig = signal()
    for i in range(5):
        pool.submit(hold(sig), i)
    waiters(sig, 4)
    assert ray.get(sig.waiting.remote(), timeout=60) == 4  # the fifth waits in the pool
    assert pool.has_free() is False
    assert pool.pop_idle() is None
    sig.send.remote()
    assert [value for _, value in (pool.get_next(timeout=60) for _ in range(5))] == [0, 1, 2, 3, 4]


class FirstFree(am.Balancer):
    def pick(self, loads: Sequence[am.ActorLoad], affinity: Hashable | None) -> int:
        return 0


@pytest.mark.parametrize("balancer", ["pull", "sed", "pow2", FirstFree()],
                         ids=["pull", "sed", "pow2", "python-balancer"])
def test_every_balancer_serves_a_map_in_order(balancer: Any, shared: list[Any]) -> None:
    pool = pool_of(shared[:2], balancer=balancer, max_in_flight=2)
    assert list(pool.map(lambda a, v: a.f.remote(v), range(20))) == list(range(1, 21))


def test_push_while_calls_run_keeps_their_slots_counted(shared: list[Any]) -> None:
    a1, a2 = shared[:2]
    pool = pool_of([a1])
    sig = signal()
    pool.submit(hold(sig), 1)
    waiters(sig, 1)
    pool.push(a2)
    pool.submit(hold(sig), 2)  # a1 is still busy: a2 takes it
    waiters(sig, 2)
    assert pool.has_free() is False
    pool.submit(tag_of, 3)  # waits for a slot
    assert ray.get(sig.waiting.remote(), timeout=60) == 2
    sig.send.remote()
    results = [pool.get_next(timeout=60) for _ in range(3)]
    assert results[:2] == [(0, 1), (1, 2)] and results[2][1] == 3


def test_an_emptied_pool_keeps_submissions_until_push(shared: list[Any]) -> None:
    """As Ray's pool: a submission waiting for the pool to have an actor at all is no pending
    result, so `while pool.has_next(): pool.get_next()` ends instead of waiting for ever."""
    a1, a2 = shared[:2]
    pool = pool_of([a1])
    assert pool.pop_idle() == a1
    pool.submit(tag_of, 5)
    assert not pool.has_next() and not pool.has_free()
    with pytest.raises(StopIteration):
        pool.get_next(timeout=0.1)
    with pytest.raises(StopIteration):
        pool.get_next_unordered()
    pool.push(a2)
    assert pool.has_next()
    assert pool.get_next(timeout=60) == (1, 5)


def test_a_dead_actor_fails_its_call_and_the_survivors_keep_serving() -> None:
    actors = members(3)
    pool = pool_of(actors)
    sig = signal()
    for i in range(3):
        pool.submit(hold(sig), i)
    waiters(sig, 3)
    killed(actors[1])  # dead before its call could end
    sig.send.remote()
    results, died = [], 0
    for _ in range(3):
        try:
            results.append(pool.get_next(timeout=60))
        except am.ActorDiedError:
            died += 1
    assert died == 1 and {tag for tag, _ in results} == {0, 2}
    served = pool.map(tag_of, range(12))
    assert {tag for tag, _ in served} <= {0, 2}
    assert pool.pop_idle() != actors[1]


def test_an_idle_actor_that_dies_after_a_push_leaves_the_pool() -> None:
    a1, a2 = members(2)
    pool = pool_of([a1])
    pool.push(a2)  # a new mesh over both takes over from the first
    ray.kill(a1)
    assert pool._gen is not None
    scheduler = pool._gen.scheduler
    wait_until(lambda: scheduler.status()[0] == "dead")  # told by the GCS, with no call to it
    assert {tag for tag, _ in pool.map(tag_of, range(8))} == {1}


def test_with_retries_a_dead_actors_call_runs_again_elsewhere() -> None:
    actors = members(3)
    pool = pool_of(actors, retries=1)
    sig = signal()
    for i in range(3):
        pool.submit(hold(sig), i)
    waiters(sig, 3)
    killed(actors[1])  # dead before the signal: else it may end its call as the kill lands
    sig.send.remote()
    results = [pool.get_next(timeout=60) for _ in range(3)]
    assert [value for _, value in results] == [0, 1, 2]
    assert {tag for tag, _ in results} <= {0, 2}


def test_when_every_actor_is_dead_calls_fail_instead_of_hanging() -> None:
    actors = members(2)
    pool = pool_of(actors)
    sig = signal()
    for i in range(3):
        pool.submit(hold(sig), i)  # two run, one waits for a slot
    waiters(sig, 2)
    for actor in actors:
        ray.kill(actor)
    errors = []
    for _ in range(3):
        with pytest.raises(am.MeshError) as raised:
            pool.get_next(timeout=60)
        errors.append(type(raised.value))
    # The waiting call fails as having no live actor, or as sent to one whose death the pool
    # learnt only from that call's end (the kills land in either order): it never hangs.
    assert errors[:2] == [am.ActorDiedError, am.ActorDiedError]
    assert errors[2] in (am.NoLiveActorsError, am.ActorDiedError)
    pool.submit(tag_of, 3)
    with pytest.raises(am.NoLiveActorsError):
        pool.get_next(timeout=60)
    assert pool.has_free() is False and pool.pop_idle() is None


def test_bad_input_is_refused_clearly(shared: list[Any]) -> None:
    actors = shared[:1]
    with pytest.raises(TypeError, match="Ray actor handles"):
        am.ActorPool([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="given twice"):
        am.ActorPool([actors[0], actors[0]])
    with pytest.raises(ValueError, match="max_in_flight=0"):
        am.ActorPool(actors, max_in_flight=0)
    with pytest.raises(ValueError, match="retries=-1"):
        am.ActorPool(actors, retries=-1)
    with pytest.raises(ValueError, match="'fastest'"):
        am.ActorPool(actors, balancer="fastest")  # type: ignore[arg-type]
    pool = pool_of(actors)
    with pytest.raises(ValueError, match="timeout=-1"):
        pool.get_next(timeout=-1)
    with pytest.raises(TypeError, match="push takes a Ray actor handle"):
        pool.push("actor")  # type: ignore[arg-type]
