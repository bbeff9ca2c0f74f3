"""A cache root removed while a process uses it: reads keep working, fills resume.
Also what every read proves with or without a root: a regular file and its identity."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import fsspec
import pytest

from nexus_cache.lakehouse import CacheStatus, EventKind, FillMode, ReadMode

from ._helpers import entry_files, make_cache, write_old_file


def _objects(tmp_path: Path, n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = os.urandom(4096 + i)
        out.append((str(write_old_file(tmp_path / "lake" / f"o{i}.bin", data)), data))
    return out


def test_fill_before_read_survives_a_removed_root(tmp_path: Path) -> None:
    (a, a_bytes), (b, b_bytes), (c, c_bytes) = _objects(tmp_path, 3)
    root = tmp_path / "cache"
    with make_cache(root, policy="fill_before_read") as cache:
        assert cache.read(a) == a_bytes
        shutil.rmtree(root)
        # a never-cached object: served remotely, the root comes back
        with cache.open(b) as f:
            assert f.read() == b_bytes
            diag = f.diagnostics
        assert (diag.read_mode, diag.fill_mode) == (ReadMode.REMOTE, FillMode.BLOCKING)
        assert diag.reason == "fill_failed:root_removed"
        removed = cache.events.events(EventKind.ROOT_UNAVAILABLE)
        assert [e.reason for e in removed] == ["removed"]
        assert (root / "layout.json").is_file()
        # later fills work again, for the removed entry and new ones
        for source, data in ((a, a_bytes), (c, c_bytes), (b, b_bytes)):
            with cache.open(source) as f:
                assert f.read() == data
                assert (f.diagnostics.cache_status, f.diagnostics.read_mode) == (
                    CacheStatus.MISS,
                    ReadMode.LOCAL,
                )
        with cache.open(a) as f:
            assert f.read() == a_bytes
            assert f.diagnostics.cache_status is CacheStatus.HIT
    assert len(entry_files(root)) == 3


def test_read_through_survives_a_removed_root(tmp_path: Path) -> None:
    (a, a_bytes), (b, b_bytes) = _objects(tmp_path, 2)
    root = tmp_path / "cache"
    with make_cache(root, policy="read_through") as cache:
        assert cache.read(a) == a_bytes
        assert cache.wait_for_fills(30)
        shutil.rmtree(root)
        assert cache.read(b) == b_bytes  # its background fill finds no root
        assert cache.wait_for_fills(30)
        assert [e.reason for e in cache.events.events(EventKind.ROOT_UNAVAILABLE)] == ["removed"]
        assert cache.read(b) == b_bytes  # a miss again, filled in the background
        assert cache.wait_for_fills(30)
        with cache.open(b) as f:
            assert f.read() == b_bytes
            assert f.diagnostics.cache_status is CacheStatus.HIT


@pytest.mark.timeout(15)
@pytest.mark.parametrize("with_root", [False, True])
def test_a_fifo_is_refused_not_opened(tmp_path: Path, with_root: bool) -> None:
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    root = tmp_path / "cache" if with_root else None
    with make_cache(root, policy="fill_before_read") as cache:
        with pytest.raises(IsADirectoryError, match="not a regular file"):
            cache.open(str(fifo))
        with pytest.raises(IsADirectoryError, match="not a regular file"):
            fsspec.open(f"nexus::{fifo}", nexus={"cache": cache}).open()


def test_without_a_root_a_read_carries_its_proven_identity(tmp_path: Path) -> None:
    ((source, data),) = _objects(tmp_path, 1)
    with make_cache(None) as cache, cache.open(source) as f:
        assert f.read() == data
        diag = f.diagnostics
    assert (diag.cache_status, diag.reason) == (CacheStatus.BYPASS, "no_root")
    assert diag.key is not None
    assert len(diag.key) == 64
