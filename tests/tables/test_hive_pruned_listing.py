"""A local Hive directory resolved with a filter never enters the partition directories
the filter rules out, and its schema (keys, types) is the full listing's and
``pyarrow.dataset``'s whatever the filter: a skipped ``day=x`` still makes ``day`` a
string, an empty one does not, a nested key is typed from every directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from nexus_cache.tables import plan_scan, read_table, resolve_table

from ._compare import assert_same_rows


def _write(root: Path, rel: str, start: int = 0, rows: int = 3) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": pa.array(range(start, start + rows), pa.int64())}), path)


def _reference(root: Path, flt: Any) -> pa.Table:
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt))


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory ``os.scandir`` lists while the test runs."""
    seen: list[str] = []
    real = os.scandir

    def counting(path: Any = ".") -> Any:
        seen.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    return seen


def test_a_filtered_listing_enters_only_the_kept_partitions(
    tmp_path: Path, scanned: list[str]
) -> None:
    root = tmp_path / "t"
    for day in range(12):
        for part in range(3):
            _write(root, f"day={day}/part-{part}.parquet", start=10 * day + part)
    flt = [("day", "in", [4, 7]), ("x", ">=", 0)]
    scanned.clear()
    snap = resolve_table(str(root), filter=flt)
    entered = {Path(p).name for p in scanned}
    # the table's directory, the first partition (its first object gives the schema),
    # and the two kept partitions; no other partition is listed or stat'ed
    assert entered == {"t", "day=0", "day=4", "day=7"}
    assert [Path(f.path).relative_to(root).as_posix() for f in snap.files] == [
        f"day={d}/part-{p}.parquet" for d in (4, 7) for p in range(3)
    ]
    assert snap.partitions_skipped == 10  # partition directories, each counted once
    plan = plan_scan(snap, snap.pruned_with)
    assert plan.pruned_by_partition == 10
    assert plan.objects_planned == 6 + 10
    assert snap.schema == resolve_table(str(root)).schema
    assert_same_rows(read_table(snap, filter=flt), _reference(root, flt))


def test_one_object_per_partition_counts_as_the_full_listing(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for day in range(8):
        _write(root, f"day={day}/part-0.parquet", start=day)
    flt = [("day", "=", 3)]
    pruned = plan_scan(snap := resolve_table(str(root), filter=flt), snap.pruned_with)
    full = resolve_table(str(root))
    whole = plan_scan(full, pruned.files and snap.pruned_with)
    assert pruned.to_dict() == whole.to_dict()
    assert pruned.to_dict()["pruned_by_partition"] == 7


def test_a_skipped_string_value_types_the_key_as_pyarrow_does(
    tmp_path: Path, scanned: list[str]
) -> None:
    root = tmp_path / "t"
    for value in ("1", "2", "x"):
        _write(root, f"day={value}/p.parquet")
    flt = [("day", "=", "1")]
    snap = resolve_table(str(root), filter=flt)
    entered = {Path(p).name for p in scanned}
    # day=x is skipped, but its name makes 'day' a string if it holds an object: it is
    # looked into (one scandir, no stat); day=2 cannot change the type and is not
    assert "day=2" not in entered
    assert "day=x" in entered
    assert [Path(f.path).parent.name for f in snap.files] == ["day=1"]
    assert snap.schema.field("day").type == pa.string()
    assert_same_rows(read_table(snap, filter=flt), _reference(root, flt))


def test_a_skipped_empty_directory_does_not_type_the_key(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for value in ("1", "2"):
        _write(root, f"day={value}/p.parquet")
    (root / "day=x").mkdir()  # no object: pyarrow does not see the value
    _write(root, "day=x/_uncommitted.parquet")
    flt = [("day", "=", 1)]
    snap = resolve_table(str(root), filter=flt)
    want = _reference(root, flt)
    assert snap.schema.field("day").type == want.schema.field("day").type == pa.int32()
    assert_same_rows(read_table(snap, filter=flt), want)
    assert snap.partitions_skipped == 1  # day=2; the empty day=x holds nothing to skip


def test_a_nested_key_is_typed_from_every_directory(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, "a=1/b=2/p.parquet")
    _write(root, "a=2/b=x/p.parquet", start=5)
    _write(root, "a=3/b=__HIVE_DEFAULT_PARTITION__/p.parquet", start=9)
    for flt in ([("a", "=", 1)], [("b", "=", "2")]):
        snap = resolve_table(str(root), filter=flt)
        want = _reference(root, flt)
        assert snap.schema == resolve_table(str(root)).schema
        assert snap.schema.field("b").type == want.schema.field("b").type == pa.string()
        assert_same_rows(read_table(snap, filter=flt), want)
    nulls = [("b", "in", [None])]
    snap = resolve_table(str(root), filter=nulls)
    assert [Path(f.path).parent.name for f in snap.files] == ["b=__HIVE_DEFAULT_PARTITION__"]


def test_a_partition_holding_directories_falls_back_to_the_full_listing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "t"
    _write(root, "day=1/p.parquet")
    _write(root, "day=2/hour=3/p.parquet", start=4)
    flt = [("day", "=", 2)]
    snap = resolve_table(str(root), filter=flt)
    assert snap.pruned_with is None
    assert snap.partitions_skipped == 0
    assert_same_rows(read_table(snap, filter=flt), _reference(root, flt))


def test_an_object_written_between_two_queries_is_seen_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for day in range(4):
        _write(root, f"day={day}/p.parquet", start=day)
    flt = [("day", ">=", 2)]
    first = resolve_table(str(root), filter=flt)
    assert len(first.files) == 2
    _write(root, "day=3/q.parquet", start=100)  # a new object in a kept partition
    _write(root, "day=9/p.parquet", start=200)  # a new partition
    second = resolve_table(str(root), filter=flt)
    assert len(second.files) == 4
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))
