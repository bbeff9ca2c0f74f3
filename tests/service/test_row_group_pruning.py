"""Filtered table scans decode only the row groups their filter may need.

Each data file holds 8 row groups of 100 rows with ``ts`` rising, so a ``ts``
window is decided by the row-group statistics. The reference is
``pyarrow.dataset`` (or the table's own reader), rows compared without order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service, sql_catalog
from tests.tables._compare import assert_same_rows

from nexus_cache.service import GraphQuery, Scan

ROWS, GROUP = 800, 100  # 8 row groups per file
WINDOW = [("ts", ">=", 200), ("ts", "<", 400)]  # row groups 2 and 3 of a file at ts 0..799


def _rows(first_ts: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 30, ROWS), pa.int64()),
            "dst": pa.array(rng.integers(0, 30, ROWS), pa.int64()),
            "ts": pa.array(np.arange(first_ts, first_ts + ROWS), pa.int64()),
            "w": pa.array(rng.random(ROWS)),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """day=0 (ts 0..799) and day=1 (ts 1000..1799), one file of 8 row groups each."""
    root = tmp_path / "edges"
    for day in (0, 1):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        pq.write_table(_rows(1000 * day, day), part / "part-0.parquet", row_group_size=GROUP)
    age_files(root)
    return root


def _dataset(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def _entry(result: Any, day: int) -> dict[str, Any]:
    (found,) = [e for e in result.diagnostics.table["entries"] if f"day={day}" in str(e["object"])]
    return found


def test_a_filter_keeping_two_row_groups_decodes_only_those_and_hits_them_again(
    hive: Path, tmp_path: Path
) -> None:
    flt = [("day", "=", 0), *WINDOW]
    with make_service(tmp_path) as service:
        first = service.execute(Scan(str(hive), ["src", "dst"], filter=flt))
        again = service.execute(Scan(str(hive), ["src", "dst"], filter=flt))
    want = _dataset(hive, flt, ["src", "dst"])
    assert want.num_rows == 200
    for result in (first, again):
        assert_same_rows(result.table, want)
        table = result.diagnostics.table
        assert table["pruned_by_partition"] == 1
        assert [e["row_groups"] for e in table["entries"]] == [[2, 3]]
        assert _entry(result, 0)["row_groups_total"] == 8
        assert _entry(result, 0)["row_groups_pruned"] == 6
        assert (table["row_groups_total"], table["row_groups_pruned"]) == (8, 6)
        assert table["rows_before_filter"] == 2 * GROUP  # only two row groups decoded
    assert first.diagnostics.source_cache["status"] == "miss-led"
    assert again.diagnostics.source_cache["status"] == "hit"


def test_a_repeated_filter_on_a_resident_row_group_entry_opens_no_object(
    hive: Path, tmp_path: Path
) -> None:
    """The footer that chose the row groups is known by the object's identity: the
    same filter again prunes from it and hits the entry, reading nothing."""
    flt = [("day", "=", 0), *WINDOW]
    with make_service(tmp_path) as service:
        first = service.execute(Scan(str(hive), ["src", "dst"], filter=flt))
        again = service.execute(Scan(str(hive), ["src", "dst"], filter=flt))
    assert first.diagnostics.lakehouse["read"] is True
    assert again.diagnostics.source_cache["status"] == "hit"
    assert again.diagnostics.lakehouse["read"] is False
    assert [e["row_groups"] for e in again.diagnostics.table["entries"]] == [[2, 3]]


def test_after_an_unfiltered_scan_a_filter_hits_the_whole_object_entry(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        # the same projected columns: the output and the filter's
        whole = service.execute(Scan(str(hive), ["src", "dst", "ts"]))
        filtered = service.execute(Scan(str(hive), ["src", "dst"], filter=WINDOW))
    assert whole.diagnostics.source_cache["status"] == "miss-led"
    assert [e["row_groups"] for e in whole.diagnostics.table["entries"]] == ["all", "all"]
    assert filtered.diagnostics.source_cache["status"] == "hit"
    assert filtered.diagnostics.lakehouse["read"] is False  # not even a footer
    table = filtered.diagnostics.table
    assert [e["row_groups"] for e in table["entries"]] == ["all", "all"]
    assert [e["row_groups_total"] for e in table["entries"]] == [None, None]
    assert table["rows_before_filter"] == 2 * ROWS
    assert_same_rows(filtered.table, _dataset(hive, WINDOW, ["src", "dst"]))


def test_an_object_whose_row_groups_are_all_pruned_is_not_decoded(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        some = service.execute(Scan(str(hive), ["src", "ts"], filter=WINDOW))
        cache = service.caches.source_cache(0)
        assert cache is not None
        resident = cache.stats().entries
        none = service.execute(Scan(str(hive), ["src", "day"], filter=[("ts", ">", 5000)]))
        assert cache.stats().entries == resident  # nothing decoded, nothing cached
    assert _entry(some, 0)["row_groups"] == [2, 3]
    assert _entry(some, 1)["row_groups"] == []  # day=1 holds ts 1000..1799
    assert _entry(some, 1)["row_groups_pruned"] == 8
    assert some.diagnostics.table["rows_before_filter"] == 2 * GROUP
    assert some.diagnostics.source_cache["status"] == "miss-led"
    assert_same_rows(some.table, _dataset(hive, WINDOW, ["src", "ts"]))
    assert none.table.num_rows == 0
    assert none.table.schema == pa.schema([("src", pa.int64()), ("day", pa.int32())])
    assert [e["row_groups"] for e in none.diagnostics.table["entries"]] == [[], []]
    assert none.diagnostics.table["row_groups_pruned"] == 16
    assert none.diagnostics.source_cache["status"] == "none"


def test_a_file_without_statistics_is_read_whole_and_correctly(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    (root / "day=0").mkdir(parents=True)
    path = root / "day=0" / "part-0.parquet"
    pq.write_table(_rows(0, 7), path, row_group_size=GROUP, write_statistics=False)
    assert pq.read_metadata(path).row_group(0).column(2).statistics is None
    age_files(root)
    with make_service(tmp_path) as service:
        result = service.execute(Scan(str(root), ["src", "w"], filter=WINDOW))
    table = result.diagnostics.table
    assert [e["row_groups"] for e in table["entries"]] == ["all"]
    assert (table["row_groups_total"], table["row_groups_pruned"]) == (8, 0)
    assert table["rows_before_filter"] == ROWS
    assert_same_rows(result.table, _dataset(root, WINDOW, ["src", "w"]))


def test_a_filtered_graph_query_reads_whole_objects(hive: Path, tmp_path: Path) -> None:
    with make_service(tmp_path) as service:
        ranks = service.execute(
            GraphQuery(Scan(str(hive), filter=WINDOW), "src", "dst", "pagerank")
        )
    assert [e["row_groups"] for e in ranks.diagnostics.table["entries"]] == ["all", "all"]
    assert ranks.diagnostics.table["row_groups_pruned"] == 0


def test_delta_files_are_pruned_by_row_group(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(
        str(table),
        _rows(0, 3),
        writer_properties=deltalake.WriterProperties(max_row_group_size=GROUP),
    )
    age_files(tmp_path / "lake")
    files = [str(table / f) for f in deltalake.DeltaTable(str(table)).file_uris()]
    assert [pq.read_metadata(f).num_row_groups for f in files] == [8]
    with make_service(tmp_path) as service:
        first = service.execute(Scan(str(table), ["src", "dst"], filter=WINDOW))
        again = service.execute(Scan(str(table), ["src", "dst"], filter=WINDOW))
    want = deltalake.DeltaTable(str(table)).to_pyarrow_table()
    want = want.filter(pq.filters_to_expression(WINDOW)).select(["src", "dst"])
    for result in (first, again):
        assert_same_rows(result.table, want)
        assert [e["row_groups"] for e in result.diagnostics.table["entries"]] == [[2, 3]]
    assert again.diagnostics.source_cache["status"] == "hit"


def test_iceberg_files_are_pruned_by_row_group(tmp_path: Path) -> None:
    warehouse = tmp_path / "lake"
    catalog = sql_catalog(warehouse)
    data = _rows(0, 4)
    ice = catalog.create_table(
        "ns.e", schema=data.schema, properties={"write.parquet.row-group-limit": str(GROUP)}
    )
    ice.append(data)
    ice = catalog.load_table("ns.e")
    age_files(warehouse)
    with make_service(tmp_path) as service:
        first = service.execute(Scan(ice.metadata_location, ["src", "w"], filter=WINDOW))
        again = service.execute(Scan(ice.metadata_location, ["src", "w"], filter=WINDOW))
    want = ice.scan().to_arrow().filter(pq.filters_to_expression(WINDOW)).select(["src", "w"])
    for result in (first, again):
        assert_same_rows(result.table, want)
        assert [e["row_groups"] for e in result.diagnostics.table["entries"]] == [[2, 3]]
    assert again.diagnostics.source_cache["status"] == "hit"
