"""A local Hive directory's layout (the directories above its partition leaves, the
leaves' names, the first object) is listed once while the stat of every directory it
was listed from stays as it was: a repeated filtered query lists only the partitions
it keeps. A partition added, removed or replaced, or a new first object, between two
queries is seen by the second; a directory changed too recently for its stat to tell
a later change apart, or one holding a symbolic link, is listed again."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import SourceFormatError
from nexus_cache.tables import _hive_pruned, read_table, resolve_table

from ._compare import assert_same_rows


def _write(root: Path, rel: str, start: int = 0, table: pa.Table | None = None) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if table is None:
        table = pa.table({"x": pa.array(range(start, start + 3), pa.int64())})
    pq.write_table(table, path)


def _table(root: Path, days: int = 8) -> Path:
    for day in range(days):
        _write(root, f"day={day}/p.parquet", start=10 * day)
    return root


def _reference(root: Path, flt: Any) -> pa.Table:
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt))


def _next_tick(clock: Path, after_ns: int) -> None:
    """Wait (bounded) until the filesystem stamps a change later than ``after_ns``,
    so that a change made next cannot share a directory's earlier ctime."""
    clock.mkdir(exist_ok=True)
    probe = clock / "probe"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > after_ns:
            return
    raise AssertionError("the filesystem clock did not move on within 5 s")


def _changed_last(root: Path) -> int:
    """The latest ctime of ``root`` and the directories under it."""
    return max(p.stat().st_ctime_ns for p in [root, *root.rglob("*")] if p.is_dir())


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory counts as settled however recently it changed (the test makes its
    changes after the filesystem clock moved on: :func:`_next_tick`)."""
    monkeypatch.setattr(_hive_pruned, "_SETTLED_S", 0.0, raising=False)


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the directories ``os.scandir`` lists while the test runs."""
    seen: list[str] = []
    real = os.scandir

    def counting(path: Any = ".") -> Any:
        seen.append(Path(os.fspath(path)).name)
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    return seen


def test_a_repeated_filtered_query_lists_only_the_partitions_it_keeps(
    tmp_path: Path, settled: None, scanned: list[str]
) -> None:
    root = _table(tmp_path / "t")
    first = resolve_table(str(root), filter=[("day", "in", [1, 2])])
    assert set(scanned) == {"t", "day=0", "day=1", "day=2"}
    scanned.clear()
    flt = [("day", "in", [4, 6]), ("x", ">", 0)]
    again = resolve_table(str(root), filter=flt)
    # neither the table's directory nor the first partition (its first object gave the
    # schema) is listed again: only the two partitions the filter keeps
    assert sorted(scanned) == ["day=4", "day=6"]
    assert again.schema == first.schema
    assert again.partitions_skipped == 6
    assert [Path(f.path).parent.name for f in again.files] == ["day=4", "day=6"]
    assert_same_rows(read_table(again, filter=flt), _reference(root, flt))


@pytest.mark.parametrize("change", ["added", "removed", "replaced"])
def test_a_partition_changed_between_two_queries_is_seen(
    tmp_path: Path, settled: None, change: str
) -> None:
    root = _table(tmp_path / "t")
    flt = [("day", ">=", 5)]
    assert len(resolve_table(str(root), filter=flt).files) == 3
    _next_tick(tmp_path / "clock", _changed_last(root))
    if change == "added":
        _write(root, "day=9/p.parquet", start=900)
        expected = 4
    elif change == "removed":
        shutil.rmtree(root / "day=6")
        expected = 2
    else:  # another directory of the same name: its data and a new inode
        shutil.rmtree(root / "day=7")
        _write(root, "day=7/q.parquet", start=700)
        expected = 3
    second = resolve_table(str(root), filter=flt)
    assert len(second.files) == expected
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))


def test_a_new_first_object_between_two_queries_gives_the_schema(
    tmp_path: Path, settled: None
) -> None:
    root = _table(tmp_path / "t")
    assert resolve_table(str(root), filter=[("day", "=", 3)]).schema.names == ["x", "day"]
    _next_tick(tmp_path / "clock", _changed_last(root))
    # an object before p.parquet in the first partition: the new first object
    wider = pa.table({"x": pa.array([1], pa.int64()), "y": pa.array([2.5])})
    _write(root, "day=0/a.parquet", table=wider)
    flt = [("day", "in", [0, 3])]
    second = resolve_table(str(root), filter=flt)
    assert second.schema.names == ["x", "y", "day"]
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))


