"""Deferred identity check of a warm S3 hit: overlapped with the local read, yet gating it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

import nexus_cache.lakehouse.identity._known as known_module
from nexus_cache.errors import StalePlanError
from nexus_cache.lakehouse import CacheStatus, EventKind

from ._helpers import make_cache, make_s3fs, put_object

OLD = os.urandom(300_000)
NEW = os.urandom(300_000)  # same size: only the identity tells them apart


def _warm(cache: Any, source: str, fs: Any) -> None:
    """Fill the entry and let the cache remember the object's identity."""
    assert cache.prefetch(source, fs=fs)


def test_unchanged_object_reads_from_the_entry(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "u.parquet", OLD)
    source = f"s3://{s3_bucket}/u.parquet"
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        _warm(cache, source, fs)
        for reader in ("read", "readinto", "read_buffer", "buffer"):
            with cache.open(source, fs=fs) as f:
                assert f.is_local
                assert f.diagnostics.cache_status is CacheStatus.HIT
                if reader == "read":
                    got = f.read()
                elif reader == "readinto":
                    buf = bytearray(len(OLD))
                    assert f.readinto(buf) == len(OLD)
                    got = bytes(buf)
                else:
                    got = bytes(getattr(f, reader)())
            assert got == OLD, reader
        assert not cache.events.events(EventKind.STALE_PLAN)


@pytest.mark.parametrize("reader", ["read", "readinto", "read_buffer", "buffer", "fileno", "size"])
def test_overwrite_before_first_read_replans_and_serves_the_new_object(
    tmp_path: Path,
    s3_endpoint: str,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    reader: str,
) -> None:
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "o.parquet", OLD)
    source = f"s3://{s3_bucket}/o.parquet"
    real = known_module.resolve_identity
    gate = threading.Event()
    newer = NEW + b"-longer"  # sizes differ too: a caller sizing by the old one would break

    def probe_after_overwrite(*args: Any, **kwargs: Any) -> Any:
        # the probe runs after the overwrite, which the test does after open()
        if threading.current_thread().name.startswith("nexus-lakehouse-probe"):
            assert gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(known_module, "resolve_identity", probe_after_overwrite)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        _warm(cache, source, fs)
        f = cache.open(source, fs=fs)  # a hit of the old entry, probe pending
        with f:
            assert f.diagnostics.cache_status is CacheStatus.HIT
            put_object(s3_endpoint, s3_bucket, "o.parquet", newer)
            gate.set()
            if reader == "size":
                assert f.size == len(newer)
                got = f.read()
            elif reader == "readinto":
                buf = bytearray(len(newer))
                assert f.readinto(buf) == len(newer)
                got = bytes(buf)
            elif reader == "fileno":
                got = os.pread(f.fileno(), len(newer) + 1, 0)
            else:
                got = bytes(getattr(f, reader)())
            assert got == newer
            assert f.diagnostics.cache_status is CacheStatus.MISS  # the new plan's
        statuses = [d.cache_status for d in cache.events.reads()]
        assert CacheStatus.STALE in statuses  # the old plan is still reported
        assert len(cache.events.events(EventKind.STALE_PLAN)) == 1
        assert cache.read(source, fs=fs) == newer


def test_a_failed_probe_keeps_refusing_the_entry(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that errors proves nothing: no later call serves bytes without a proof."""
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "f.parquet", OLD)
    source = f"s3://{s3_bucket}/f.parquet"
    real = known_module.resolve_identity
    unreachable = {"probe"}

    def failing(*args: Any, **kwargs: Any) -> Any:
        in_probe = threading.current_thread().name.startswith("nexus-lakehouse-probe")
        if "all" in unreachable or in_probe:
            raise ConnectionError("store unreachable")
        return real(*args, **kwargs)

    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        _warm(cache, source, fs)
        monkeypatch.setattr(known_module, "resolve_identity", failing)
        with cache.open(source, fs=fs) as f:
            with pytest.raises(ConnectionError):
                f.read()
            unreachable.add("all")  # the handle's fresh plan cannot prove it either
            with pytest.raises(ConnectionError):
                f.read()
            unreachable.clear()
            with pytest.raises(StalePlanError, match="identity check failed"):
                f.read()  # one fresh plan per handle: refused for good now
            with pytest.raises(StalePlanError):
                f.buffer()
        with cache.open(source, fs=fs) as f:  # a new open proves it and serves
            assert f.read() == OLD


def test_probe_overlaps_the_local_read(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local pread starts while the (slow) probe is still running.

    Ordering is proven with events, not wall-clock thresholds: the probe waits
    until the read's pread has started; run sequentially, it would never see it.
    """
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "p.parquet", OLD)
    source = f"s3://{s3_bucket}/p.parquet"
    real_probe = known_module.resolve_identity
    real_pread = os.pread
    pread_started = threading.Event()
    seen: list[bool] = []

    def slow_probe(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("nexus-lakehouse-probe"):
            seen.append(pread_started.wait(10))  # an S3 request slower than the read
        return real_probe(*args, **kwargs)

    def pread(fd: int, n: int, offset: int) -> bytes:
        pread_started.set()
        return real_pread(fd, n, offset)

    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        _warm(cache, source, fs)
        monkeypatch.setattr(known_module, "resolve_identity", slow_probe)
        monkeypatch.setattr(os, "pread", pread)
        with cache.open(source, fs=fs) as f:
            assert f.read() == OLD
    assert seen == [True]


def test_read_disabled_and_local_sources_do_not_defer(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "r.parquet", OLD)
    source = f"s3://{s3_bucket}/r.parquet"
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        _warm(cache, source, fs)
    with make_cache(root, read="disabled") as cache:
        _warm(cache, source, fs)
        assert cache._scanner._remembered(source, fs, source, None) is None
        with cache.open(source, fs=fs) as f:
            assert f.diagnostics.cache_status is CacheStatus.BYPASS
            assert f.read() == OLD
    local = tmp_path / "l.bin"
    local.write_bytes(OLD)
    with make_cache(root) as cache:
        assert cache._scanner._remembered(str(local), None, str(local), None) is None
