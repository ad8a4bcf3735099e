"""Dispatch math: how `split()` cuts a batch across positions and joins the results, without Ray."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actormesh import dispatch
from actormesh._shape import Shape

Calls = Mapping[int, dispatch.Call]


def chunks(calls: Calls) -> dict[int, Any]:
    """Position → the first argument it receives."""
    return {position: args[0] for position, (args, _) in calls.items()}


def echo(calls: Calls) -> dict[int, Any]:
    """The results of actors that return their first argument unchanged."""
    return chunks(calls)


def round_trip(d: dispatch.Dispatch, shape: Shape, batch: Any) -> Any:
    plan = d.plan(shape, (batch,), {})
    return plan.collect(echo(plan.calls))


FLAT3 = Shape.of(3)
GRID = Shape.of({"dp": 2, "tp": 3})


# --- what can be split ------------------------------------------------------------------------


def test_list_is_cut_into_contiguous_chunks_in_position_order() -> None:
    calls = dispatch.split().split(FLAT3, ([0, 1, 2, 3, 4, 5],), {})
    assert chunks(calls) == {0: [0, 1], 1: [2, 3], 2: [4, 5]}


def test_list_results_are_concatenated_in_position_order() -> None:
    assert dispatch.split().collect({2: [4], 0: [0, 1], 1: [2, 3]}) == [0, 1, 2, 3, 4]


def test_tuple_splits_into_tuples_and_collects_into_a_tuple() -> None:
    d = dispatch.split()
    assert chunks(d.split(FLAT3, ((1, 2, 3),), {})) == {0: (1,), 1: (2,), 2: (3,)}
    assert round_trip(d, FLAT3, (1, 2, 3)) == (1, 2, 3)


def test_numpy_array_splits_along_axis_0() -> None:
    x = np.arange(12).reshape(6, 2)
    parts = chunks(dispatch.split().split(FLAT3, (x,), {}))
    assert [p.shape for p in parts.values()] == [(2, 2)] * 3
    np.testing.assert_array_equal(parts[1], x[2:4])
    np.testing.assert_array_equal(round_trip(dispatch.split(), FLAT3, x), x)


def test_numpy_array_splits_and_collects_along_axis_1() -> None:
    x = np.arange(12).reshape(2, 6)
    parts = chunks(dispatch.split(axis=1).split(FLAT3, (x,), {}))
    np.testing.assert_array_equal(parts[2], x[:, 4:6])
    np.testing.assert_array_equal(round_trip(dispatch.split(axis=1), FLAT3, x), x)


def test_negative_axis_counts_from_the_last() -> None:
    x = np.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(
        chunks(dispatch.split(axis=-1).split(FLAT3, (x,), {}))[0], x[:, :2]
    )


def test_dict_values_split_together_and_collect_per_key() -> None:
    batch = {"ids": np.arange(6), "text": list("abcdef")}
    parts = chunks(dispatch.split().split(FLAT3, (batch,), {}))
    assert parts[1]["text"] == ["c", "d"]
    np.testing.assert_array_equal(parts[1]["ids"], [2, 3])
    result = round_trip(dispatch.split(), FLAT3, batch)
    assert result["text"] == batch["text"]
    np.testing.assert_array_equal(result["ids"], batch["ids"])


def test_dict_values_of_different_lengths_are_an_error_naming_keys_and_lengths() -> None:
    batch = {"ids": np.arange(6), "mask": np.arange(5)}
    with pytest.raises(ValueError, match=r"args\[0\]\['ids'\]: 6, args\[0\]\['mask'\]: 5"):
        dispatch.split().split(FLAT3, (batch,), {})


@dataclasses.dataclass(frozen=True)
class Batch:
    ids: np.ndarray
    labels: list[str]


def test_dataclass_fields_split_together_and_collect_into_the_dataclass() -> None:
    batch = Batch(np.arange(3), ["a", "b", "c"])
    parts = chunks(dispatch.split().split(FLAT3, (batch,), {}))
    assert parts[2] == Batch(parts[2].ids, ["c"])
    np.testing.assert_array_equal(parts[2].ids, [2])
    result = round_trip(dispatch.split(), FLAT3, batch)
    assert isinstance(result, Batch)
    assert result.labels == batch.labels
    np.testing.assert_array_equal(result.ids, batch.ids)


def test_jax_array_splits_and_collects_as_a_jax_array() -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(12).reshape(6, 2)
    parts = chunks(dispatch.split().split(FLAT3, (x,), {}))
    assert all(isinstance(p, jax.Array) and p.shape == (2, 2) for p in parts.values())
    result = round_trip(dispatch.split(), FLAT3, x)
    assert isinstance(result, jax.Array)
    np.testing.assert_array_equal(np.asarray(result), np.asarray(x))


def test_torch_tensor_splits_into_compact_chunks_and_collects_as_a_tensor() -> None:
    torch = pytest.importorskip("torch")
    x = torch.arange(12).reshape(6, 2)
    parts = chunks(dispatch.split().split(FLAT3, (x,), {}))
    # A chunk that viewed the batch's storage would ship the whole batch to its actor.
    assert all(p.untyped_storage().nbytes() == p.nbytes for p in parts.values())
    result = round_trip(dispatch.split(), FLAT3, x)
    assert torch.equal(result, x)


def test_other_arguments_reach_every_position_as_the_same_objects() -> None:
    weights, config = np.ones(10), {"t": 1.0}
    calls = dispatch.split().split(FLAT3, ([1, 2, 3], weights), {"config": config})
    for args, kwargs in calls.values():
        assert args[1] is weights
        assert kwargs["config"] is config


def test_a_shape_of_one_receives_the_batch_itself() -> None:
    x = np.arange(4)
    assert chunks(dispatch.split().split(Shape.of(1), (x,), {}))[0] is x


# --- what cannot be split ---------------------------------------------------------------------


def test_a_call_without_positional_arguments_is_a_type_error_naming_the_keywords() -> None:
    with pytest.raises(TypeError, match=r"first positional argument.*\['xs'\]"):
        dispatch.split().split(FLAT3, (), {"xs": [1, 2, 3]})


def test_an_unsupported_first_argument_is_a_type_error_naming_its_type() -> None:
    with pytest.raises(TypeError, match="args\\[0\\] is a str"):
        dispatch.split().split(FLAT3, ("abc",), {})


def test_a_list_splits_only_along_axis_0() -> None:
    with pytest.raises(TypeError, match="list, which splits only along axis 0, not axis 1"):
        dispatch.split(axis=1).split(FLAT3, ([1, 2, 3],), {})


def test_an_axis_the_array_lacks_is_a_value_error_naming_axis_and_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(6,\), which has no axis 1"):
        dispatch.split(axis=1).split(FLAT3, (np.arange(6),), {})


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"axis": "0"}, TypeError, "axis='0'"),
        ({"axis": True}, TypeError, "axis=True"),
        ({"dim": ""}, TypeError, "dim=''"),
        ({"uneven": "drop"}, ValueError, "uneven='drop'"),
    ],
)
def test_bad_options_are_rejected_when_the_dispatch_is_made(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatch.split(**options)


# --- uneven lengths ---------------------------------------------------------------------------


def test_allow_gives_chunk_sizes_that_differ_by_at_most_one_larger_first() -> None:
    calls = dispatch.split().split(FLAT3, (list(range(7)),), {})
    assert [len(c) for c in chunks(calls).values()] == [3, 2, 2]


@given(length=st.integers(0, 40), actors=st.integers(1, 9))
def test_allow_round_trips_any_length(length: int, actors: int) -> None:
    batch = list(range(length))
    assert round_trip(dispatch.split(), Shape.of(actors), batch) == batch


def test_allow_leaves_out_positions_whose_chunk_is_empty() -> None:
    calls = dispatch.split().split(Shape.of(4), ([1, 2],), {})
    assert chunks(calls) == {0: [1], 1: [2]}


def test_allow_sends_an_empty_batch_to_position_0_alone() -> None:
    plan = dispatch.split().plan(FLAT3, ([],), {})
    assert chunks(plan.calls) == {0: []}
    assert plan.collect({0: []}) == []


def test_pad_repeats_the_last_row_to_make_equal_chunks() -> None:
    calls = dispatch.split(uneven="pad").split(FLAT3, ([1, 2, 3, 4],), {})
    assert chunks(calls) == {0: [1, 2], 1: [3, 4], 2: [4, 4]}


def test_pad_uses_edge_padding_for_arrays() -> None:
    x = np.arange(8).reshape(4, 2)
    parts = chunks(dispatch.split(uneven="pad").split(FLAT3, (x,), {}))
    np.testing.assert_array_equal(parts[2], [[6, 7], [6, 7]])


def test_pad_strips_the_padding_from_the_collected_result() -> None:
    x = np.arange(8).reshape(4, 2)
    np.testing.assert_array_equal(round_trip(dispatch.split(uneven="pad"), FLAT3, x), x)


@given(length=st.integers(1, 40), actors=st.integers(1, 9))
def test_pad_round_trips_any_length(length: int, actors: int) -> None:
    batch = list(range(length))
    assert round_trip(dispatch.split(uneven="pad"), Shape.of(actors), batch) == batch


def test_pad_calls_every_position_when_the_batch_is_shorter_than_the_mesh() -> None:
    plan = dispatch.split(uneven="pad").plan(Shape.of(4), (["a", "b"],), {})
    assert chunks(plan.calls) == {0: ["a"], 1: ["b"], 2: ["b"], 3: ["b"]}
    assert plan.collect(echo(plan.calls)) == ["a", "b"]


def test_pad_shares_one_chunk_among_positions_that_get_only_padding() -> None:
    parts = chunks(dispatch.split(uneven="pad").split(Shape.of(4), (["a", "b"],), {}))
    assert parts[2] is parts[3]


def test_pad_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="empty along axis 0"):
        dispatch.split(uneven="pad").split(FLAT3, ([],), {})


def test_pad_rejects_results_without_one_row_per_input_row() -> None:
    plan = dispatch.split(uneven="pad").plan(FLAT3, ([1, 2, 3, 4],), {})
    with pytest.raises(ValueError, match="5 rows along axis 0 for 6 padded input rows"):
        plan.collect({0: [1, 2], 1: [3, 4], 2: [4]})


def test_error_rejects_a_length_that_does_not_divide_naming_length_and_shards() -> None:
    with pytest.raises(ValueError, match="has 7 rows along axis 0.*across 3 actors"):
        dispatch.split(uneven="error").split(FLAT3, (list(range(7)),), {})


def test_error_rejects_a_batch_shorter_than_the_mesh() -> None:
    with pytest.raises(ValueError, match="has 0 rows"):
        dispatch.split(uneven="error").split(FLAT3, ([],), {})


def test_error_accepts_a_length_that_divides() -> None:
    calls = dispatch.split(uneven="error").split(FLAT3, (list(range(6)),), {})
    assert [len(c) for c in chunks(calls).values()] == [2, 2, 2]


# --- splitting over a named dim ---------------------------------------------------------------


def test_dim_split_sends_chunk_k_to_every_position_with_that_coordinate() -> None:
    calls = dispatch.split(dim="dp").split(GRID, ([1, 2, 3, 4],), {})
    assert chunks(calls) == {0: [1, 2], 1: [1, 2], 2: [1, 2], 3: [3, 4], 4: [3, 4], 5: [3, 4]}


def test_dim_split_on_an_inner_dim_follows_row_major_positions() -> None:
    calls = dispatch.split(dim="tp").split(GRID, ([1, 2, 3],), {})
    assert chunks(calls) == {0: [1], 1: [2], 2: [3], 3: [1], 4: [2], 5: [3]}


def test_dim_split_gives_replicas_the_same_chunk_object() -> None:
    parts = chunks(dispatch.split(dim="dp").split(GRID, (np.arange(4),), {}))
    assert parts[0] is parts[1] is parts[2]
    assert parts[3] is parts[4] is parts[5]
    assert parts[0] is not parts[3]


def test_dim_split_collects_only_from_positions_whose_other_coordinates_are_0() -> None:
    plan = dispatch.split(dim="dp").plan(GRID, ([1, 2, 3, 4],), {})
    results = {p: ["ignored"] for p in plan.calls} | {0: ["a"], 3: ["b"]}
    assert plan.collect(results) == ["a", "b"]


def test_dim_split_leaves_out_every_replica_of_an_empty_chunk() -> None:
    plan = dispatch.split(dim="dp").plan(GRID, ([1],), {})
    assert sorted(plan.calls) == [0, 1, 2]
    assert plan.collect(echo(plan.calls)) == [1]


def test_dim_split_pads_over_the_dim() -> None:
    plan = dispatch.split(dim="dp", uneven="pad").plan(GRID, ([1, 2, 3],), {})
    assert chunks(plan.calls)[5] == [3, 3]
    assert plan.collect(echo(plan.calls)) == [1, 2, 3]


def test_dim_split_over_an_unknown_dim_is_a_key_error_naming_dim_and_shape() -> None:
    with pytest.raises(KeyError, match=r"unknown dim 'pp' for shape \{dp=2, tp=3\}"):
        dispatch.split(dim="pp").split(GRID, ([1, 2],), {})


def test_dim_split_collect_without_its_plan_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"use plan\(shape, args, kwargs\).collect"):
        dispatch.split(dim="dp").collect({0: [1]})


# --- collecting -------------------------------------------------------------------------------


def test_results_that_are_all_none_collect_to_none() -> None:
    assert dispatch.split().collect({0: None, 1: None}) is None


def test_some_none_results_are_a_type_error_naming_positions_and_types() -> None:
    with pytest.raises(TypeError, match="position 0 gave a list, position 1 a NoneType"):
        dispatch.split().collect({0: [1], 1: None})


def test_results_that_cannot_be_concatenated_are_a_type_error_naming_their_type() -> None:
    with pytest.raises(TypeError, match="a int is not a list"):
        dispatch.split().collect({0: 1, 1: 2})


def test_dict_results_with_different_keys_are_an_error_naming_the_keys() -> None:
    with pytest.raises(ValueError, match=r"position 0 has keys \['a'\], position 1 has \['b'\]"):
        dispatch.split().collect({0: {"a": [1]}, 1: {"b": [2]}})


def test_missing_results_are_an_error_naming_the_positions() -> None:
    plan = dispatch.split().plan(FLAT3, ([1, 2, 3],), {})
    with pytest.raises(ValueError, match=r"no results for positions \[2\]"):
        plan.collect({0: [1], 1: [2]})


# --- user-defined dispatches ------------------------------------------------------------------


class OnePerActor(dispatch.Dispatch):
    """Item i of the first argument goes to position i; results come back as a list."""

    def split(self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Calls:
        items, *rest = args
        return {i: ((item, *rest), kwargs) for i, item in enumerate(items)}

    def collect(self, results: Mapping[int, Any]) -> Any:
        return [results[i] for i in sorted(results)]


def test_a_custom_dispatch_round_trips_through_its_plan() -> None:
    plan = OnePerActor().plan(FLAT3, (["x", "y"], 7), {"k": 1})
    assert plan.calls == {0: (("x", 7), {"k": 1}), 1: (("y", 7), {"k": 1})}
    assert plan.collect({1: "Y", 0: "X"}) == ["X", "Y"]


def test_a_custom_dispatch_choosing_a_position_outside_the_mesh_is_refused() -> None:
    with pytest.raises(ValueError, match=r"returned position 3; positions are ints in 0..2"):
        OnePerActor().plan(FLAT3, (["a", "b", "c", "d"],), {})


def test_a_custom_dispatch_returning_malformed_arguments_is_refused() -> None:
    class Bare(OnePerActor):
        def split(self, shape: Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Calls:
            return {0: args}

    with pytest.raises(TypeError, match=r"for position 0; expected \(args tuple, kwargs dict\)"):
        Bare().plan(FLAT3, ([1],), {})
