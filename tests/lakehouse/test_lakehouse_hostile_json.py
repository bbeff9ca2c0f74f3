"""Hostile files under a root: JSON nested deeper than ``json`` can parse
(RecursionError), and FIFOs where a record, a summary, the layout or an entry
should be (opening one waits for a writer: it must be refused, not waited on)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_cache.errors import CacheIntegrityError
from nexus_cache.lakehouse import CacheStatus, LakehouseRoot, read_stats

from ._helpers import entry_files, make_cache, write_old_file

_DEEP = b"[" * 100_000 + b"]" * 100_000


def test_deeply_nested_read_summary_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(str(write_old_file(tmp_path / "a.parquet", os.urandom(100))))
    cache.close()  # writes its summary
    (root / "stats" / "deep.json").write_bytes(_DEEP)
    stats = read_stats(root)  # raised RecursionError (and so did `lakehouse stats`)
    assert (stats["processes"], stats["reads"]["total"]) == (1, 1)


def test_entry_with_a_deeply_nested_record_is_bad_for_verify(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(str(write_old_file(tmp_path / "a.parquet", os.urandom(100))))
    (data,) = entry_files(root)
    data.with_name(data.name + ".json").write_bytes(_DEEP)
    listed = LakehouseRoot(root)
    assert [e.location for e in listed.entries()] == [None]  # `ls` raised RecursionError
    assert listed.verify().bad == {data.name: "identity record missing or unreadable"}
    assert entry_files(root) == []
    cache.close()


def test_deeply_nested_layout_is_an_integrity_error(tmp_path: Path) -> None:
    root = tmp_path / "c"
    make_cache(root).close()
    (root / "layout.json").write_bytes(_DEEP)
    with pytest.raises(CacheIntegrityError, match=r"layout\.json"):
        make_cache(root)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


@pytest.mark.timeout(60)
def test_fifos_in_a_root_are_refused_not_waited_on(tmp_path: Path) -> None:
    # Each of these used to hang its reader until something wrote to the FIFO:
    # `lakehouse ls`/`verify` (a record), `lakehouse stats` (a summary), every
    # open of the root (layout.json), a read of an empty object (its entry:
    # a FIFO's lstat size, 0, passed for the entry's).
    root = tmp_path / "c"
    source = str(write_old_file(tmp_path / "a.parquet", os.urandom(100)))
    empty = str(write_old_file(tmp_path / "empty.parquet", b""))
    with make_cache(root, policy="fill_before_read") as cache:
        cache.read(source)
        cache.read(empty)
    by_size = {p.stat().st_size: p for p in entry_files(root)}
    record = by_size[100].with_name(by_size[100].name + ".json")
    _fifo(record)
    _fifo(by_size[0])
    (summary,) = (root / "stats").glob("*.json")
    _fifo(summary)

    assert read_stats(root)["processes"] == 0  # the summary is skipped
    listed = LakehouseRoot(root)
    # the FIFO entry is not listed; the entry whose record is a FIFO has no location
    assert [(e.size, e.location) for e in listed.entries()] == [(100, None)]
    with make_cache(root) as cache, cache.open(empty) as f:
        assert f.read() == b""
        assert (f.diagnostics.cache_status, f.diagnostics.reason) == (
            CacheStatus.BYPASS,
            "entry_refused",
        )
    bad = listed.verify().bad
    assert bad[by_size[100].name] == "identity record missing or unreadable"
    assert "not a regular file" in bad[by_size[0].name]

    _fifo(root / "layout.json")
    with pytest.raises(CacheIntegrityError, match=r"layout\.json.*not a regular file"):
        make_cache(root)
