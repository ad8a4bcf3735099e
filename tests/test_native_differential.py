"""The native scheduler against the plain-Python reference (benchmarks/reference.py).

Both get the same seeded random sequence of events — submits of several methods (one of them
never batched) to several groups with and without affinity, completions of lone calls and of
batches, acquires, cancels, deaths, restarts, new groups, hedges, the end of holds — and must
return the same decisions (batches included, call for call), raise the same errors and report the
same loads, estimates and percentiles after every event. One actor is a straggler, so that calls
are held back from it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from actormesh import _native
from benchmarks import reference


def spread_picker(
    ranks: list[int], in_flight: list[int], latency: list[float], key: int | None,
    payload: object = None,
) -> int:
    """A deterministic picker that depends on everything it is given."""
    measured = sum(1 for x in latency if not math.isnan(x))
    return (sum(in_flight) + measured + (key or 0) + ranks[0]) % len(ranks)


def flaky_picker(
    ranks: list[int], in_flight: list[int], latency: list[float], key: int | None,
    payload: object = None,
) -> int:
    """Fails for one key in five, so that picks fail inside submits and inside drains."""
    if key is not None and key % 5 == 0:
        raise ArithmeticError(f"no pick for key {key}")
    return spread_picker(ranks, in_flight, latency, key)


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("random", {}),
    ("round_robin", {}),
    ("pow2", {}),
    ("least_loaded", {}),
    ("pull", {}),
    ("sed", {}),
    ("sed", {"prior_s": 0.003}),
    ("pow2", {"affinity_abs": 0, "affinity_rel": 1.0, "affinity_capacity": 3}),
    ("least_loaded", {"affinity_abs": 1, "affinity_rel": 2.0, "affinity_capacity": 0}),
    ("external", {"picker": spread_picker}),
    ("external", {"picker": flaky_picker}),
    ("adaptive", {"max_tasks": 2}),
    ("adaptive", {"max_tasks": 2, "coalesce": 8, "pipeline_s": 0.002}),
    ("adaptive", {"coalesce": 64, "batch_budget_s": 0.01, "max_tasks": 3}),
    ("pull", {"coalesce": 4}),
    ("least_loaded", {"coalesce": 5, "max_tasks": 2, "pipeline_s": 0.004}),
    ("pow2", {"coalesce": 3, "affinity_abs": 0, "affinity_rel": 1.0}),
    ("sed", {"coalesce": 6, "max_tasks": 1}),
    ("external", {"picker": flaky_picker, "coalesce": 4}),
    ("adaptive", {"max_tasks": 1, "hold_ratio": 3.0}),
    ("adaptive", {"max_tasks": 2, "pipeline_s": 0.004, "hold_ratio": 1.5, "coalesce": 4}),
    ("adaptive", {"max_tasks": 2, "pipeline_s": 1e-4, "pipeline_backlog": True,
                  "hold_ratio": 3.0}),
    ("adaptive", {"max_tasks": 3, "pipeline_s": 1e-4, "pipeline_backlog": True, "coalesce": 4}),
    ("least_loaded", {"max_tasks": 2, "pipeline_s": 1e-4, "pipeline_backlog": True}),
    ("external", {"picker": spread_picker, "max_tasks": 2, "pipeline_s": 1e-4,
                  "pipeline_backlog": True}),
]


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call returned or raised, in a form both implementations can be compared on."""
    try:
        return ("returned", plain(call()))
    except Exception as err:  # compared, not swallowed
        if type(err).__name__ == "PickerError":
            cause = type(err.__cause__).__name__
            return ("PickerError", cause, plain(err.dispatched), plain(list(err.failed)))
        return ("raised", type(err).__name__)


