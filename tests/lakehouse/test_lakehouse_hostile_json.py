"""JSON files under a root nested deeper than ``json`` can parse (RecursionError)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_cache.errors import CacheIntegrityError
from nexus_cache.lakehouse import LakehouseRoot, read_stats

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
