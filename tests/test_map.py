"""`mesh.methods.f.map(items)`: one `choose` per item, streamed, in order or as completed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
from workers import AsyncWorker, Worker

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[am.ActorMesh[Worker]]:
    with am.ActorMesh(Worker, shape=3, num_cpus=0.1, args=(2,)) as m:
        m.wait_ready(60)
        yield m


def test_results_come_in_the_order_of_the_items(mesh: am.ActorMesh[Worker]) -> None:
    assert list(mesh.methods.f.map(range(50))) == [2 * i for i in range(50)]


def test_unordered_results_are_every_result_once(mesh: am.ActorMesh[Worker]) -> None:
    assert sorted(mesh.methods.f.map(range(50), ordered=False, window=5)) == [
        2 * i for i in range(50)]


def test_items_are_read_lazily_so_an_endless_iterable_streams(mesh: am.ActorMesh[Worker]) -> None:
    taken = itertools.count()
    pulled: list[int] = []

    def items() -> Iterator[int]:
        for i in taken:
            pulled.append(i)
            yield i

    first = list(itertools.islice(mesh.methods.f.map(items(), window=4), 20))
    assert first == [2 * i for i in range(20)]
    assert len(pulled) <= 20 + 4


def test_a_window_bounds_the_calls_running_at_once() -> None:
    with am.ActorMesh(AsyncWorker, shape=1, num_cpus=0.1) as one:
        results = list(one.methods.overlapping.map(range(40), window=4))
        assert results == list(range(40))
        assert 1 <= one.methods.most_overlapping.choose().get(timeout=60) <= 4


def test_an_error_raises_at_its_items_position(mesh: am.ActorMesh[Worker]) -> None:
    seen: list[int] = []
    with pytest.raises(am.ActorError, match="negative: -1"):
        for value in mesh.methods.checked.map([1, 2, -1, 4]):
            seen.append(value)
    assert seen == [1, 2]


def test_errors_are_yielded_in_place_with_return_exceptions(mesh: am.ActorMesh[Worker]) -> None:
    out = list(mesh.methods.checked.options(return_exceptions=True).map([1, -2, 3]))
    assert out[0] == 1 and out[2] == 3
    assert isinstance(out[1], am.ActorError) and "negative: -2" in str(out[1])


def test_async_for_streams_the_same_results(mesh: am.ActorMesh[Worker]) -> None:
    async def collect(ordered: bool) -> list[int]:
        return [v async for v in mesh.methods.f.map(range(30), ordered=ordered, window=6)]

    assert asyncio.run(collect(True)) == [2 * i for i in range(30)]
    assert sorted(asyncio.run(collect(False))) == [2 * i for i in range(30)]


def test_leaving_the_loop_early_gives_every_slot_back() -> None:
    with am.ActorMesh(Worker, shape=2, num_cpus=0.1, max_in_flight=1) as pair:
        for value in pair.methods.f.map(range(1000)):
            if value == 5:
                break
        # what was queued is cancelled; the conftest check waits for what was sent


def test_bad_arguments_are_refused(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(ValueError, match="window=0"):
        mesh.methods.f.map([1], window=0)
    with pytest.raises(TypeError, match="ordered='yes'"):
        mesh.methods.f.map([1], ordered="yes")  # type: ignore[arg-type]


def test_map_returns_an_iterator_that_next_reads_and_a_loop_finishes(
    mesh: am.ActorMesh[Worker],
) -> None:
    results = mesh.methods.f.map(range(5))
    assert iter(results) is results
    assert next(results) == 0 and next(results) == 2
    assert list(results) == [4, 6, 8]
    assert list(results) == []  # used up, as Python's map
    with pytest.raises(StopIteration):
        next(results)


def test_an_iterator_read_with_next_cannot_also_be_read_with_async_for(
    mesh: am.ActorMesh[Worker],
) -> None:
    results = mesh.methods.f.map(range(3))
    assert next(results) == 0
    with pytest.raises(RuntimeError, match="being read already"):
        results.__aiter__()
    assert list(results) == [2, 4]


def test_closing_a_map_cancels_the_calls_not_sent_yet() -> None:
    with am.ActorMesh(Worker, shape=1, num_cpus=0.1, max_in_flight=1) as one:
        results = one.methods.f.map(range(100), window=10)
        assert next(results) == 0
        results.close()
        assert list(results) == []


def test_the_default_window_keeps_every_slot_busy_in_constant_memory(
    mesh: am.ActorMesh[Worker],
) -> None:
    pulled: list[int] = []

    def items() -> Iterator[int]:
        for i in itertools.count():
            pulled.append(i)
            yield i

    results = mesh.methods.f.map(items())
    assert next(results) == 0
    window = len(pulled)
    assert 3 * 2 <= window <= 3 * 2 * 2 * 64  # at least a call per slot, at most full batches
    for _ in range(2000):
        next(results)
    assert len(pulled) <= 2001 + 3 * 2 * 2 * 64
