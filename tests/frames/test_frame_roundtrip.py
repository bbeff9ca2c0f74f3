"""DeviceFrame on the host backend: lossless Arrow round trips, derived frames,
owners, copies, and the domain's books covering every column."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_cache.backends import HostBackend
from nexus_cache.errors import FrameTypeError, LifecycleError
from nexus_cache.frames import ColumnKind, DeviceFrame, FrameOwner, decode_parquet

from ._tables import assert_same_table, tables

HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


def _domain(total: int = 256 << 20):
    return HostBackend(device_total_bytes=total).create_domain(0)


def _accounted(domain, frame: DeviceFrame) -> None:
    """Every buffer is the domain's, and the domain holds nothing else."""
    for array in frame.device_arrays():
        assert domain.allocation_bytes(array) >= array.nbytes > 0
    assert domain.counters().used_bytes == domain.measured_bytes(frame.device_arrays())


@settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
@given(table=tables())
def test_round_trip_is_lossless_and_fully_accounted(table: pa.Table) -> None:
    domain = _domain()
    frame = DeviceFrame.from_arrow(table, domain=domain)
    assert frame.num_rows == table.num_rows
    assert frame.column_names == table.column_names
    _accounted(domain, frame)
    assert_same_table(frame.to_arrow(), table)


@settings(max_examples=60, deadline=None, suppress_health_check=HEALTH)
@given(table=tables(), data=st.data())
def test_slices_projections_and_copies_equal_arrow_slices(table: pa.Table, data) -> None:
    domain, other = _domain(), _domain()
    frame = DeviceFrame.from_arrow(table, domain=domain)
    n = table.num_rows
    start = data.draw(st.integers(0, n + 2))
    length = data.draw(st.integers(0, n + 2))
    order = data.draw(st.permutations(range(table.num_columns)))
    keep = order[: data.draw(st.integers(1, table.num_columns))]

    sliced = frame.slice(start, length)
    assert_same_table(sliced.to_arrow(), table.slice(start, length))
    projected = sliced.select(keep)
    expected = table.slice(start, length).select(keep)
    assert_same_table(projected.to_arrow(), expected)

    copy = projected.copy_into(other)
    assert copy.domain is other
    assert_same_table(copy.to_arrow(), expected)
    _accounted(other, copy)
    # a compacted copy never holds more than its rows need
    assert copy.nbytes <= projected.nbytes


LAYOUTS = [
    (pa.array([1, None, 3], pa.int16()), ColumnKind.FIXED),
    (pa.array([1.5, 2.0, None], pa.float32()), ColumnKind.FIXED),
    (pa.array([1, 2, 3], pa.int64()).view(pa.timestamp("ms", tz="UTC")), ColumnKind.FIXED),
    (pa.array([10, None, 12], pa.int32()).view(pa.date32()), ColumnKind.FIXED),
    (pa.array([True, None, False]), ColumnKind.BOOL),
    (pa.array(["a", "bc", None], pa.large_string()), ColumnKind.BINARY),
    (pa.array(["a", "b", "a"]).dictionary_encode(), ColumnKind.DICTIONARY),
]


@pytest.mark.parametrize(("array", "kind"), LAYOUTS, ids=[str(a.type) for a, _ in LAYOUTS])
def test_each_type_maps_to_its_layout(array: pa.Array, kind: ColumnKind) -> None:
    column = DeviceFrame.from_arrow(pa.table({"x": array}), domain=_domain()).column("x")
    assert column.kind is kind
    assert (column.offsets is not None) == (kind is ColumnKind.BINARY)
    assert (column.dictionary is not None) == (kind is ColumnKind.DICTIONARY)
    assert (column.validity is not None) == (array.null_count > 0)
    if kind is ColumnKind.FIXED:
        assert column.data.dtype.itemsize * 8 == array.type.bit_width


def test_strings_are_offsets_and_bytes_with_a_validity_mask() -> None:
    table = pa.table({"s": pa.array(["ab", None, "", "cde"])})
    column = DeviceFrame.from_arrow(table, domain=_domain()).column("s")
    assert column.offsets.tolist() == [0, 2, 2, 2, 5]
    assert bytes(column.data) == b"abcde"
    assert column.validity.tolist() == [True, False, True, True]


@pytest.mark.parametrize(
    "arrow_type",
    [pa.list_(pa.int32()), pa.struct([("a", pa.int8())]), pa.decimal128(10, 2), pa.null()],
)
def test_unsupported_types_name_the_column(arrow_type: pa.DataType) -> None:
    table = pa.table({"bad": pa.array([None, None], type=arrow_type)})
    with pytest.raises(FrameTypeError, match="'bad'"):
        DeviceFrame.from_arrow(table, domain=_domain())


def test_owner_lives_until_the_last_derived_frame_is_released() -> None:
    domain = _domain()
    released: list[str] = []
    owner = FrameOwner(lambda: released.append("pin"))
    base = DeviceFrame.from_arrow(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), domain=domain)
    frame = base.copy_into(domain, owner=owner)
    part = frame.slice(1)
    proj = part.select(["b"])
    assert frame.owner is part.owner is proj.owner is owner
    assert owner.refs == 3

    frame.release()
    part.release()
    assert released == []
    assert not owner.released
    assert proj.to_arrow().column("b").to_pylist() == ["y", "z"]
    proj.release()
    assert released == ["pin"]
    assert owner.released
    proj.release()  # idempotent
    assert released == ["pin"]
    with pytest.raises(LifecycleError, match="released"):
        _ = proj.columns
    with pytest.raises(LifecycleError):
        owner.acquire()


