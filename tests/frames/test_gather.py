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
