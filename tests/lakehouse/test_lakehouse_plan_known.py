"""LakehouseCache.plan_known: an object planned from a known identity, with no
request; its size is checked when it is read."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from nexus_cache.errors import StalePlanError
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig


def _cache(tmp_path: Path) -> LakehouseCache:
    return LakehouseCache(
        LakehouseCacheConfig(
            root=tmp_path / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
        )
    )


class _Counting(MemoryFileSystem):
    """fsspec's memory store (no ETag, no version id), counting metadata requests."""

    protocol = "countmem"
    infos = 0

    def info(self, path, **kwargs):  # type: ignore[no-untyped-def]
        type(self).infos += 1
        return super().info(path, **kwargs)


def test_an_immutable_object_plans_without_a_request_and_a_resized_one_is_stale(
    tmp_path: Path,
) -> None:
    fs = _Counting(skip_instance_cache=True)
    base = f"/plan-known-{tmp_path.name}"
    fs.pipe(f"{base}/a.parquet", b"x" * 1000)
    fs.pipe(f"{base}/b.parquet", b"y" * 500)
    with _cache(tmp_path) as cache:
        _Counting.infos = 0
        plan_a = cache.plan_known(f"{base}/a.parquet", 1000, fs=fs)
        plan_b = cache.plan_known(f"{base}/b.parquet", 500, fs=fs)
        assert _Counting.infos == 0  # no metadata request at planning
        assert plan_a.identity is not None
        assert plan_a.identity.content.kind == "immutable"
        assert plan_a.status.value == "miss"
        with cache.execute(plan_a) as handle:  # a store with no ETag: the size proves it
            assert handle.read() == b"x" * 1000
        again = cache.plan_known(f"{base}/a.parquet", 1000, fs=fs)
        assert again.status.value == "hit"
        assert again.key == plan_a.key
        fs.pipe(f"{base}/b.parquet", b"y" * 499)  # truncated after planning
        with pytest.raises(StalePlanError, match="changed since it was planned"):
            cache.execute(plan_b)


def test_a_local_file_of_another_size_than_known_is_stale_at_planning(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    path.write_bytes(b"z" * 300)
    past = time.time() - 60
    os.utime(path, (past, past))
    with _cache(tmp_path) as cache:
        plan = cache.plan_known(str(path), 300)
        assert plan.key == cache.plan(str(path)).key  # a local file: planned as by plan
        with pytest.raises(StalePlanError, match="299 were expected"):
            cache.plan_known(str(path), 299)
