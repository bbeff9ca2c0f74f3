"""Resolved Delta snapshots are reused only while provably the table's content: a
new commit, a rewritten or removed log file, or any doubt loads the log again;
every read equals ``deltalake``'s own reader for the version it reports."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.service._helpers import age_files

from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables import read_table, resolve_table
from nexus_cache.tables._delta_snapshots import (
    DELTA_SNAPSHOTS,
    SNAPSHOT_CACHE_ENTRIES,
    SnapshotCache,
    log_state,
)

from ._compare import assert_same_rows

deltalake = pytest.importorskip("deltalake")


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    DELTA_SNAPSHOTS.clear()


def _batch(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([i % 3 for i in range(start, start + n)], pa.int32()),
            "v": pa.array([float(i) for i in range(start, start + n)]),
        }
    )


def _write(root: Path, start: int, n: int, mode: str = "append") -> None:
    deltalake.write_deltalake(str(root), _batch(start, n), mode=mode, partition_by=["k"])


def _same_as_deltalake(root: Path, version: int | None = None) -> int:
    snap = resolve_table(str(root), as_of=version)
    want = deltalake.DeltaTable(str(root), version=snap.version).to_pyarrow_table()
    assert_same_rows(read_table(snap), want.select(snap.schema.names))
    return int(snap.version)  # type: ignore[arg-type]


def test_an_unchanged_table_is_served_from_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, 0, 30)
    first = resolve_table(str(root))
    again = resolve_table(str(root) + "/")  # another spelling of the same table
    assert again.files is first.files  # reused, not loaded again
    assert again.location == str(root) + "/"  # the caller's source, not the first one's
    assert DELTA_SNAPSHOTS.hits == 1
    assert _same_as_deltalake(root) == 0


@pytest.mark.parametrize("change", ["append", "overwrite", "delete"])
def test_a_new_commit_after_a_cached_read_is_seen(tmp_path: Path, change: str) -> None:
    root = tmp_path / "t"
    _write(root, 0, 30)
    _write(root, 30, 30)
    age_files(root)  # identities by stat only: the new commit file must still be seen
    assert _same_as_deltalake(root) == 1
    assert resolve_table(str(root)).version == 1
    if change == "append":
        _write(root, 100, 7)
    elif change == "overwrite":
        _write(root, 200, 5, mode="overwrite")
    else:
        deltalake.DeltaTable(str(root)).delete("v > 20")
    assert _same_as_deltalake(root) == 2
    assert resolve_table(str(root)).version == 2


def test_as_of_old_versions_stay_right_beside_the_latest(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, 0, 20)
    _write(root, 20, 20)
    deltalake.DeltaTable(str(root)).delete("k = 1")
    _write(root, 50, 10, mode="overwrite")
    for _ in range(2):  # the second round is served from the cache
        for version in (0, 1, 2, 3, None):
            assert _same_as_deltalake(root, version) == (3 if version is None else version)
    assert DELTA_SNAPSHOTS.hits >= 5
    with pytest.raises(ConfigError, match="as_of=4"):
        resolve_table(str(root), as_of=4)
    _write(root, 90, 3)
    assert _same_as_deltalake(root, 4) == 4


def test_two_tables_at_once_keep_their_own_snapshots(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one, 0, 12)
    _write(two, 100, 9)
    for _ in range(2):
        assert _same_as_deltalake(one) == 0
        assert _same_as_deltalake(two) == 0
    _write(two, 300, 4)
    assert _same_as_deltalake(one) == 0
    assert _same_as_deltalake(two) == 1
    assert resolve_table(str(one)).files != resolve_table(str(two)).files


def test_a_table_written_again_at_the_same_version_is_read_again(tmp_path: Path) -> None:
    """A table removed and written anew (its version 0 again, the same size of
    commit file, within the file system's time granularity) is not the cached one."""
    root = tmp_path / "t"
    _write(root, 0, 10)
    assert _same_as_deltalake(root) == 0
    shutil.rmtree(root)
    _write(root, 500, 10)
    snap = resolve_table(str(root))
    assert snap.version == 0
    assert min(read_table(snap)["v"].to_pylist()) == 500.0
    assert _same_as_deltalake(root) == 0


def test_a_rewritten_commit_file_is_read_again(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, 0, 10)
    age_files(root)
    first = resolve_table(str(root))
    commit = root / "_delta_log" / f"{0:020d}.json"
    lines = commit.read_text().splitlines()
    kept = [line for line in lines if '"path":"k=1' not in line.replace(" ", "")]
    assert len(kept) < len(lines)
    commit.write_text("\n".join(kept) + "\n")  # not what Delta does: any rewrite is seen
    again = resolve_table(str(root))
    assert len(again.files) == len(first.files) - 1
    assert again.files is not first.files


def test_readers_while_a_writer_commits_each_equal_deltalake_at_their_version(
    tmp_path: Path,
) -> None:
    root = tmp_path / "t"
    _write(root, 0, 10)
    commits = 6
    done = threading.Event()
    results: list[tuple[int, pa.Table]] = []
    errors: list[BaseException] = []
    seen = threading.Condition()

    def reader() -> None:
        try:
            while not done.is_set():
                snap = resolve_table(str(root))
                table = read_table(snap)
                with seen:
                    results.append((int(snap.version), table))  # type: ignore[arg-type]
                    seen.notify_all()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(commits):
            _write(root, 100 * (i + 1), 5 + i)
            with seen:  # a reader has read this version (and the cache held the last)
                assert seen.wait_for(
                    lambda v=i + 1: done.is_set() or any(r[0] == v for r in results), 60
                )
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert _same_as_deltalake(root) == commits
    wants = {
        v: deltalake.DeltaTable(str(root), version=v).to_pyarrow_table().select(["k", "v"])
        for v in range(commits + 1)
    }
    assert set(range(1, commits + 1)) <= {v for v, _ in results}  # every version was read
    for version, table in results:
        assert_same_rows(table.select(["k", "v"]), wants[version])


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    tables = [tmp_path / f"t{i}" for i in range(SNAPSHOT_CACHE_ENTRIES + 2)]
    for i, root in enumerate(tables):
        _write(root, i, 3)
        resolve_table(str(root))
    assert len(DELTA_SNAPSHOTS) == SNAPSHOT_CACHE_ENTRIES
    hits = DELTA_SNAPSHOTS.hits
    resolve_table(str(tables[-1]))
    assert DELTA_SNAPSHOTS.hits == hits + 1  # the newest is kept
    resolve_table(str(tables[0]))
    assert DELTA_SNAPSHOTS.hits == hits + 1  # the oldest was dropped
    assert len(DELTA_SNAPSHOTS) == SNAPSHOT_CACHE_ENTRIES
    small = SnapshotCache(entries=1)
    snap = resolve_table(str(tables[0]))
    small.put(("a",), (1,), snap)
    small.put(("b",), (1,), snap)
    assert len(small) == 1
    assert small.get(("a",), (1,)) is None
    assert small.get(("b",), (2,)) is None  # another stamp: dropped
    assert len(small) == 0


def _names_state(root: Path) -> int | None:
    state = log_state(None, str(root))
    return None if state is None else state.latest


def test_the_log_listing_reads_versions_and_doubts_what_it_cannot_prove(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, 0, 5)
    _write(root, 5, 5)
    log = root / "_delta_log"
    # files that are not commits: a checksum, a compaction, a writer's temporary file
    (log / f"{1:020d}.crc").write_text("{}")
    (log / f"{0:020d}.{1:020d}.compacted.json").write_text("")
    (log / f".{2:020d}.json.tmp").write_text("")
    (log / "_last_checkpoint").write_text(json.dumps({"version": 0, "size": 1}))
    assert _names_state(root) == 1
    state = log_state(None, str(root))
    assert state is not None
    assert state.stamp(1) is not None
    assert state.stamp(7) is None
    (log / f"{5:020d}.checkpoint.parquet").write_bytes(b"")  # newer than every commit
    assert _names_state(root) is None
    (log / f"{5:020d}.checkpoint.parquet").unlink()
    (log / "_commits").mkdir()  # commits not yet in the log
    assert _names_state(root) is None
    (log / "_commits").rmdir()
    assert _names_state(tmp_path / "missing") is None
    assert _names_state(root) == 1
    (log / "_last_checkpoint").unlink()  # it names no checkpoint: deltalake refuses it
    assert _same_as_deltalake(root) == 1


def test_a_removed_commit_file_is_a_doubt_and_reads_as_today(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _write(root, 0, 5)
    _write(root, 5, 5)
    deltalake.DeltaTable(str(root)).create_checkpoint()
    assert _same_as_deltalake(root, 0) == 0
    (root / "_delta_log" / f"{0:020d}.json").unlink()  # a cleaned-up log
    with pytest.raises(SourceFormatError, match="log cannot be read"):
        resolve_table(str(root), as_of=0)  # as deltalake says, not from the cache
    got = read_table(resolve_table(str(root)))
    assert got.num_rows == 10
    assert pc.sum(got["v"]).as_py() == sum(range(10))
