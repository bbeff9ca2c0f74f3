"""take_frame: rows of a device frame by index, every column kind, on NumPy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.frames import DeviceFrame
from nexus_cache.frames.gather import take_frame

_TABLE = pa.table(
    {
        "i": pa.array([1, None, 3, 4, 5], pa.int64()),
        "s": pa.array(["a", "", None, "dddd", "ee"]),
        "b": pa.array([True, False, None, True, False]),
        "d": pa.array(["x", "y", "x", None, "y"]).dictionary_encode(),
        "t": pa.array([0, 1, 2, 3, 4], pa.timestamp("us")),
    }
)


@pytest.mark.parametrize("indices", [[4, 0, 2], [], [3, 3, 1], [0, 1, 2, 3, 4]])
def test_take_frame_equals_arrow_take(indices: list[int]) -> None:
    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    frame = DeviceFrame.from_arrow(_TABLE, domain=domain)
    got = take_frame(frame, np.array(indices, dtype=np.int64), np)
    assert got.num_rows == len(indices)
    assert got.to_arrow().equals(_TABLE.take(pa.array(indices, pa.int64())))
    # a slice of strings (offsets not starting at 0) gathers its own rows
    sliced = frame.slice(2, 3)
    got = take_frame(sliced, np.array([2, 0], dtype=np.int64), np).to_arrow()
    assert got.equals(_TABLE.slice(2, 3).take(pa.array([2, 0], pa.int64())))


def test_read_parquet_with_a_filter_equals_pyarrow(tmp_path) -> None:
    import pyarrow.parquet as pq

    from nexus_cache.errors import ConfigError
    from nexus_cache.frames import read_parquet
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    path = tmp_path / "t.parquet"
    pq.write_table(_TABLE, path, row_group_size=2)
    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    flt = [[("i", ">=", 3), ("s", "!=", "ee")], [("b", "in", [None])]]
    config = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0.0)
    with LakehouseCache(config) as cache:
        frame = read_parquet(str(path), domain=domain, lake=cache, columns=["s", "t"], filter=flt)
        want = pq.read_table(path, filters=flt, columns=["s", "t"])
        assert frame.to_arrow().equals(want)
        whole = read_parquet(str(path), domain=domain, lake=cache, filter=[("d", "=", "y")])
        assert (
            whole.to_arrow().to_pylist()
            == pq.read_table(path, filters=[("d", "=", "y")]).to_pylist()
        )
        with pytest.raises(ConfigError, match="nope"):
            read_parquet(str(path), domain=domain, lake=cache, filter=[("nope", "=", 1)])


_NUMERIC = _TABLE.select(["i", "b", "t"])


def _spans(table: pa.Table) -> list[tuple[int, int]]:
    return [
        (b.address, b.address + b.size)
        for column in table.columns
        for chunk in column.chunks
        for b in chunk.buffers()
        if b is not None and b.size
    ]


@pytest.mark.parametrize(("parallel", "staged"), [(False, False), (True, False), (False, True)])
def test_gather_table_writes_every_frames_rows_into_one_column_each(
    parallel: bool, staged: bool
) -> None:
    """The rows of several frames (some by index, one whole, one without nulls) come
    out as one table equal to Arrow's take and concat, one chunk per column, in
    buffers none of the frames holds. ``staged`` runs a device's way on the host:
    gathered into one buffer of the domain, then copied out in one transfer."""
    from nexus_cache.frames.gather import gather_table

    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    no_nulls = _NUMERIC.filter(pa.array([True, False, False, True, True]))
    frames = [
        DeviceFrame.from_arrow(t, domain=domain) for t in (_NUMERIC, no_nulls, _NUMERIC, _NUMERIC)
    ]
    picks = [[4, 0, 2], None, [], [1, 1, 3]]
    rows = [None if p is None else np.array(p, dtype=np.int64) for p in picks]
    allocations = domain.counters().allocations
    got = gather_table(frames, rows, ["t", "i", "b"], domain, parallel=parallel, staged=staged)
    assert domain.counters().allocations == allocations + staged  # the staging buffer
    want = pa.concat_tables(
        [
            (t if p is None else t.take(pa.array(p, pa.int64()))).select(["t", "i", "b"])
            for t, p in zip((_NUMERIC, no_nulls, _NUMERIC, _NUMERIC), picks, strict=True)
        ]
    ).combine_chunks()
    assert got.equals(want)
    assert all(c.num_chunks == 1 for c in got.columns)
    frame_spans = [
        (a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
        for f in frames
        for a in f.device_arrays()
    ]
    for start, stop in _spans(got):
        assert all(stop <= lo or start >= hi for lo, hi in frame_spans), "shares a buffer"
    for frame in frames:
        frame.release()
    assert domain.used_bytes() == 0  # the result holds nothing of the domain


def test_gather_table_refuses_columns_it_cannot_write_into_one_buffer() -> None:
    """Strings, dictionaries and a column whose type differs between frames are not
    gatherable (the caller gathers frame by frame then)."""
    from nexus_cache.frames.gather import gather_table, gatherable

    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    frame = DeviceFrame.from_arrow(_TABLE, domain=domain)
    wider = DeviceFrame.from_arrow(pa.table({"i": pa.array([1], pa.int32())}), domain=domain)
    assert gatherable([frame], ["i", "b", "t"])
    assert not gatherable([frame], ["i", "s"])
    assert not gatherable([frame], ["d"])
    assert not gatherable([frame, wider], ["i"])
    assert not gatherable([], ["i"])
    with pytest.raises(ValueError, match="take_frame"):
        gather_table([frame], [None], ["s"], domain)


@pytest.mark.parametrize("staged", [False, True])
def test_a_failed_gather_leaves_nothing_allocated_while_its_error_lives(staged: bool) -> None:
    """A frame's rows that cannot index (floats) fail the gather after another frame's
    rows were written: the error is raised and, while it (and its traceback) is still
    held, the domain holds no byte of the gather."""
    from nexus_cache.frames.gather import gather_table

    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    frames = [DeviceFrame.from_arrow(_NUMERIC, domain=domain) for _ in range(2)]
    used = domain.used_bytes()
    rows = [np.array([0, 2], dtype=np.int64), np.array([0.5, 1.5])]
    with pytest.raises(TypeError) as failure:
        gather_table(frames, rows, ["t", "i"], domain, staged=staged)
    assert failure.value.__traceback__ is not None
    assert domain.used_bytes() == used
    for frame in frames:
        frame.release()


def test_gather_table_on_device_returns_the_gathered_buffer_as_a_frame() -> None:
    """``on_device=True``: the same one pass into one buffer of the domain, returned as
    a frame of that domain (no host table), equal to Arrow's take and concat, sharing
    no buffer with the frames; releasing it leaves nothing allocated."""
    from nexus_cache.frames.gather import gather_table

    domain = HostBackend(device_total_bytes=1 << 26).create_domain(0)
    no_nulls = _NUMERIC.filter(pa.array([True, False, False, True, True]))
    sources = (_NUMERIC, no_nulls, _NUMERIC)
    frames = [DeviceFrame.from_arrow(t, domain=domain) for t in sources]
    picks = [[4, 0, 2], None, [1, 1, 3]]
    rows = [None if p is None else np.array(p, dtype=np.int64) for p in picks]
    allocations = domain.counters().allocations
    used = domain.used_bytes()
    got = gather_table(frames, rows, ["t", "i", "b"], domain, on_device=True)
    assert isinstance(got, DeviceFrame)
    assert got.domain is domain
    assert domain.counters().allocations == allocations + 1  # one buffer for every column
    assert domain.used_bytes() > used
    want = pa.concat_tables(
        [
            (t if p is None else t.take(pa.array(p, pa.int64()))).select(["t", "i", "b"])
            for t, p in zip(sources, picks, strict=True)
        ]
    ).combine_chunks()
    assert got.to_arrow().equals(want)
    assert got.column("b").data.dtype == np.bool_  # one bool per row, as frames hold them
    assert got.column("i").validity is not None
    frame_spans = [
        (a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
        for f in frames
        for a in f.device_arrays()
    ]
    for array in got.device_arrays():
        start = array.__array_interface__["data"][0]
        stop = start + array.nbytes
        assert all(stop <= lo or start >= hi for lo, hi in frame_spans), "shares a buffer"
    for frame in frames:
        frame.release()
    assert got.to_arrow().equals(want)  # its own buffers outlive the frames'
    got.release()
    del got, array
    assert domain.used_bytes() == 0
