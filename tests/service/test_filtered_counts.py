"""Count with a filter and as_of: the filtered rows of a table, equal to pyarrow.dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service, write_year_month_hive

from nexus_cache.errors import ConfigError
from nexus_cache.service import Count, Scan, as_query
from nexus_cache.service.datagen import rmat_edges, write_parquet


def _rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array(rng.random(n)),
            "kind": pa.array(rng.choice(["follow", "like", "block"], n).tolist()),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    return write_year_month_hive(tmp_path / "lake" / "edges", lambda n: _rows(100 + n, n), 40)


def _want(root: Path, flt: Any) -> int:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    expr = None if flt is None else pq.filters_to_expression(flt)
    return int(dataset.count_rows(filter=expr))


def test_count_takes_filter_and_as_of_as_scan_does() -> None:
    count = Count("/data/t", filter=[("year", "=", 2025), ("w", "<", 0.5)], as_of=3)
    assert count.filter == ((("year", "=", 2025), ("w", "<", 0.5)),)
    assert as_query(count.to_dict()) == count
    # the scan it reads: the filter's columns only, filtered
    assert count.scan == Scan("/data/t", ("year", "w"), filter=count.filter, as_of=3)
    assert Count("/data/t", as_of=2).scan == Scan("/data/t", as_of=2)
    with pytest.raises(ConfigError, match=r"Count\.filter"):
        Count("/data/t", filter="year=2025")
    with pytest.raises(ConfigError, match=r"Count\.filter predicate.*op"):
        Count("/data/t", filter=[("year", "~", 1)])
    with pytest.raises(ConfigError, match=r"Count\.as_of"):
        Count("/data/t", as_of="3")


@pytest.mark.parametrize(
    "flt",
    [
        None,
        [("year", "=", 2025)],  # partition columns only: footers of the kept files
        [("year", "=", 2025), ("month", "in", [1, 3])],
        [("w", "<", 0.5)],  # a data column: decoded and masked
        [("year", ">=", 2025), ("kind", "!=", "block"), ("w", ">", 0.2)],
        [[("kind", "=", "like"), ("month", "=", 2)], [("src", "<", 3)]],  # OR of ANDs
        [("year", "=", 2030)],  # prunes everything
        [("w", ">", 2.0)],  # keeps no row
    ],
)
def test_filtered_counts_equal_pyarrow_dataset(hive: Path, tmp_path: Path, flt: Any) -> None:
    with make_service(tmp_path) as service:
        result = service.execute(Count(str(hive), filter=flt))
    assert result.table.column_names == ["rows"]
    assert result.table["rows"].to_pylist() == [_want(hive, flt)]


def test_a_filtered_count_decodes_the_filter_columns_through_the_source_cache(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        first = service.execute(Count(str(hive), filter=[("w", "<", 0.3)]))
        second = service.execute(Count(str(hive), filter=[("w", ">=", 0.6)]))
        by_partition = service.execute(Count(str(hive), filter=[("year", "=", 2024)]))
        plain = service.execute(Count(str(hive)))
    assert first.diagnostics.source_cache["status"] == "miss-led"
    assert first.diagnostics.table["projected_columns"] == ["w"]
    # another filter over the same column: a source hit, only the mask runs
    assert second.diagnostics.source_cache["status"] == "hit"
    assert second.table["rows"].to_pylist() == [_want(hive, [("w", ">=", 0.6)])]
    # a filter on partitions alone prunes exactly: the footers of the kept files count
    assert by_partition.diagnostics.source_cache["status"] == "bypass"
    assert by_partition.diagnostics.table["pruned_by_partition"] == 3
    assert plain.diagnostics.source_cache["status"] == "bypass"
    assert plain.table["rows"].to_pylist() == [_want(hive, None)]


def test_a_warm_filtered_count_gathers_nothing(hive: Path, tmp_path: Path) -> None:
    """A filtered count over cached columns counts its masks: nothing is allocated in
    the work domain (it used to gather every column the count read), and its rows
    before and after the filter are reported."""
    flt = [("kind", "!=", "block"), ("w", ">", 0.2)]
    with make_service(tmp_path) as service:
        service.execute(Count(str(hive), filter=[("w", "<", 0.3), ("kind", "=", "like")]))
        domain = service._work[0]
        before = domain.counters().allocations
        warm = service.execute(Count(str(hive), filter=flt))
        assert warm.diagnostics.source_cache["status"] == "hit"
        assert domain.counters().allocations == before
    assert warm.table["rows"].to_pylist() == [_want(hive, flt)]
    assert warm.diagnostics.table["rows_after_filter"] == _want(hive, flt)
    assert warm.diagnostics.table["rows_before_filter"] == _want(hive, None)


def test_a_filtered_count_refuses_an_unknown_column_naming_the_filter(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service, pytest.raises(ConfigError, match="nope"):
        service.execute(Count(str(hive), filter=[("nope", "=", 1)]))


def test_a_count_of_a_delta_table_at_each_version_with_a_filter(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), _rows(60, 1), partition_by=["kind"])
    deltalake.write_deltalake(str(table), _rows(60, 2), mode="append", partition_by=["kind"])
    deltalake.DeltaTable(str(table)).delete("w > 0.7")
    age_files(tmp_path / "lake")
    expr = pq.filters_to_expression([("kind", "!=", "block"), ("src", "<", 20)])
    with make_service(tmp_path) as service:
        for version in (0, 1, 2):
            want = deltalake.DeltaTable(str(table), version=version).to_pyarrow_table()
            got = service.execute(
                Count(
                    str(table), filter=[("kind", "!=", "block"), ("src", "<", 20)], as_of=version
                )
            )
            assert got.table["rows"].to_pylist() == [want.filter(expr).num_rows]
            only = service.execute(Count(str(table), as_of=version))
            assert only.table["rows"].to_pylist() == [want.num_rows]


def test_a_filtered_scan_of_one_object_shares_the_unfiltered_scans_source_entry(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    edges = rmat_edges(7, timestamps=True)
    write_parquet(edges, lake / "edges.parquet", row_groups=4)
    age_files(lake)
    source = str(lake / "edges.parquet")
    window = [("ts", ">=", "2025-04-01T00:00:00Z"), ("ts", "<", "2025-07-01T00:00:00Z")]
    columns = ("src", "dst", "ts")
    with make_service(tmp_path) as service:
        plain = service.execute(Scan(source, columns))
        filtered = service.execute(Scan(source, columns, filter=window))
        count = service.execute(Count(source, filter=window))
    assert plain.diagnostics.source_cache["status"] == "miss-led"
    # the same object and columns, decoded alike: only the mask and gather are new
    assert filtered.diagnostics.source_cache["status"] == "hit"
    lo = pa.scalar(1743465600, pa.timestamp("s", tz="UTC"))  # 2025-04-01
    hi = pa.scalar(1751328000, pa.timestamp("s", tz="UTC"))  # 2025-07-01
    ts = pa.compute.cast(edges["ts"], pa.timestamp("ms", tz="UTC"))
    keep = pa.compute.and_(pa.compute.greater_equal(ts, lo), pa.compute.less(ts, hi))
    want = edges.filter(keep)
    assert 0 < want.num_rows < edges.num_rows
    assert filtered.table.num_rows == want.num_rows
    assert sorted(filtered.table["src"].to_pylist()) == sorted(want["src"].to_pylist())
    assert count.table["rows"].to_pylist() == [want.num_rows]


def test_rmat_edges_timestamps_leave_the_endpoints_unchanged() -> None:
    plain, timed = rmat_edges(6), rmat_edges(6, timestamps=True)
    assert plain.column_names == ["src", "dst"]
    assert timed.column_names == ["src", "dst", "ts"]
    assert timed.select(["src", "dst"]).equals(plain)
    assert timed["ts"].type == pa.timestamp("s", tz="UTC")
    seconds = timed["ts"].cast(pa.int64()).to_numpy()
    assert seconds.min() >= 1735689600  # 2025-01-01
    assert seconds.max() < 1767225600  # 2026-01-01
