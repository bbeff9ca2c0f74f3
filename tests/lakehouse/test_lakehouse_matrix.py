"""Every cell of the policy matrix, end to end on a real S3 API (moto) and on local files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

from nexus_cache.lakehouse import CacheStatus, EventKind, FillMode, LakehouseCache, ReadMode

from ._helpers import entry_files, fill_counts, make_cache, put_object, write_old_file

DATA = os.urandom(300_000)

# (read, policy, hit) -> (status, read mode, fill mode, entry exists afterwards)
CELLS: dict[tuple[str, str, bool], tuple[CacheStatus, ReadMode, FillMode, bool]] = {
    ("enabled", "disabled", True): (CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE, True),
    ("enabled", "disabled", False): (CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE, False),
    ("enabled", "read_through", True): (CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE, True),
    ("enabled", "read_through", False): (
        CacheStatus.MISS,
        ReadMode.REMOTE,
        FillMode.BACKGROUND,
        True,
    ),
    ("enabled", "fill_before_read", True): (CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE, True),
    ("enabled", "fill_before_read", False): (
        CacheStatus.MISS,
        ReadMode.LOCAL,
        FillMode.BLOCKING,
        True,
    ),
    ("disabled", "disabled", True): (CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE, True),
    ("disabled", "disabled", False): (CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE, False),
    ("disabled", "read_through", True): (CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE, True),
    ("disabled", "read_through", False): (
        CacheStatus.MISS,
        ReadMode.REMOTE,
        FillMode.BACKGROUND,
        True,
    ),
    ("disabled", "fill_before_read", True): (
        CacheStatus.BYPASS,
        ReadMode.REMOTE,
        FillMode.NONE,
        True,
    ),
    ("disabled", "fill_before_read", False): (
        CacheStatus.MISS,
        ReadMode.REMOTE,
        FillMode.BACKGROUND,
        True,
    ),
}


def _prefill(root: Path, source: str, fs: Any) -> None:
    with make_cache(root, policy="fill_before_read") as warm:
        assert warm.prefetch(source, fs=fs)


def _check_cell(
    cache: LakehouseCache, root: Path, source: str, fs: Any, cell: tuple[str, str, bool]
) -> None:
    status, mode, fill, entry_after = CELLS[cell]
    fills_before = fill_counts(cache)
    with cache.open(source, fs=fs) as f:
        assert f.read() == DATA
        diag = f.diagnostics
        assert f.is_local == (mode is ReadMode.LOCAL)
    assert (diag.cache_status, diag.read_mode, diag.fill_mode) == (status, mode, fill)
    assert cache.wait_for_fills(timeout=30)
    files = entry_files(root)
    assert bool(files) == entry_after
    if files:
        assert files[0].read_bytes() == DATA
    new_fills = fill_counts(cache) - fills_before
    assert new_fills == (1 if fill is not FillMode.NONE else 0)
    assert cache.events.reads()[-1] == diag


@pytest.mark.parametrize(
    "cell", list(CELLS), ids=lambda c: f"read={c[0]}-{c[1]}-{'hit' if c[2] else 'miss'}"
)
def test_matrix_on_s3(
    tmp_path: Path, s3: Any, s3_endpoint: str, s3_bucket: str, cell: tuple[str, str, bool]
) -> None:
    read, policy, hit = cell
    put_object(s3_endpoint, s3_bucket, "t/part-0.parquet", DATA)
    source = f"s3://{s3_bucket}/t/part-0.parquet"
    root = tmp_path / "cache"
    if hit:
        _prefill(root, source, s3)
    with make_cache(root, read=read, policy=policy) as cache:
        _check_cell(cache, root, source, s3, cell)


@pytest.mark.parametrize(
    "cell", list(CELLS), ids=lambda c: f"read={c[0]}-{c[1]}-{'hit' if c[2] else 'miss'}"
)
def test_matrix_on_local_files(tmp_path: Path, cell: tuple[str, str, bool]) -> None:
    read, policy, hit = cell
    source = str(write_old_file(tmp_path / "remote" / "part-0.parquet", DATA))
    root = tmp_path / "cache"
    if hit:
        _prefill(root, source, None)
    with make_cache(root, read=read, policy=policy) as cache:
        _check_cell(cache, root, source, None, cell)


def test_root_only_uses_hits_without_filling(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "remote" / "a.parquet", DATA))
    other = str(write_old_file(tmp_path / "remote" / "b.parquet", DATA[:10]))
    root = tmp_path / "cache"
    _prefill(root, source, None)
    cache = LakehouseCache.from_env({"NEXUS_LAKEHOUSE_CACHE_ROOT": str(root)})
    with cache.open(source) as f:
        assert f.diagnostics.cache_status is CacheStatus.HIT
    with cache.open(other) as f:
        assert f.read() == DATA[:10]
        assert f.diagnostics.read_mode is ReadMode.REMOTE
    assert len(entry_files(root)) == 1


def test_root_only_config_says_policy_disabled_on_a_miss(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    cache = LakehouseCache.from_env({"NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "c")})
    with cache, cache.open(source) as f:
        assert f.read() == DATA
        diag = f.diagnostics
    assert (diag.cache_status, diag.fill_mode, diag.reason) == (
        CacheStatus.MISS,
        FillMode.NONE,
        "policy_disabled",
    )


def test_no_root_reads_remote(tmp_path: Path, s3: Any, s3_endpoint: str, s3_bucket: str) -> None:
    put_object(s3_endpoint, s3_bucket, "x.parquet", DATA)
    cache = LakehouseCache.from_env({"NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read"})
    with cache.open(f"s3://{s3_bucket}/x.parquet", fs=s3) as f:
        assert f.read() == DATA
        diag = f.diagnostics
    assert (diag.cache_status, diag.read_mode, diag.fill_mode) == (
        CacheStatus.BYPASS,
        ReadMode.REMOTE,
        FillMode.NONE,
    )
    assert diag.reason == "no_root"


def test_storage_options_url(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    put_object(s3_endpoint, s3_bucket, "y.parquet", DATA)
    url = f"s3://{s3_bucket}/y.parquet"
    opts = {"client_kwargs": {"endpoint_url": s3_endpoint}, "skip_instance_cache": True}
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        assert cache.read(url, storage_options=opts) == DATA
        with cache.open(url, storage_options=opts) as f:
            assert f.diagnostics.cache_status is CacheStatus.HIT


def test_etagless_store_bypasses_and_never_fills(tmp_path: Path) -> None:
    mem = fsspec.filesystem("memory")
    mem.pipe("/lake/no-etag.parquet", DATA)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        with cache.open("memory://lake/no-etag.parquet") as f:
            assert f.read() == DATA
            diag = f.diagnostics
        assert diag.cache_status is CacheStatus.BYPASS
        assert diag.reason == "no_content_identity"
        assert not cache.prefetch("/lake/no-etag.parquet", fs=mem)
    assert entry_files(root) == []


def test_too_new_local_file_bypasses(tmp_path: Path) -> None:
    source = tmp_path / "fresh.parquet"
    source.write_bytes(DATA)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache, cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.BYPASS
        assert f.diagnostics.reason == "local_file_too_new"
    assert entry_files(root) == []


def test_bypass_threshold_and_too_large(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "big.parquet", DATA))
    cache = make_cache(tmp_path / "c1", policy="fill_before_read", bypass_bytes=1000)
    with cache, cache.open(source) as f:
        assert f.diagnostics.cache_status is CacheStatus.BYPASS
        assert f.diagnostics.reason == "large_object"
    with make_cache(tmp_path / "c2", policy="fill_before_read", max_bytes=1000) as cache:
        with cache.open(source) as f:
            assert f.read() == DATA
            assert f.diagnostics.read_mode is ReadMode.REMOTE
            assert f.diagnostics.reason == "too_large"
        assert cache.events.events(EventKind.FILL_SKIPPED)[0].reason == "too_large"
    assert entry_files(tmp_path / "c2") == []


@pytest.mark.parametrize("policy", ["disabled", "read_through", "fill_before_read"])
def test_prefetch_honours_max_bytes(tmp_path: Path, policy: str) -> None:
    fits = str(write_old_file(tmp_path / "fits.parquet", b"x" * 1024))
    over = str(write_old_file(tmp_path / "over.parquet", b"x" * 1025))
    root = tmp_path / "c"
    with make_cache(root, policy=policy, max_bytes=1024) as cache:
        assert not cache.prefetch(over)
        (skipped,) = cache.events.events(EventKind.FILL_SKIPPED)
        assert (skipped.reason, skipped.nbytes) == ("too_large", 1025)
        assert entry_files(root) == []
        assert cache.prefetch(fits)
    assert len(entry_files(root)) == 1


def test_hit_read_is_memory_mapped_and_seekable(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        cache.prefetch(source)
        with cache.open(source) as f:
            assert f.is_local
            assert f.size == len(DATA)
            f.seek(-10, os.SEEK_END)
            assert f.read() == DATA[-10:]
            f.seek(100)
            buf = bytearray(50)
            assert f.readinto(buf) == 50
            assert bytes(buf) == DATA[100:150]
            view = f.buffer()
            assert hashlib.sha256(view).digest() == hashlib.sha256(DATA).digest()
            view.release()
