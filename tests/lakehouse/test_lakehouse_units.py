"""Identity, policy matrix, fill limits and events: the parts without a store."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from nexus_cache.lakehouse import (
    CacheEvent,
    CacheStatus,
    EventKind,
    EventLog,
    FillMode,
    LakehouseCacheConfig,
    ReadDiagnostics,
    ReadMode,
)
from nexus_cache.lakehouse._identity import resolve_identity
from nexus_cache.lakehouse._limits import FillLimits
from nexus_cache.lakehouse._policy import decide

from ._helpers import make_s3fs, put_object, write_old_file

# --- identity ---------------------------------------------------------------


def test_local_identity_uses_size_mtime_inode(tmp_path: Path) -> None:
    path = write_old_file(tmp_path / "a.parquet", b"abc")
    res = resolve_identity(None, str(path))
    assert res.identity is not None
    st = os.stat(path)
    content = res.identity.content
    assert (content.size, content.mtime_ns, content.inode) == (3, st.st_mtime_ns, st.st_ino)
    assert res.identity.location == f"file://{path}"
    assert res.identity.domain.protocol == "file"
    assert len(res.identity.key) == 64


def test_local_file_too_new_is_bypassed(tmp_path: Path) -> None:
    path = tmp_path / "new.parquet"
    path.write_bytes(b"abc")
    res = resolve_identity(None, str(path), local_min_age_s=30.0)
    assert res.identity is None
    assert res.bypass_reason == "local_file_too_new"


def test_local_identity_changes_with_content(tmp_path: Path) -> None:
    path = write_old_file(tmp_path / "a.parquet", b"abc")
    key1 = resolve_identity(None, str(path)).identity.key  # type: ignore[union-attr]
    write_old_file(path, b"abd", age_s=30.0)
    key2 = resolve_identity(None, str(path)).identity.key  # type: ignore[union-attr]
    assert key1 != key2


def test_symlink_resolves_to_the_same_identity(tmp_path: Path) -> None:
    path = write_old_file(tmp_path / "a.parquet", b"abc")
    link = tmp_path / "link.parquet"
    link.symlink_to(path)
    assert resolve_identity(None, str(link)).identity == resolve_identity(None, str(path)).identity


def test_missing_local_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        resolve_identity(None, str(tmp_path / "nope"))


def test_etagless_fsspec_store_is_bypassed() -> None:
    mem = fsspec.filesystem("memory")
    mem.pipe("/bucket/x.parquet", b"data")
    res = resolve_identity(mem, "/bucket/x.parquet")
    assert res.identity is None
    assert res.bypass_reason == "no_content_identity"
    assert res.size == 4


def test_s3_identity_has_domain_etag_version(s3_endpoint: str, s3_bucket: str) -> None:
    put = put_object(s3_endpoint, s3_bucket, "t/a.parquet", b"0123456789")
    fs = make_s3fs(s3_endpoint)
    res = resolve_identity(fs, f"s3://{s3_bucket}/t/a.parquet")
    ident = res.identity
    assert ident is not None
    assert ident.domain.protocol == "s3"
    assert ident.domain.endpoint == s3_endpoint
    assert ident.domain.container == s3_bucket
    assert ident.content.etag == put["ETag"]
    assert ident.content.version_id == put["VersionId"]
    assert ident.content.size == 10
    assert ident.location == f"s3://{s3_bucket}/t/a.parquet"
    # same object through a path without the protocol: same key
    assert resolve_identity(fs, f"{s3_bucket}/t/a.parquet").identity == ident
    put_object(s3_endpoint, s3_bucket, "t/a.parquet", b"0123456789")
    again = resolve_identity(fs, f"{s3_bucket}/t/a.parquet").identity
    assert again is not None
    assert again.key != ident.key  # a new version is a new entry


def test_other_endpoint_is_another_domain(s3_endpoint: str, s3_bucket: str) -> None:
    put_object(s3_endpoint, s3_bucket, "a", b"x")
    fs = make_s3fs(s3_endpoint)
    ident = resolve_identity(fs, f"{s3_bucket}/a").identity
    fs2 = make_s3fs(s3_endpoint.replace("127.0.0.1", "localhost"))
    ident2 = resolve_identity(fs2, f"{s3_bucket}/a").identity
    assert ident is not None
    assert ident2 is not None
    assert ident.content == ident2.content
    assert ident.key != ident2.key


# --- policy matrix ------------------------------------------------------------

_MATRIX: list[tuple[str, str, bool, CacheStatus, ReadMode, FillMode]] = [
    ("enabled", "disabled", True, CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE),
    ("enabled", "disabled", False, CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE),
    ("enabled", "read_through", True, CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE),
    ("enabled", "read_through", False, CacheStatus.MISS, ReadMode.REMOTE, FillMode.BACKGROUND),
    ("enabled", "fill_before_read", True, CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE),
    ("enabled", "fill_before_read", False, CacheStatus.MISS, ReadMode.LOCAL, FillMode.BLOCKING),
    ("disabled", "disabled", True, CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE),
    ("disabled", "disabled", False, CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE),
    ("disabled", "read_through", True, CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE),
    ("disabled", "read_through", False, CacheStatus.MISS, ReadMode.REMOTE, FillMode.BACKGROUND),
    ("disabled", "fill_before_read", True, CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE),
    (
        "disabled",
        "fill_before_read",
        False,
        CacheStatus.MISS,
        ReadMode.REMOTE,
        FillMode.BACKGROUND,
    ),
]


@pytest.mark.parametrize(("read", "policy", "present", "status", "mode", "fill"), _MATRIX)
def test_policy_matrix(
    read: str,
    policy: str,
    present: bool,
    status: CacheStatus,
    mode: ReadMode,
    fill: FillMode,
) -> None:
    config = LakehouseCacheConfig(root="/c", read=read, policy=policy, max_bytes=1000)
    decision = decide(config, 10, present)
    assert (decision.status, decision.read_mode, decision.fill_mode) == (status, mode, fill)


@pytest.mark.parametrize("policy", ["disabled", "read_through", "fill_before_read"])
@pytest.mark.parametrize("present", [True, False])
def test_policy_bypasses_objects_over_bypass_bytes(policy: str, present: bool) -> None:
    config = LakehouseCacheConfig(root="/c", policy=policy, max_bytes=1000, bypass_bytes=100)
    decision = decide(config, 101, present)
    assert (decision.status, decision.fill_mode, decision.reason) == (
        CacheStatus.BYPASS,
        FillMode.NONE,
        "large_object",
    )
    assert decide(config, 100, present).reason != "large_object"


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_policy_reads_objects_over_max_bytes_remotely_without_fill(policy: str) -> None:
    config = LakehouseCacheConfig(root="/c", policy=policy, max_bytes=1000)
    decision = decide(config, 1001, False)
    assert (decision.status, decision.read_mode, decision.fill_mode, decision.reason) == (
        CacheStatus.MISS,
        ReadMode.REMOTE,
        FillMode.NONE,
        "too_large",
    )
    assert decide(config, 1001, True).status is CacheStatus.HIT  # a hit is served


# --- fill limits --------------------------------------------------------------


def test_limits_bound_concurrency_and_bytes() -> None:
    limits = FillLimits(max_concurrency=2, max_host_bytes=100)
    a = limits.try_acquire(60)
    assert a is not None
    assert limits.try_acquire(50) is None  # bytes
    b = limits.try_acquire(40)
    assert b is not None
    assert limits.try_acquire(0) is None  # concurrency
    assert limits.in_flight() == (2, 100)
    a.release()
    a.release()  # idempotent
    assert limits.in_flight() == (1, 40)
    b.release()
    assert limits.in_flight() == (0, 0)


def test_oversized_fill_runs_alone() -> None:
    limits = FillLimits(max_concurrency=4, max_host_bytes=100)
    big = limits.try_acquire(10_000)
    assert big is not None
    assert big.charge == 100
    assert limits.try_acquire(1) is None
    big.release()
    small = limits.try_acquire(1)
    assert small is not None
    assert limits.try_acquire(10_000) is None
    small.release()


def test_acquire_waits_a_bounded_time() -> None:
    limits = FillLimits(max_concurrency=1, max_host_bytes=100)
    held = limits.try_acquire(1)
    assert held is not None
    start = time.monotonic()
    assert limits.acquire(1, timeout=0.2) is None
    assert 0.15 <= time.monotonic() - start < 30  # bounded (generously, for a loaded host)
    timer = threading.Timer(0.1, held.release)
    timer.start()
    lease = limits.acquire(1, timeout=5.0)
    timer.join()
    assert lease is not None
    lease.release()


# --- events -------------------------------------------------------------------


def test_event_log_is_bounded_and_calls_back(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []
    log = EventLog(capacity=3, callback=seen.append)
    with caplog.at_level(logging.INFO, logger="nexus_cache.lakehouse"):
        for i in range(5):
            log.emit(CacheEvent(EventKind.FILL_COMPLETED, key=str(i), location="x", nbytes=i))
        log.emit(CacheEvent(EventKind.FILL_FAILED, key="k", location="x", reason="enospc"))
    events = log.events()
    assert [e.key for e in events] == ["3", "4", "k"]
    assert log.events(EventKind.FILL_FAILED)[0].reason == "enospc"
    assert log.counts()["fill_completed"] == 5
    assert len(seen) == 6
    assert any("enospc" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    diag = ReadDiagnostics("s3://b/k", CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE)
    log.record_read(diag)
    assert log.reads() == [diag]
    assert log.counts()["read.hit"] == 1
    assert diag.to_dict()["cache_status"] == "hit"


def test_failing_callback_does_not_break_emit(caplog: pytest.LogCaptureFixture) -> None:
    def boom(_: Any) -> None:
        raise RuntimeError("observer bug")

    log = EventLog(callback=boom)
    with caplog.at_level(logging.ERROR, logger="nexus_cache.lakehouse"):
        log.emit(CacheEvent(EventKind.FILL_SKIPPED, key=None, location=None, reason="no_budget"))
    assert log.counts()["fill_skipped"] == 1
    assert any("callback failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("conc", "nbytes", "named"), [(0, 10, "max_concurrency"), (1, 0, "max_host_bytes")]
)
def test_limits_refuse_a_zero_budget_as_config_error(conc: int, nbytes: int, named: str) -> None:
    from nexus_cache.errors import ConfigError

    with pytest.raises(ConfigError, match=named):
        FillLimits(max_concurrency=conc, max_host_bytes=nbytes)