def test_a_nested_partition_added_between_two_queries_is_seen(
    tmp_path: Path, settled: None
) -> None:
    root = tmp_path / "t"
    for year in (2024, 2025):
        for month in (1, 2):
            _write(root, f"year={year}/month={month}/p.parquet", start=year + month)
    flt = [("month", "=", 2)]
    assert len(resolve_table(str(root), filter=flt).files) == 2
    _next_tick(tmp_path / "clock", _changed_last(root))
    _write(root, "year=2025/month=3/p.parquet", start=1)  # under a listed directory
    _write(root, "year=2025/month=2/q.parquet", start=7)  # in a kept leaf
    flt = [("month", ">=", 2)]
    second = resolve_table(str(root), filter=flt)
    assert len(second.files) == 4
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))


def test_a_directory_changed_just_now_is_listed_again(tmp_path: Path, scanned: list[str]) -> None:
    """Changed within the filesystem clock's tick of a later change, a directory's
    stat cannot tell the two apart: its listing is not kept."""
    root = _table(tmp_path / "t")  # just written
    resolve_table(str(root), filter=[("day", "=", 1)])
    scanned.clear()
    resolve_table(str(root), filter=[("day", "=", 2)])
    assert "t" in scanned


def test_a_directory_holding_a_linked_object_is_listed_again(
    tmp_path: Path, settled: None, scanned: list[str]
) -> None:
    """Whether a ``*.parquet`` link is listed depends on its target, not on the
    directory: such a directory's listing is not kept."""
    root = _table(tmp_path / "t")
    elsewhere = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"x": pa.array([5], pa.int64())}), elsewhere)
    (root / "top.parquet").symlink_to(tmp_path / "missing.parquet")  # dangling now
    (root / "day=0" / "link.parquet").symlink_to(elsewhere)
    resolve_table(str(root), filter=[("day", "=", 1)])
    scanned.clear()
    resolve_table(str(root), filter=[("day", "=", 2)])
    assert {"t", "day=0"} <= set(scanned)


