"""A local Hive directory's schema comes from its first object's footer, read once per
file state: a repeated query does not read it again while the object's stat (device,
inode, size, mtime) is the one it was read with, and does read it again once the
object is rewritten (another size or mtime) or when it had changed too recently for
its stat to tell a later write apart."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import SourceFormatError
from nexus_cache.tables import resolve_table


def _table(root: Path, days: int = 4) -> Path:
    for day in range(days):
        path = root / f"day={day}" / "p.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": pa.array([day, day + 1], pa.int64())}), path)
    return root / "day=0" / "p.parquet"


def _age(path: Path, seconds: float) -> int:
    """Set ``path``'s mtime ``seconds`` in the past; that mtime in ns."""
    mtime_ns = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return mtime_ns


def _garble_in_place(path: Path, mtime_ns: int) -> None:
    """Overwrite every byte of ``path`` (same inode, same size), then put its mtime back."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.write(b"\xff" * size)
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize("flt", [[("day", "=", 2)], None], ids=["pruned", "full"])
def test_a_repeated_query_does_not_read_the_first_objects_schema_again(
    tmp_path: Path, flt: list[tuple[str, str, int]] | None
) -> None:
    first = _table(tmp_path / "t")
    mtime_ns = _age(first, 60)
    before = resolve_table(str(tmp_path / "t"), filter=flt)
    # the first object's bytes are no Parquet now, its stat unchanged: a read of
    # its footer would fail, so the second resolution proves none happened
    _garble_in_place(first, mtime_ns)
    again = resolve_table(str(tmp_path / "t"), filter=[("day", "=", 3)] if flt else None)
    assert again.schema == before.schema
    assert again.schema.names == ["x", "day"]


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_a_rewritten_first_object_is_read_again(tmp_path: Path, change: str) -> None:
    first = _table(tmp_path / "t")
    mtime_ns = _age(first, 60)
    resolve_table(str(tmp_path / "t"), filter=[("day", "=", 2)])
    _garble_in_place(first, mtime_ns)
    if change == "size":
        with open(first, "ab") as handle:
            handle.write(b"\xff")
        os.utime(first, ns=(mtime_ns, mtime_ns))
    else:
        _age(first, 30)
    with pytest.raises(SourceFormatError, match="not readable Parquet") as info:
        resolve_table(str(tmp_path / "t"), filter=[("day", "=", 3)])
    assert str(first) in str(info.value)


def test_a_first_object_changed_just_now_is_read_again(tmp_path: Path) -> None:
    """Written within the filesystem clock's tick of a later write, a file's stat
    cannot tell the two apart: its schema is not kept."""
    first = _table(tmp_path / "t")
    mtime_ns = first.stat().st_mtime_ns  # just written
    resolve_table(str(tmp_path / "t"), filter=[("day", "=", 2)])
    _garble_in_place(first, mtime_ns)
    with pytest.raises(SourceFormatError, match="not readable Parquet"):
        resolve_table(str(tmp_path / "t"), filter=[("day", "=", 3)])