def plain(value: Any) -> Any:
    """Decisions as (tickets of the task, actor), and a call that went to no actor as its bare
    ticket (the reference hands calls that can never run back as tickets, the native core as
    decisions)."""
    if isinstance(value, (_native.Decision, reference.Decision)):
        tickets = tuple(value.tickets) or (value.ticket,)
        return value.ticket if value.actor < 0 else (tickets, value.actor)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def same_floats(a: list[float], b: list[float]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def run_both(
    policy: str, settings: dict[str, Any], max_in_flight: int, seed: int, steps: int
) -> None:
    rng = random.Random(seed)
    num_actors = rng.randint(1, 9)
    kwargs = {"max_in_flight": max_in_flight, "seed": seed, **settings}
    native = _native.Scheduler(num_actors, policy, **kwargs)
    ref = reference.Scheduler(num_actors, policy, **kwargs)
    groups = [0]
    clock = 0.0
    log: list[str] = []
    running: list[tuple[int, int]] = []  # (actor, calls) of every task in flight

    def same(name: str, *args: Any, **kwargs: Any) -> Any:
        """Calls `name` on both; they must return or raise alike."""
        log.append(f"{name}{args}{kwargs or ''}")
        got = outcome(lambda: getattr(native, name)(*args, **kwargs))
        want = outcome(lambda: getattr(ref, name)(*args, **kwargs))
        assert got == want, "\n".join(log[-20:])
        return want

    def started(result: tuple[Any, ...]) -> None:
        """Tracks the tasks a returned list of decisions started."""
        if result[0] == "returned" and isinstance(result[1], list):
            running.extend((actor, len(tickets)) for tickets, actor in result[1])
        elif result[0] == "PickerError":
            running.extend((actor, len(tickets)) for tickets, actor in result[2])

    methods = [0, same("add_method", False)[1], same("add_method", True)[1]]
    straggler = rng.randrange(num_actors)
    report_rate = rng.choice([0.5, 0.02])  # rare reports: they expire between two
    for _ in range(steps):
        roll = rng.random()
        if not any(ref.alive()):
            roll = 0.95  # bring an actor back
        if roll < 0.40 or not running:
            key = None if rng.random() < 0.4 else rng.choice([0, 1, 2, 3, 4, 5, -7, 2**64 - 3])
            result = same("submit", rng.choice(groups), key, method=rng.choice(methods),
                          alone=rng.random() < 0.05, now_s=clock if rng.random() < 0.7 else None)
            if result[0] == "returned" and isinstance(result[1], tuple):
                running.append((result[1][1], 1))
        elif roll < 0.76:
            clock += rng.expovariate(1000.0)
            begun = clock - rng.choice([0.0, rng.expovariate(300.0)])
            method = rng.choice(methods)
            if rng.random() < 0.98:  # a task that is running
                actor, calls = running.pop(rng.randrange(len(running)))
                if actor == straggler:
                    begun -= 0.02
                failed = 0 if rng.random() < 0.9 else rng.randint(1, calls)
                # the actor's own report of its busy time, when it sent one (a task of several)
                busy = math.nan if rng.random() >= report_rate else rng.choice(
                    [0.0, rng.expovariate(2000.0) * calls, clock - begun])
                started(same("complete", actor, begun, clock, failed, calls=calls,
                             method=method, timed=rng.random() < 0.9, busy_s=busy))
            else:  # any actor and count, to check extra completes
                calls = rng.randint(1, 3)
                started(same("complete", rng.randrange(num_actors), begun, clock,
                             rng.randint(0, calls), calls=calls, method=method))
        elif roll < 0.78:
            result = same("hedge", rng.choice(groups), rng.randrange(num_actors),
                          rng.random() < 0.5)
            if result[0] == "returned" and result[1] >= 0:
                running.append((result[1], 1))
        elif roll < 0.80:
            clock += rng.expovariate(100.0)
            started(same("expire_holds", clock))
        elif roll < 0.82:
            actor = rng.randrange(num_actors)
            same("acquire", actor)
            running.append((actor, 1))
        elif roll < 0.87:
            same("cancel", rng.randint(1, ref._next_ticket))
        elif roll < 0.90:
            same("mark_dead", rng.randrange(num_actors))
        elif roll < 0.97:
            started(same("mark_alive", rng.randrange(num_actors)))
        else:
            members = rng.sample(range(num_actors), rng.randint(1, num_actors))
            result = same("add_group", members)
            if result[1] not in groups:
                groups.append(result[1])
        assert native.in_flight() == ref.in_flight(), "\n".join(log[-20:])
        assert native.tasks() == ref.tasks()
        assert native.alive() == ref.alive()
        assert native.queued() == ref.queued()
        assert same_floats(native.mean_latency_s(), ref.mean_latency_s())
        assert native.hold_deadline_s() == ref.hold_deadline_s()
    for group in groups:
        assert native.group_members(group) == ref.group_members(group)
    assert same_floats([native.method_latency_s(m) for m in methods],
                       [ref.method_latency_s(m) for m in methods])
    for q in (0.5, 0.95, 1.0):
        assert same_floats([native.method_quantile_s(m, q) for m in methods],
                           [ref.method_quantile_s(m, q) for m in methods])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_in_flight", [0, 1, 3])
@pytest.mark.parametrize(
    ("policy", "settings"), CONFIGS, ids=lambda c: c if isinstance(c, str) else ""
)
def test_native_and_reference_make_the_same_decisions(
    policy: str, settings: dict[str, Any], max_in_flight: int, seed: int
) -> None:
    run_both(policy, settings, max_in_flight, seed, steps=400)


@pytest.mark.parametrize("policy", ["random", "pow2", "least_loaded", "sed", "adaptive"])
def test_native_and_reference_agree_on_a_large_mesh(policy: str) -> None:
    """Past the sizes where heaps and Fenwick trees are shallow."""
    native = _native.Scheduler(300, policy, max_in_flight=2, seed=99)
    ref = reference.Scheduler(300, policy, max_in_flight=2, seed=99)
    rng = random.Random(99)
    running: list[int] = []
    clock = 0.0
    for _ in range(3000):
        if rng.random() < 0.55 or not running:
            got, want = native.submit(0), ref.submit(0)
            assert (got.ticket, got.actor) == (want.ticket, want.actor)
            if want.actor >= 0:
                running.append(want.actor)
        else:
            actor = running.pop(rng.randrange(len(running)))
            clock += rng.expovariate(100.0)
            got_list = native.complete(actor, clock - 0.01, clock, 0)
            want_list = ref.complete(actor, clock - 0.01, clock, 0)
            assert plain(got_list) == plain(want_list)
            running.extend(d.actor for d in want_list)
    assert native.in_flight() == ref.in_flight()


def test_the_random_streams_are_identical() -> None:
    """SplitMix64's published first outputs for seed 0, and below() built on them."""
    rng = reference.SplitMix64(0)
    assert [rng.next() for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    native = _native.Scheduler(1000, "random", seed=12345)
    ref = reference.Scheduler(1000, "random", seed=12345)
    assert [native.submit(0).actor for _ in range(100)] == [ref.submit(0).actor for _ in range(100)]