@pytest.fixture
def decided(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The filters whose partition test is made while the test runs."""
    from nexus_cache.tables import pruning

    made: list[Any] = []
    real = pruning.partition_test

    def counting(flt: Any) -> Any:
        made.append(flt)
        return real(flt)

    monkeypatch.setattr(pruning, "partition_test", counting)
    return made


def test_a_repeated_filter_decides_no_partition_again(
    tmp_path: Path, settled: None, decided: list[Any]
) -> None:
    root = _table(tmp_path / "t")
    one, two = [("day", "in", [1, 2])], [("day", ">=", 6), ("x", ">", 0)]
    first = resolve_table(str(root), filter=one)
    resolve_table(str(root), filter=two)
    assert len(decided) == 2
    decided.clear()
    # each filter's kept partitions come from the layout's memory: no test is made,
    # and the snapshot is the one the first resolution gave
    again, twice = resolve_table(str(root), filter=one), resolve_table(str(root), filter=two)
    assert decided == []
    assert again.files == first.files
    assert again.partitions_skipped == first.partitions_skipped == 6
    assert [Path(f.path).parent.name for f in twice.files] == ["day=6", "day=7"]
    assert twice.partitions_skipped == 6
    assert_same_rows(read_table(twice, filter=two), _reference(root, two))


def test_a_first_object_rewritten_in_place_decides_the_partitions_again(
    tmp_path: Path, settled: None, decided: list[Any]
) -> None:
    root = _table(tmp_path / "t")
    flt = [("day", "in", [0, 5])]
    assert len(resolve_table(str(root), filter=flt).files) == 2
    _next_tick(tmp_path / "clock", _changed_last(root))
    # the same name rewritten: no directory changes, the first object's schema does
    wider = pa.table({"x": pa.array([1], pa.int64()), "y": pa.array([2.5])})
    _write(root, "day=0/p.parquet", table=wider)
    os.utime(root / "day=0/p.parquet", ns=(1, 1))  # old enough for its schema to be kept
    decided.clear()
    second = resolve_table(str(root), filter=flt)
    assert len(decided) == 1  # a new schema: its filter and decisions are made anew
    assert second.schema.names == ["x", "y", "day"]
    assert [Path(f.path).parent.name for f in second.files] == ["day=0", "day=5"]
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))


def test_a_local_table_is_told_apart_without_fsspec(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsspec.implementations.local import LocalFileSystem

    root = _table(tmp_path / "t")
    flt = [("day", "=", 3)]
    resolve_table(str(root), filter=flt)
    asked: list[str] = []
    for name in ("isdir", "exists", "ls", "info"):
        real = getattr(LocalFileSystem, name)

        def counting(
            self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any
        ) -> Any:
            asked.append(_name)
            return _real(self, *args, **kw)

        monkeypatch.setattr(LocalFileSystem, name, counting)
    again = resolve_table(str(root), filter=flt)
    assert asked == []  # the kind of a local source is asked of the operating system
    assert again.kind == "hive"
    assert [Path(f.path).parent.name for f in again.files] == ["day=3"]
    # what tells a Delta or an Iceberg table apart is seen at the next resolution
    (root / "metadata").mkdir()
    assert resolve_table(str(root), filter=flt).kind == "hive"  # metadata/ with no version
    (root / "metadata" / "v1.metadata.json").write_text("{}")
    with pytest.raises(SourceFormatError, match="Iceberg table"):
        resolve_table(str(root), filter=flt)  # read as Iceberg now (a corrupt one)
    (root / "metadata" / "v1.metadata.json").unlink()
    (root / "_delta_log").mkdir()
    with pytest.raises(SourceFormatError, match="Delta table"):
        resolve_table(str(root), filter=flt)  # read as Delta now (an empty log)


def test_a_repeated_filter_lists_none_of_its_partitions_again(
    tmp_path: Path, settled: None, scanned: list[str]
) -> None:
    root = _table(tmp_path / "t")
    flt = [("day", "in", [1, 2]), ("x", ">", 0)]
    first = resolve_table(str(root), filter=flt)
    resolve_table(str(root), filter=flt)  # the layout kept: its kept leaves listed once more
    scanned.clear()
    again = resolve_table(str(root), filter=flt)
    # the kept leaves' stats prove their listings: nothing is listed, each object stat'ed
    assert scanned == []
    assert again == first
    assert_same_rows(read_table(again, filter=flt), _reference(root, flt))


@pytest.mark.parametrize("change", ["added", "removed", "rewritten", "renamed over"])
def test_an_object_changed_in_a_kept_partition_between_two_queries_is_seen(
    tmp_path: Path, settled: None, scanned: list[str], change: str
) -> None:
    root = _table(tmp_path / "t")
    flt = [("day", ">=", 6)]
    for _ in range(2):
        assert len(resolve_table(str(root), filter=flt).files) == 2
    _next_tick(tmp_path / "clock", _changed_last(root))
    longer = pa.table({"x": pa.array(range(600, 620), pa.int64())})
    if change == "added":
        _write(root, "day=6/q.parquet", start=660)
    elif change == "removed":
        (root / "day=7" / "p.parquet").unlink()
    elif change == "rewritten":  # the same name and inode: no directory changes, its size does
        _write(root, "day=6/p.parquet", table=longer)
    else:
        _write(root, "day=6/.new.parquet", table=longer)
        os.replace(root / "day=6/.new.parquet", root / "day=6/p.parquet")
    scanned.clear()
    second = resolve_table(str(root), filter=flt)
    expected = _reference(root, flt)
    assert sum(f.size for f in second.files) == sum(
        os.path.getsize(p) for p in root.glob("day=[67]/*.parquet")
    )
    assert_same_rows(read_table(second, filter=flt), expected)
    if change != "rewritten":
        assert scanned  # a leaf whose entries changed is listed again


def test_a_partition_changed_just_now_is_listed_on_every_query(
    tmp_path: Path, scanned: list[str]
) -> None:
    root = _table(tmp_path / "t")  # just written: not settled
    flt = [("day", "=", 3)]
    for _ in range(3):
        scanned.clear()
        resolve_table(str(root), filter=flt)
        assert "day=3" in scanned


@pytest.mark.parametrize("link", ["dangling", "to a directory"])
def test_a_kept_partition_whose_link_gets_a_file_target_is_seen(
    tmp_path: Path, settled: None, link: str
) -> None:
    """A ``*.parquet`` link in a kept partition that is not listed (its target missing,
    or a directory) is listed once its target becomes a file, though the
    partition's own stat is unchanged: a repeated filter does not keep its snapshot."""
    root = _table(tmp_path / "t")
    target = tmp_path / "target.parquet"
    if link == "to a directory":
        target.mkdir()
    (root / "day=6" / "q.parquet").symlink_to(target)
    flt = [("day", ">=", 6)]
    for _ in range(2):
        first = resolve_table(str(root), filter=flt)
        assert len(first.files) == 2
        assert_same_rows(read_table(first, filter=flt), _reference(root, flt))
    if link == "to a directory":
        target.rmdir()
    pq.write_table(pa.table({"x": pa.array([600, 601], pa.int64())}), target)
    second = resolve_table(str(root), filter=flt)
    assert len(second.files) == 3
    assert_same_rows(read_table(second, filter=flt), _reference(root, flt))
