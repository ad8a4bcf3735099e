"""`shard` on a real cluster: split over all actors or one named dim, uneven batches, sharing."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from workers import Worker

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[am.ActorMesh[Worker]]:
    with am.ActorMesh(Worker, shape={"dp": 2, "tp": 2}, num_cpus=0.5) as m:
        yield m


def test_split_over_all_actors_sends_chunk_i_to_rank_i(mesh: am.ActorMesh[Worker]) -> None:
    tagged = mesh.methods.tag.options(dispatch=am.dispatch.split()).shard(list(range(8)))
    assert tagged.get(timeout=60) == [(i // 2, i) for i in range(8)]


def test_uneven_allow_gives_sizes_differing_by_one(mesh: am.ActorMesh[Worker]) -> None:
    tagged = mesh.methods.tag.options(dispatch=am.dispatch.split()).shard(list(range(6)))
    ranks = [rank for rank, _ in tagged.get(timeout=60)]
    assert ranks == [0, 0, 1, 1, 2, 3]


def test_uneven_pad_strips_the_padding(mesh: am.ActorMesh[Worker]) -> None:
    method = mesh.methods.tag.options(dispatch=am.dispatch.split(uneven="pad"))
    assert [row for _, row in method.shard(list(range(5))).get(timeout=60)] == [0, 1, 2, 3, 4]


def test_uneven_error_raises_before_any_call(mesh: am.ActorMesh[Worker]) -> None:
    method = mesh.methods.tag.options(dispatch=am.dispatch.split(uneven="error"))
    with pytest.raises(ValueError, match="5"):
        method.shard(list(range(5)))


def test_split_over_a_named_dim_collects_one_actor_per_group(mesh: am.ActorMesh[Worker]) -> None:
    method = mesh.methods.tag.options(dispatch=am.dispatch.split(dim="dp"))
    # dp=0 gets rows 0-1 (collected from rank 0), dp=1 rows 2-3 (from rank 2, tp=0)
    assert method.shard([0, 1, 2, 3]).get(timeout=60) == [(0, 0), (0, 1), (2, 2), (2, 3)]


def test_named_dim_split_on_a_sub_mesh(mesh: am.ActorMesh[Worker]) -> None:
    column = mesh[:, 1]  # ranks 1 and 3
    method = column.methods.tag.options(dispatch=am.dispatch.split(dim="dp"))
    assert method.shard([7, 8]).get(timeout=60) == [(1, 7), (3, 8)]


def test_numpy_batches_split_and_concatenate(mesh: am.ActorMesh[Worker]) -> None:
    batch = np.arange(10, dtype=np.float64)
    result = mesh.methods.scaled.options(dispatch=am.dispatch.split()).shard(batch, 2.0)
    np.testing.assert_array_equal(result.get(timeout=60), batch * 2)


def test_replicated_chunks_and_large_extra_args_are_put_once(
    mesh: am.ActorMesh[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    puts: list[int] = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    batch = np.zeros((2, 200_000), dtype=np.uint8)  # two 200 kB chunks, each for 2 actors
    extra = np.zeros(500_000, dtype=np.uint8)  # one large argument for all 4 actors
    method = mesh.methods.lengths.options(dispatch=am.dispatch.split(dim="dp"))
    assert method.shard(batch, extra).get(timeout=60) == [1, 500_000, 1, 500_000]
    assert len(puts) == 3  # each chunk once, the extra argument once


def test_custom_dispatch_decides_positions_and_collection(mesh: am.ActorMesh[Worker]) -> None:
    class LastTwo(am.Dispatch):
        def split(self, shape: am.Shape, args: tuple[object, ...], kwargs: dict[str, object]):  # type: ignore[no-untyped-def]
            return {shape.size - 2: (([args[0]],), {}), shape.size - 1: (([args[0]],), {})}

        def collect(self, results):  # type: ignore[no-untyped-def]
            return sorted(rank for rows in results.values() for rank, _ in rows)

    assert mesh.methods.tag.options(dispatch=LastTwo()).shard(5).get(timeout=60) == [2, 3]


def test_a_dispatch_returning_a_bad_position_fails_before_any_call(mesh: am.ActorMesh[Worker]) -> None:
    class Wrong(am.Dispatch):
        def split(self, shape: am.Shape, args: tuple[object, ...], kwargs: dict[str, object]):  # type: ignore[no-untyped-def]
            return {7: ((args[0],), {})}

        def collect(self, results):  # type: ignore[no-untyped-def]
            return results

    with pytest.raises(ValueError, match="position 7"):
        mesh.methods.tag.options(dispatch=Wrong()).shard([1])
    assert mesh.load() == [0, 0, 0, 0]
