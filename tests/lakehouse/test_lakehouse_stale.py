"""Plan, then execute: stale plans are rejected, never served."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.errors import StalePlanError
from nexus_cache.lakehouse import CacheStatus, EventKind, FillMode, ReadMode

from ._helpers import entry_files, make_cache, make_s3fs, put_object, write_old_file

OLD = os.urandom(200_000)
NEW = os.urandom(200_000)  # same size: only the identity tells them apart


@pytest.mark.parametrize("policy", ["disabled", "read_through", "fill_before_read"])
@pytest.mark.parametrize("version_aware", [False, True])
def test_s3_overwrite_between_plan_and_execution(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, policy: str, version_aware: bool
) -> None:
    fs = make_s3fs(s3_endpoint, version_aware=version_aware)
    put_object(s3_endpoint, s3_bucket, "t/a.parquet", OLD)
    source = f"s3://{s3_bucket}/t/a.parquet"
    root = tmp_path / "c"
    with make_cache(root, policy=policy) as cache:
        plan = cache.plan(source, fs=fs)
        assert plan.status is CacheStatus.MISS
        put_object(s3_endpoint, s3_bucket, "t/a.parquet", NEW)
        with pytest.raises(StalePlanError, match="changed since it was planned"):
            cache.execute(plan)
        assert cache.events.reads()[-1].cache_status is CacheStatus.STALE
        assert cache.events.events(EventKind.STALE_PLAN)
        assert cache.wait_for_fills(timeout=30)
        assert entry_files(root) == []  # nothing of the old plan was published
        # a fresh plan sees the new object
        assert cache.read(source, fs=fs) == NEW


def test_overwrite_during_remote_read_is_stale(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    fs = make_s3fs(s3_endpoint, default_block_size=65536)
    put_object(s3_endpoint, s3_bucket, "b.parquet", OLD)
    with make_cache(tmp_path / "c") as cache:
        f = cache.open(f"s3://{s3_bucket}/b.parquet", fs=fs)
        with f:
            assert f.read(10) == OLD[:10]
            put_object(s3_endpoint, s3_bucket, "b.parquet", NEW)
            f.seek(150_000)  # past the first read-ahead block
            with pytest.raises(StalePlanError, match="overwritten"):
                f.read(10)


def test_planned_hit_vanished_is_stale(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", OLD))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        plan = cache.plan(source)
        assert plan.status is CacheStatus.HIT
        assert plan.expected_size == len(OLD)
        (data,) = entry_files(root)
        data.unlink()
        with pytest.raises(StalePlanError, match="vanished"):
            cache.execute(plan)
        assert cache.events.reads()[-1].cache_status is CacheStatus.STALE
        # open() plans again: a miss, filled before the read
        with cache.open(source) as f:
            assert f.read() == OLD
            assert f.diagnostics.fill_mode is FillMode.BLOCKING


def test_planned_hit_resized_is_stale(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", OLD))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        plan = cache.plan(source)
        (data,) = entry_files(root)
        with open(data, "r+b") as f:
            f.truncate(100)
        with pytest.raises(StalePlanError, match="100 bytes"):
            cache.execute(plan)


def test_local_source_changed_between_plan_and_execution(tmp_path: Path) -> None:
    path = write_old_file(tmp_path / "a.parquet", OLD)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        plan = cache.plan(str(path))
        write_old_file(path, NEW, age_s=30)
        with pytest.raises(StalePlanError):
            cache.execute(plan)
        assert entry_files(tmp_path / "c") == []


def test_hit_execution_survives_concurrent_unlink(tmp_path: Path) -> None:
    """Once executed, a hit keeps its descriptor: removal cannot tear the read."""
    source = str(write_old_file(tmp_path / "a.parquet", OLD))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        with cache.open(source) as f:
            assert f.diagnostics.read_mode is ReadMode.LOCAL
            for p in entry_files(root):
                p.unlink()
            assert f.read() == OLD


def test_open_gives_up_after_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", OLD))
    with make_cache(tmp_path / "c") as cache:
        calls: list[Any] = []

        def always_stale(plan: Any, replan: Any = None) -> Any:
            calls.append(plan)
            raise StalePlanError("test")

        monkeypatch.setattr(cache._scanner, "_execute", always_stale)
        with pytest.raises(StalePlanError):
            cache.open(source, retries=2)
        assert len(calls) == 3


def test_background_fill_of_a_changed_object_publishes_nothing(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "c.parquet", OLD)
    root = tmp_path / "c"
    with make_cache(root, policy="read_through") as cache:
        with cache.open(f"s3://{s3_bucket}/c.parquet", fs=fs) as f:
            assert f.read() == OLD
            put_object(s3_endpoint, s3_bucket, "c.parquet", NEW)
        # the fill starts at close, pinned to OLD's identity: it must refuse NEW
        assert cache.wait_for_fills(timeout=30)
        (event,) = cache.events.events(EventKind.FILL_FAILED)
        assert event.reason == "stale"
        assert event.fill_mode is FillMode.BACKGROUND
    assert entry_files(root) == []


def test_overwrite_during_a_fill_is_caught_by_if_match(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse.fill import _fill as fill_module

    fs = make_s3fs(s3_endpoint)
    put_object(s3_endpoint, s3_bucket, "d.parquet", OLD)
    original = fill_module._write_chunk
    overwritten: list[bool] = []

    def overwrite_once(fd: int, data: bytes) -> None:
        if not overwritten:
            overwritten.append(True)
            put_object(s3_endpoint, s3_bucket, "d.parquet", NEW)
        original(fd, data)

    # several requests per fill, as for an object larger than the fill byte budget
    # (within the budget a fill is one GET, which an overwrite cannot split)
    monkeypatch.setattr(fill_module, "_CHUNK", 64 * 1024)
    monkeypatch.setattr(fill_module, "_MAX_REQUEST", 64 * 1024)
    monkeypatch.setattr(fill_module, "_write_chunk", overwrite_once)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        plan = cache.plan(f"s3://{s3_bucket}/d.parquet", fs=fs)
        with pytest.raises(StalePlanError, match="overwritten during the fill"):
            cache.execute(plan)
        assert overwritten
        assert entry_files(root) == []
        assert list((root / "tmp").iterdir()) == []
        # open() plans again and fills the new object
        assert cache.read(f"s3://{s3_bucket}/d.parquet", fs=fs) == NEW
        assert entry_files(root)[0].read_bytes() == NEW
