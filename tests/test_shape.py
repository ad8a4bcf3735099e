"""Shape math: normalisation, ranks and coordinates, and sub-mesh selection, without Ray."""

import pytest

import actormesh as am
from actormesh._shape import Point, Shape, format_coords, parse_coords


def test_int_shape_is_one_dim_named_rank() -> None:
    assert dict(Shape.of(4)) == {"rank": 4}


def test_tuple_shape_names_dims_d0_d1_and_size_is_the_product() -> None:
    shape = Shape.of((2, 3))
    assert shape.dims == ("d0", "d1")
    assert shape.size == 6


def test_mapping_shape_keeps_order() -> None:
    assert Shape.of({"tp": 4, "dp": 2}).dims == ("tp", "dp")


@pytest.mark.parametrize("bad", [0, -1, (2, 0), {"dp": 0}, {"dp": 1.5}, "2", (), {}, True, None])
def test_bad_shapes_raise_value_error_naming_the_shape(bad: object) -> None:
    with pytest.raises(ValueError, match="shape"):
        Shape.of(bad)  # type: ignore[arg-type]


def test_zero_size_message_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 0\): sizes must be > 0"):
        Shape.of((2, 0))


def test_rank_and_coords_are_row_major_inverses() -> None:
    shape = Shape.of({"dp": 2, "tp": 3})
    assert shape.coords(4) == {"dp": 1, "tp": 1}
    for rank in range(shape.size):
        assert shape.rank(shape.coords(rank)) == rank


def test_int_index_drops_the_dim() -> None:
    sel = Shape.of({"dp": 2, "tp": 2}).select(1)
    assert dict(sel.shape) == {"tp": 2}
    assert sel.positions == (2, 3)


def test_slice_keeps_the_dim() -> None:
    sel = Shape.of({"dp": 2, "tp": 2}).select((slice(None), 0))
    assert dict(sel.shape) == {"dp": 2}
    assert sel.positions == (0, 2)


def test_full_int_index_is_one_point_with_no_dims() -> None:
    sel = Shape.of({"dp": 2, "tp": 2}).select((1, 0))
    assert dict(sel.shape) == {}
    assert sel.shape.size == 1
    assert sel.positions == (2,)


def test_slices_with_steps_and_negative_ints() -> None:
    shape = Shape.of(6)
    assert shape.select(slice(0, 6, 2)).positions == (0, 2, 4)
    assert shape.select(-1).positions == (5,)


def test_select_dims_by_name() -> None:
    shape = Shape.of({"dp": 2, "tp": 3})
    assert shape.select_dims(tp=slice(0, 1)).positions == (0, 3)
    assert shape.select_dims(dp=1).positions == (3, 4, 5)


def test_out_of_range_index_names_the_shape() -> None:
    with pytest.raises(IndexError, match=r"dp=2 out of range for shape \{dp=2, tp=2\}"):
        Shape.of({"dp": 2, "tp": 2}).select(2)


def test_too_many_indices_is_an_index_error() -> None:
    with pytest.raises(IndexError, match="2 dims"):
        Shape.of({"dp": 2, "tp": 2}).select((0, 0, 0))


def test_unknown_dim_is_a_key_error_naming_the_shape() -> None:
    with pytest.raises(KeyError, match=r"unknown dim 'pp' for shape \{dp=2\}"):
        Shape.of({"dp": 2}).select_dims(pp=0)


def test_empty_slice_is_an_index_error() -> None:
    with pytest.raises(IndexError, match="selects no"):
        Shape.of(4).select(slice(2, 2))


def test_point_coords_and_world_size() -> None:
    point = Point(3, Shape.of({"dp": 2, "tp": 2}))
    assert point.coords == {"dp": 1, "tp": 1}
    assert point["tp"] == 1
    assert point.world_size == 4


def test_coords_text_round_trips() -> None:
    assert format_coords({"dp": 1, "tp": 0}) == "dp=1,tp=0"
    assert parse_coords("dp=1,tp=0") == {"dp": 1, "tp": 0}


# -- a mesh of values selects as a mesh of actors does ------------------------------------------
def grid() -> am.ValueMesh[str]:
    shape = Shape({"dp": 2, "tp": 3})
    return am.ValueMesh(shape, [f"{r // 3}{r % 3}" for r in range(6)])


def test_a_value_mesh_gives_one_value_for_every_dim_named() -> None:
    assert grid()[1, 2] == "12"
    assert grid().item(dp=0, tp=1) == "01"


def test_a_value_mesh_gives_value_meshes_for_partial_selections() -> None:
    row = grid()[1]
    assert isinstance(row, am.ValueMesh)
    assert dict(row.shape) == {"tp": 3} and list(row) == ["10", "11", "12"]
    column = grid()[:, 0]
    assert dict(column.shape) == {"dp": 2} and list(column) == ["00", "10"]
    sliced = grid().slice(dp=1, tp=slice(0, 2))  # an int drops its dim, as on the mesh
    assert dict(sliced.shape) == {"tp": 2} and list(sliced) == ["10", "11"]
    assert sliced[1] == "11"
    kept = grid().slice(dp=slice(1, 2))
    assert dict(kept.shape) == {"dp": 1, "tp": 3} and kept[0, 2] == "12"


def test_a_value_mesh_names_its_shape_on_a_bad_selection() -> None:
    with pytest.raises(IndexError, match=r"\{dp=2, tp=3\}"):
        grid()[2]
    with pytest.raises(KeyError, match=r"\{dp=2, tp=3\}"):
        grid().slice(pp=0)
