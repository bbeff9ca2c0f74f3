"""A frame's column by name: the first column of that name (looked up by a name
index made once, the columns being immutable), a ``KeyError`` naming the columns
for any other key, a ``LifecycleError`` once the frame is released; projections
and derived frames look up their own columns."""

from __future__ import annotations

import pyarrow as pa
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.errors import LifecycleError
from nexus_cache.frames import DeviceFrame


def _frame() -> DeviceFrame:
    domain = HostBackend(device_total_bytes=64 << 20).create_domain(0)
    table = pa.Table.from_arrays(
        [pa.array([1, 2]), pa.array([0.5, 1.5]), pa.array([3, 4])], names=["a", "b", "a"]
    )
    return DeviceFrame.from_arrow(table, domain=domain)


def test_a_name_gives_its_first_column_and_an_index_any() -> None:
    frame = _frame()
    for _ in range(2):  # before and after the name index is made
        assert frame.column("a") is frame.columns[0]
        assert frame.column("b") is frame.columns[1]
        assert frame.column(2) is frame.columns[2]
    assert frame.column_names == ["a", "b", "a"]
    frame.release()


@pytest.mark.parametrize("key", ["c", ("a",), ["a"]], ids=["missing", "tuple", "list"])
def test_any_other_key_is_a_key_error_naming_the_columns(key: object) -> None:
    frame = _frame()
    frame.column("a")
    with pytest.raises(KeyError, match=r"columns: \['a', 'b', 'a'\]"):
        frame.column(key)  # type: ignore[arg-type]
    frame.release()


def test_a_projection_looks_up_its_own_columns_and_a_released_frame_none() -> None:
    frame = _frame()
    frame.column("a")
    with frame.select(["b", 2]) as picked:
        assert picked.column_names == ["b", "a"]
        assert picked.column("a") is frame.columns[2]
    frame.release()
    with pytest.raises(LifecycleError):
        frame.column("b")


def test_columns_named_gives_the_first_of_each_name_and_leaves_out_the_missing() -> None:
    frame = _frame()
    named = frame.columns_named(["b", "c", "a"])
    assert list(named) == ["b", "a"]  # "c" is not a column: left out
    assert named["a"] is frame.columns[0]
    assert named["b"] is frame.columns[1]
    every = frame.columns_named()
    assert every == {"a": frame.columns[0], "b": frame.columns[1]}
    frame.release()
    with pytest.raises(LifecycleError):
        frame.columns_named(["a"])


def test_a_view_shares_the_columns_and_is_released_on_its_own() -> None:
    frame = _frame()
    view = frame.view()
    assert view.columns == frame.columns  # the same column objects: no copy
    assert view.column("a") is frame.columns[0]  # the name index it shares
    assert view.owner is frame.owner
    view.release()
    assert not frame.released
    assert frame.column("b") is frame.columns[1]
    with pytest.raises(LifecycleError):
        view.column("a")
    again = frame.view()
    frame.release()
    assert again.column(2) is not None  # the view's columns outlive the frame's handle
    again.release()


@pytest.mark.parametrize("index", [3, -4, 10**6])
def test_an_index_past_the_columns_is_an_index_error_naming_the_columns(index: int) -> None:
    """``column(3)`` or ``select([3])`` of three columns said only "tuple index out
    of range"; negative indices within range count from the end, as in Python."""
    frame = _frame()
    for lookup in (lambda: frame.column(index), lambda: frame.select([0, index])):
        with pytest.raises(IndexError, match=rf"index {index}.*3 columns.*\['a', 'b', 'a'\]"):
            lookup()
    assert frame.select([-1]).column_names == ["a"]
    frame.release()
