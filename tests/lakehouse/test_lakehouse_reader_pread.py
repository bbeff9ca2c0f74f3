"""Local hit reads: pread for byte reads, a lazily made mapping for zero-copy views."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from nexus_cache.errors import StalePlanError

from ._helpers import make_cache, write_old_file

DATA = os.urandom(3 * 65536 + 123)


def test_byte_reads_readinto_and_views_agree(tmp_path: Path) -> None:
    src = write_old_file(tmp_path / "src" / "a.bin", DATA)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        cache.read(str(src))  # fill
        with cache.open(str(src)) as f:
            assert f.is_local
            assert f.read(10) == DATA[:10]
            buf = bytearray(70000)
            assert f.readinto(buf) == 70000
            assert bytes(buf) == DATA[10:70010]
            assert f.tell() == 70010
            f.seek(-5, io.SEEK_END)
            small = bytearray(100)
            assert f.readinto(small) == 5  # stops at the end of the entry
            assert bytes(small[:5]) == DATA[-5:]
            assert f.readinto(small) == 0
            assert f.read() == b""
            assert f._mm is None  # byte reads never mapped the entry
            f.seek(1000)
            view = f.read_buffer(64)
            assert bytes(view) == DATA[1000:1064]
            assert f.tell() == 1064
            assert bytes(f.buffer()) == DATA
            assert f.read() == DATA[1064:]
            del view


def test_empty_entry_reads_empty(tmp_path: Path) -> None:
    src = write_old_file(tmp_path / "src" / "e.bin", b"")
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        cache.read(str(src))
        with cache.open(str(src)) as f:
            assert f.is_local
            assert f.read() == b""
            assert f.readinto(bytearray(8)) == 0
            assert bytes(f.read_buffer()) == b""
            assert bytes(f.buffer()) == b""


def test_a_kept_hit_plan_executes_again_and_rechecks_locally(tmp_path: Path) -> None:
    """Re-executing a plan is the documented way to skip the per-open identity check."""
    src = write_old_file(tmp_path / "src" / "k.bin", DATA)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.read(str(src))
        plan = cache.plan(str(src))
        for _ in range(2):
            with cache.execute(plan) as f:
                assert f.is_local
                assert f.read() == DATA
        cache.clear()
        with pytest.raises(StalePlanError, match="vanished"):
            cache.execute(plan)


@pytest.mark.parametrize("how", ["read", "readinto", "read_buffer", "buffer"])
def test_entry_truncated_under_an_open_handle_raises_never_short_data(
    tmp_path: Path, how: str
) -> None:
    from nexus_cache.errors import CacheIntegrityError

    data = os.urandom(1 << 20)
    src = write_old_file(tmp_path / "src" / "t.bin", data)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.read(str(src))
        with cache.open(str(src)) as f:
            assert f.is_local
            (entry,) = [p for p in (root / "entries").glob("*/*") if p.suffix != ".json"]
            os.truncate(entry, len(data) // 2)
            buf = bytearray(len(data))
            call = (lambda: f.readinto(buf)) if how == "readinto" else getattr(f, how)
            with pytest.raises(CacheIntegrityError, match="truncated"):
                call()
            assert not any(buf)  # nothing half-read was left in the caller's buffer
        # the next read plans afresh: the damaged entry is replaced
        assert cache.read(str(src)) == data