def test_a_dropped_frame_still_lets_its_owner_go() -> None:
    released: list[int] = []
    owner = FrameOwner(lambda: released.append(1))
    frame = DeviceFrame.from_arrow(pa.table({"a": [1]}), domain=_domain()).copy_into(
        _domain(), owner=owner
    )
    derived = frame.slice(0, 1)
    del frame
    gc.collect()
    assert released == []
    del derived
    gc.collect()
    assert released == [1]


def test_release_returns_every_byte_to_the_domain() -> None:
    domain = _domain()
    table = pa.table({"a": np.arange(1000), "s": [str(i) for i in range(1000)]})
    frame = DeviceFrame.from_arrow(table, domain=domain)
    derived = frame.slice(10, 20)
    assert domain.counters().used_bytes > 0
    frame.release()
    assert domain.counters().used_bytes > 0  # the slice still views the buffers
    derived.release()
    gc.collect()
    assert domain.counters().used_bytes == 0


def test_a_frame_that_does_not_fit_raises_capacity_error_and_leaks_nothing() -> None:
    from nexus_cache.errors import CapacityError

    domain = _domain(total=64 << 10)
    table = pa.table({"a": np.arange(5000), "b": np.arange(5000)})  # 80 KB of values
    with pytest.raises(CapacityError):
        DeviceFrame.from_arrow(table, domain=domain)
    gc.collect()
    assert domain.counters().used_bytes == 0


def test_nbytes_counts_the_buffers() -> None:
    table = pa.table({"a": pa.array([1, None, 3], pa.int32()), "s": ["ab", "c", None]})
    frame = DeviceFrame.from_arrow(table, domain=_domain())
    # a: 3*4 values + 3 validity; s: 4*4 offsets + 3 bytes + 3 validity
    assert frame.nbytes == 12 + 3 + 16 + 3 + 3


def test_a_copy_is_one_allocation_and_copies_again_as_one_block() -> None:
    from nexus_cache.frames._copy import _buffers, _packed_root

    table = pa.table(
        {
            "a": pa.array([1, None, 3] * 100, pa.int16()),
            "s": ["x", "yz", None] * 100,
            "c": pa.array(["p", "q", "p"] * 100).dictionary_encode(),
        }
    )
    source, first, second = _domain(), _domain(), _domain()
    frame = DeviceFrame.from_arrow(table, domain=source)
    copy = frame.copy_into(first)
    assert first.counters().allocations == 1
    assert len({id(first.root_of(a)) for a in copy.device_arrays()}) == 1
    _accounted(first, copy)

    def layout(f: DeviceFrame) -> tuple[list, list[int], int]:
        bufs = [b for c in f.columns for b in _buffers(c)]
        offsets, at = [], 0
        for b in bufs:
            offsets.append(at)
            at += -(-b.nbytes // 512) * 512
        return bufs, offsets, at

    assert _packed_root(*layout(frame), source) is None  # decoded: one allocation per buffer
    assert _packed_root(*layout(copy), first) is not None  # packed: copied as one block
    again = copy.copy_into(second)
    assert second.counters().allocations == 1
    assert_same_table(again.to_arrow(), table)
    assert _packed_root(*layout(copy.select(["s"])), first) is None  # a projection is not
    assert_same_table(copy.select(["s", "a"]).copy_into(second).to_arrow(), table.select([1, 0]))


def test_a_frame_of_no_columns_keeps_its_row_count_back_to_arrow(tmp_path: Path) -> None:
    """A zero-column table still has rows (``table.select([])``, a decode of
    ``columns=[]``): ``to_arrow()`` gives them back, as Arrow's reader does."""
    table = pa.table({"a": [1, 2, 3]}).replace_schema_metadata({"k": "v"})
    for source in (table.select([]), table.to_batches()[0].select([])):
        frame = DeviceFrame.from_arrow(source, domain=_domain())
        out = frame.to_arrow()
        assert out.num_rows == frame.num_rows == 3
        assert out.equals(table.select([]), check_metadata=True)
        assert frame.slice(1).to_arrow().num_rows == 2
        assert frame.copy_into(_domain()).to_arrow().num_rows == 3

    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=2)
    decoded = decode_parquet(str(path), domain=_domain(), columns=[])
    expected = pq.read_table(path, columns=[])
    assert expected.num_rows == 3
    assert decoded.to_arrow().equals(expected, check_metadata=True)


@pytest.mark.parametrize(
    "value",
    [{"a": [1]}, pa.chunked_array([[1]]), pa.array([1]), None],
    ids=["dict", "chunked_array", "array", "none"],
)
def test_from_arrow_of_no_table_names_what_it_takes(value: object) -> None:
    """A dict or an array raised "AttributeError: ... has no attribute 'schema'"."""
    domain = _domain()
    with pytest.raises(FrameTypeError, match=r"pyarrow\.Table or RecordBatch"):
        DeviceFrame.from_arrow(value, domain=domain)  # type: ignore[arg-type]
    assert domain.counters().used_bytes == 0
