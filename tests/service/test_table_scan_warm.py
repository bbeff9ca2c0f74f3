"""A warm filtered scan: the source-cache entry is read in place (no copy before the
mask), the result is built in the query's own buffers, every pin is let go."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.service import Scan


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """edges/day=D/part-0.parquet: 4 partitions of 4,000 rows, ints, floats, strings."""
    root = tmp_path / "edges"
    rng = np.random.default_rng(7)
    for day in range(4):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        n = 4000
        table = pa.table(
            {
                "src": rng.integers(0, 1000, n),
                "w": rng.random(n),
                "kind": pa.array(rng.choice(["a", "bb", "ccc"], n).tolist()),
                "tag": pa.array(rng.choice(["x", "y"], n).tolist()).dictionary_encode(),
            }
        )
        pq.write_table(table, part / "part-0.parquet", row_group_size=1000)
    past = time.time() - 60  # older than local_min_age_s: identity provable
    for path in root.rglob("*.parquet"):
        os.utime(path, (past, past))
    return root


def _reference(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def _spans(arrays: Any) -> list[tuple[int, int]]:
    return [
        (a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
        for a in arrays
    ]


def _buffers(table: pa.Table) -> list[tuple[int, int]]:
    out = []
    for column in table.columns:
        for chunk in column.chunks:
            arrays = [chunk, *([chunk.dictionary] if pa.types.is_dictionary(chunk.type) else [])]
            out += [(b.address, b.address + b.size) for a in arrays for b in a.buffers() if b]
    return out


def _resident_spans(service: Any) -> list[tuple[int, int]]:
    """Address ranges of every buffer the device's source cache holds."""
    cache = service.caches.source_cache(0)
    spans = []
    for view in cache.entries():
        handle = cache.checkout(view.key)
        assert handle is not None
        try:
            spans += _spans(handle.value.device_arrays())
        finally:
            handle.release()
    return spans


COLUMNS = ["src", "w", "kind", "tag", "day"]


@pytest.mark.parametrize(
    "flt",
    [
        [("w", "<", 0.3), ("kind", "!=", "bb")],  # rows masked and gathered
        [("day", "in", [1, 2])],  # partitions only: every row of a kept file
    ],
)
def test_a_warm_filtered_scan_shares_no_buffer_with_the_cache_and_releases_its_pins(
    hive: Path, tmp_path: Path, flt: Any
) -> None:
    with make_service(tmp_path) as service:
        service.execute(Scan(str(hive), COLUMNS, filter=[("w", ">", 0.9)]))  # fills the cache
        warm = service.execute(Scan(str(hive), COLUMNS, filter=flt))
        assert warm.diagnostics.source_cache["status"] == "hit"
        resident = _resident_spans(service)
        assert resident
        for start, stop in _buffers(warm.table):
            assert all(stop <= lo or start >= hi for lo, hi in resident), "shares a buffer"
        cache = service.caches.source_cache(0)
        assert [v.pins for v in cache.entries()] == [0] * 4  # every borrow let go
    # the service (and its cache) gone, the result is whole
    assert_same_rows(warm.table, _reference(hive, flt, COLUMNS))


def test_a_warm_filtered_scan_copies_nothing_before_the_mask(hive: Path, tmp_path: Path) -> None:
    """The attempt's budget counts what it allocates: a filter that keeps no row
    of a cached source allocates next to nothing (it used to copy every entry)."""
    with make_service(tmp_path) as service:
        cold = service.execute(Scan(str(hive), ["src", "w"], filter=[("w", ">", 0.5)]))
        warm = service.execute(Scan(str(hive), ["src", "w"], filter=[("w", ">", 2.0)]))
    assert cold.diagnostics.source_cache["status"] == "miss-led"
    assert warm.diagnostics.source_cache["status"] == "hit"
    assert warm.table.num_rows == 0
    assert warm.table.schema.names == ["src", "w"]
    cached = 4 * 4000 * 8 * 2  # src and w of every file (day is not read)
    assert warm.diagnostics.attempts[-1].used_bytes < cached // 8
