"""A local Hive directory's listing (one scandir per directory) finds exactly what the
fsspec listing finds: files and links to files, not hidden or ``_`` entries, not
directories behind links, not FIFOs."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.tables import resolve_table
from nexus_cache.tables._hive import _listed_file, hidden_path


def _fsspec_listing(base: str) -> list[tuple[str, int]]:
    fs = fsspec.filesystem("file")
    found = fs.find(base, detail=True)
    return sorted(
        (name, int(info.get("size") or 0))
        for name, info in found.items()
        if _listed_file(name, info)
        and name.endswith(".parquet")
        and not hidden_path(name[len(base) :])
    )


def test_the_local_listing_equals_the_fsspec_listing(tmp_path: Path) -> None:
    root = tmp_path / "t"
    outside = tmp_path / "outside"
    outside.mkdir()
    table = pa.table({"x": [1, 2, 3]})
    for rel in ("a=1/p.parquet", "a=2/b=x/p.parquet", "a=3/p.parquet"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / rel)
    for rel in ("_tmp/a=9/p.parquet", ".hidden/p.parquet", "a=1/_part.parquet", "a=1/.p.parquet"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / rel)
    (root / "a=1" / "notes.txt").write_text("x")
    pq.write_table(pa.table({"x": list(range(50))}), outside / "big.parquet")
    os.symlink(outside / "big.parquet", root / "a=2" / "linked.parquet")  # a link to a file
    os.symlink(outside, root / "a=4")  # a directory behind a link: not entered
    os.symlink(tmp_path / "gone.parquet", root / "a=3" / "dangling.parquet")
    os.mkfifo(root / "a=3" / "fifo.parquet")
    snapshot = resolve_table(str(root))
    got = sorted((f.path, f.size) for f in snapshot.files)
    assert got == _fsspec_listing(str(root))
    assert len(got) == 4
    assert (str(root / "a=2" / "linked.parquet"), (outside / "big.parquet").stat().st_size) in got
