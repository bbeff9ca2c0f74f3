"""S3 fills within the byte budget: one pinned GET, hashed while it is written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from ._helpers import entry_files, make_cache, make_s3fs, put_object

OLD = os.urandom(300_000)
NEW = os.urandom(300_000)


def _count_gets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    import s3fs.core

    calls: list[tuple[int, int]] = []
    original = s3fs.core.S3File._fetch_range

    def counting(self: Any, start: int, end: int) -> bytes:
        calls.append((start, end))
        return original(self, start, end)

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counting)
    return calls


def test_fill_within_budget_is_one_get(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse.fill import _fill as fill_module

    monkeypatch.setattr(fill_module, "_CHUNK", 64 * 1024)  # many write/hash steps
    put_object(s3_endpoint, s3_bucket, "f.parquet", OLD)
    fs = make_s3fs(s3_endpoint)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        calls = _count_gets(monkeypatch)
        assert cache.read(f"s3://{s3_bucket}/f.parquet", fs=fs) == OLD
        assert calls == [(0, len(OLD))]
        assert cache.verify(remove=False) == {}  # the recorded SHA-256 matches
    (entry,) = entry_files(root)
    assert entry.read_bytes() == OLD


def test_fill_larger_than_budget_uses_budget_sized_gets(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_object(s3_endpoint, s3_bucket, "g.parquet", OLD)
    fs = make_s3fs(s3_endpoint)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read", fill_max_host_bytes=100_000) as cache:
        calls = _count_gets(monkeypatch)
        assert cache.read(f"s3://{s3_bucket}/g.parquet", fs=fs) == OLD
        assert [end - start for start, end in calls] == [100_000, 100_000, 100_000]
    (entry,) = entry_files(root)
    assert hashlib.sha256(entry.read_bytes()).digest() == hashlib.sha256(OLD).digest()


def test_overwrite_during_a_one_get_fill_keeps_the_planned_bytes(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse.fill import _fill as fill_module

    put_object(s3_endpoint, s3_bucket, "h.parquet", OLD)
    original = fill_module._write_chunk
    overwritten: list[bool] = []

    def overwrite_once(fd: int, data: Any) -> None:
        if not overwritten:
            overwritten.append(True)
            put_object(s3_endpoint, s3_bucket, "h.parquet", NEW)
        original(fd, data)

    monkeypatch.setattr(fill_module, "_CHUNK", 64 * 1024)
    monkeypatch.setattr(fill_module, "_write_chunk", overwrite_once)
    fs = make_s3fs(s3_endpoint)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        # the GET answered for the planned ETag before the overwrite: its bytes are
        # the planned object's, published under the planned identity only
        assert cache.read(f"s3://{s3_bucket}/h.parquet", fs=fs) == OLD
        assert overwritten
        assert cache.verify(remove=False) == {}
        # the next plan sees the new identity, misses, and fills the new bytes
        assert cache.read(f"s3://{s3_bucket}/h.parquet", fs=fs) == NEW
    assert sorted(p.read_bytes() for p in entry_files(root)) == sorted([OLD, NEW])
