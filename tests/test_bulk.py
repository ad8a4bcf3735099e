"""`am.get` and `am.wait`: many futures read or waited for at once, as `ray.get` / `ray.wait`."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Iterator
from typing import Any

import pytest
from coalesce_workers import Batched
from workers import signal, waiters

import actormesh as am
from actormesh import _bulk

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[am.ActorMesh[Batched]]:
    policy = am.Policy("adaptive", max_tasks=1, batch_budget_s=60.0)
    with am.ActorMesh(Batched, shape=2, num_cpus=0.1, balancer=policy) as m:
        am.get([m.methods.checked.all(0), m.methods.where.all(0)], timeout=60)
        yield m


def test_get_returns_values_in_the_order_given(mesh: am.ActorMesh[Batched]) -> None:
    futures = [mesh.methods.checked.choose(x) for x in range(50)]
    assert am.get(list(reversed(futures)), timeout=60) == list(reversed(range(50)))


def test_get_of_one_future_is_its_value(mesh: am.ActorMesh[Batched]) -> None:
    assert am.get(mesh.methods.checked.choose(3), timeout=60) == 3


def test_get_reads_lone_and_batched_calls_and_all_together(mesh: am.ActorMesh[Batched]) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    waiters(sig, 1)
    batched = [mesh[0].methods.where.choose(x) for x in range(5)]  # wait behind the block
    lone = mesh[1].methods.checked.choose(9)
    every = mesh.methods.checked.all(4)
    sig.send.remote()
    values = am.get([*batched, lone, every, held], timeout=60)
    assert [v[0] for v in values[:5]] == list(range(5))
    assert len({v[1] for v in values[:5]}) == 1  # one task
    assert values[5:] == [9, am.ValueMesh(mesh.shape, [4, 4]), 0]


def test_get_raises_the_first_error_in_order(mesh: am.ActorMesh[Batched]) -> None:
    futures = [mesh.methods.checked.choose(x) for x in (1, -2, 3, -4)]
    with pytest.raises(am.ActorError, match="negative: -2"):
        am.get(futures, timeout=60)
    assert [f.get(timeout=60) for f in futures[0::2]] == [1, 3]


def test_get_returns_errors_of_futures_made_with_return_exceptions(
    mesh: am.ActorMesh[Batched],
) -> None:
    futures = [mesh.methods.checked.options(return_exceptions=True).choose(x) for x in (-1, 1)]
    error, value = am.get(futures, timeout=60)
    assert isinstance(error, am.ActorError) and value == 1


def test_get_raises_timeout_error_and_the_calls_go_on(mesh: am.ActorMesh[Batched]) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    quick = mesh[1].methods.checked.choose(1)
    with pytest.raises(TimeoutError, match="futures not done within timeout=0.05"):
        am.get([quick, held], timeout=0.05)
    sig.send.remote()
    assert am.get([quick, held], timeout=60) == [1, 0]


def test_get_of_a_cancelled_call_raises_cancelled_error(mesh: am.ActorMesh[Batched]) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    waiters(sig, 1)
    waiting = mesh[0].methods.checked.choose(1)
    waiting.cancel()
    with pytest.raises(cf.CancelledError):
        am.get([waiting], timeout=60)
    sig.send.remote()
    held.get(timeout=60)


def test_wait_returns_the_done_futures_first_in_the_order_given(
    mesh: am.ActorMesh[Batched],
) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    quick = [mesh[1].methods.checked.choose(x) for x in range(3)]
    done, pending = am.wait([held, *quick], num_returns=3, timeout=60)
    assert done == quick and pending == [held]
    done, pending = am.wait([held, *quick], num_returns=1, timeout=60)
    assert done == quick[:1] and pending == [held, *quick[1:]]
    sig.send.remote()
    done, pending = am.wait([held], timeout=60)
    assert done == [held] and pending == []


def test_wait_returns_what_is_done_when_the_timeout_passes(mesh: am.ActorMesh[Batched]) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    quick = mesh[1].methods.checked.choose(1)
    quick.get(timeout=60)
    start = time.monotonic()
    done, pending = am.wait([held, quick], num_returns=2, timeout=0.1)
    assert (done, pending) == ([quick], [held]) and time.monotonic() - start >= 0.1
    assert am.wait([held], timeout=0) == ([], [held])
    sig.send.remote()
    held.get(timeout=60)


def test_waiting_again_and_again_leaves_nothing_behind(mesh: am.ActorMesh[Batched]) -> None:
    sig = signal()
    held = mesh[0].methods.block.choose(sig)
    for _ in range(200):
        assert am.wait([held], timeout=0.001) == ([], [held])
    assert sum(len(w) for w in _bulk._watchers.values()) == 0
    sig.send.remote()
    held.get(timeout=60)
    assert held._future not in _bulk._watchers


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda f: am.wait([f, f]), ValueError, "every future must be given once"),
        (lambda f: am.wait([f], num_returns=2), ValueError, "num_returns=2"),
        (lambda f: am.wait([f], num_returns=0), ValueError, "num_returns=0"),
        (lambda f: am.wait(f), TypeError, "takes a list"),
        (lambda f: am.get([f, 3]), TypeError, "got 3"),
        (lambda f: am.get([f], timeout=-1), ValueError, "timeout=-1"),
        (lambda f: am.wait([f], timeout=float("nan")), ValueError, "timeout=nan"),
    ],
)
def test_bad_arguments_are_refused(
    mesh: am.ActorMesh[Batched], call: Any, error: type[Exception], match: str,
) -> None:
    future = mesh.methods.checked.choose(1)
    with pytest.raises(error, match=match):
        call(future)
    future.get(timeout=60)


def test_nothing_to_read_or_wait_for_returns_at_once() -> None:
    assert am.get([]) == []
    assert am.wait([]) == ([], [])
