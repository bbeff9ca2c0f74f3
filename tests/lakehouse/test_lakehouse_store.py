"""Entries on disk: records, retention with pins, faults, fill limits."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash
from fsspec.implementations.memory import MemoryFileSystem

from nexus_cache.errors import CacheIntegrityError, CacheSecurityError, FillError
from nexus_cache.lakehouse import (
    CacheStatus,
    EventKind,
    FillLimits,
    FillMode,
    LakehouseCache,
    LakehouseCacheConfig,
    ReadMode,
)
from nexus_cache.lakehouse import _fill as fill_module

from ._helpers import entry_files, fill_counts, make_cache, write_old_file

DATA = os.urandom(150_000)


def _sources(tmp_path: Path, n: int, size: int = 100_000) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = os.urandom(size)
        out.append((str(write_old_file(tmp_path / "remote" / f"p{i}.parquet", data)), data))
    return out


def test_record_is_json_with_identity_and_digest(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        assert cache.prefetch(source)
        key = cache.plan(source).key
    (data,) = entry_files(root)
    assert data.name == key
    record = json.loads(data.with_name(f"{key}.json").read_text())
    assert record["key"] == key
    assert record["size"] == len(DATA)
    assert record["digest"] == "xxh3_128:" + xxhash.xxh3_128(DATA).hexdigest()
    assert record["identity"]["location"] == f"file://{source}"
    assert oct(data.stat().st_mode & 0o777) == "0o600"
    assert oct(root.stat().st_mode & 0o777) == "0o700"


def test_retention_is_lru_and_spares_pinned_entries(tmp_path: Path) -> None:
    sources = _sources(tmp_path, 4)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read", max_bytes=10**6) as cache:
        for src, _ in sources:
            cache.prefetch(src)
        pinned = cache.open(sources[0][0])  # a hit pins it until closed
        # age the access times: p0 oldest ... p3 newest
        for i, (src, _) in enumerate(sources):
            path = cache.store.data_path(cache.plan(src).key)  # type: ignore[union-attr]
            os.utime(path, ns=(10**18 + i * 10**9, path.stat().st_mtime_ns))
        with cache.open(sources[1][0]):
            pass  # a hit refreshes p1's access time: now the newest
        result = cache.prune(max_bytes=250_000)
        assert result.pinned_skipped >= 1
        keys_left = {p.name for p in entry_files(root)}
        plan_keys = [cache.plan(s).key for s, _ in sources]
        assert plan_keys[0] in keys_left  # pinned: kept although least recently used
        assert plan_keys[1] in keys_left  # recently hit
        assert plan_keys[2] not in keys_left  # least recently used unpinned
        assert result.total_bytes <= 250_000
        assert pinned.read() == sources[0][1]
        pinned.close()
        assert cache.prune(max_bytes=1).removed == 2
        assert entry_files(root) == []


def test_retention_after_fills_keeps_the_target(tmp_path: Path) -> None:
    sources = _sources(tmp_path, 5)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read", max_bytes=250_000) as cache:
        for src, data in sources:
            assert cache.read(src) == data
        assert sum(p.stat().st_size for p in entry_files(root)) <= 250_000
        assert len(entry_files(root)) == 2


def test_retention_runs_at_open(tmp_path: Path) -> None:
    sources = _sources(tmp_path, 3)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        for src, _ in sources:
            cache.prefetch(src)
    make_cache(root, policy="fill_before_read", max_bytes=150_000).close()
    assert len(entry_files(root)) == 1


def test_truncated_entry_is_detected_and_refilled(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        (data,) = entry_files(root)
        with open(data, "r+b") as f:
            f.truncate(1000)
        with cache.open(source) as f:
            assert f.read() == DATA
            assert f.diagnostics.cache_status is CacheStatus.MISS
            assert f.diagnostics.fill_mode is FillMode.BLOCKING
        assert cache.events.events(EventKind.ENTRY_REMOVED)
        assert fill_counts(cache) == 2
        assert cache.verify() == {}


def test_corrupted_entry_is_detected_and_refilled(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        (data,) = entry_files(root)
        with open(data, "r+b") as f:
            f.seek(1234)
            f.write(bytes([DATA[1234] ^ 0xFF]))
        bad = cache.verify()
        assert list(bad.values()) == ["content digest differs from the record"]
        assert entry_files(root) == []
        assert cache.read(source) == DATA
        assert fill_counts(cache) == 2
        assert entry_files(root)[0].read_bytes() == DATA


@pytest.mark.parametrize(
    ("digest", "good"),
    [
        ("sha256:" + hashlib.sha256(DATA).hexdigest(), True),  # an earlier version's record
        ("sha256:" + hashlib.sha256(DATA[:-1]).hexdigest(), False),
        ("md5:" + hashlib.md5(DATA).hexdigest(), False),  # no algorithm this version knows
        ("xxh3_128:" + xxhash.xxh3_128(DATA[1:]).hexdigest(), False),
    ],
)
def test_verify_checks_each_records_own_digest_algorithm(
    tmp_path: Path, digest: str, good: bool
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        (data,) = entry_files(root)
        record_path = data.with_name(data.name + ".json")
        record = json.loads(record_path.read_text())
        record["digest"] = digest
        record_path.write_text(json.dumps(record))
        bad = cache.verify()
        if good:
            assert bad == {}
            assert entry_files(root) == [data]
        else:
            assert list(bad.values()) == ["content digest differs from the record"]
            assert entry_files(root) == []


@pytest.mark.parametrize(("code", "reason"), [(errno.ENOSPC, "enospc"), (errno.EDQUOT, "edquot")])
@pytest.mark.parametrize("policy", ["fill_before_read", "read_through"])
def test_disk_full_during_fill_reads_remote_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str, policy: str
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    calls = []

    def full_disk(fd: int, data: bytes) -> None:
        calls.append(len(data))
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fill_module, "_write_chunk", full_disk)
    with make_cache(root, policy=policy) as cache:
        with cache.open(source) as f:
            assert f.read() == DATA
            assert f.diagnostics.read_mode is ReadMode.REMOTE
        assert cache.wait_for_fills(timeout=30)
        assert calls
        (event,) = cache.events.events(EventKind.FILL_FAILED)
        assert event.reason == reason
        assert str(code) in event.error or os.strerror(code) in event.error  # type: ignore[operator]
        if policy == "fill_before_read":
            assert f.diagnostics.reason == f"fill_failed:{reason}"
    assert entry_files(root) == []
    assert list((root / "tmp").iterdir()) == []
    assert list((root / "entries").glob("*/*.json")) == []


class _LyingStore(MemoryFileSystem):
    """An fsspec store with ETags whose size metadata can lie."""

    protocol = "lying"
    extra = 0

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        out = dict(super().info(path, **kwargs))
        data = self.cat_file(path)
        out["ETag"] = hashlib.md5(data).hexdigest()
        out["size"] = out["size"] + self.extra
        return out


def test_generic_store_with_etag_is_cached(tmp_path: Path) -> None:
    fs = _LyingStore(skip_instance_cache=True)
    fs.pipe("/b/x.parquet", DATA)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        with cache.open("/b/x.parquet", fs=fs) as f:
            assert f.read() == DATA
            assert f.diagnostics.read_mode is ReadMode.LOCAL
        with cache.open("/b/x.parquet", fs=fs) as f:
            assert f.diagnostics.cache_status is CacheStatus.HIT


def test_byte_count_validation_rejects_a_short_object(tmp_path: Path) -> None:
    fs = _LyingStore(skip_instance_cache=True)
    fs.extra = 7  # metadata claims 7 bytes more than the object holds
    fs.pipe("/b/x.parquet", DATA)
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        with pytest.raises(FillError, match="validation"):
            cache.prefetch("/b/x.parquet", fs=fs)
        (event,) = cache.events.events(EventKind.FILL_FAILED)
        assert event.reason == "validation"
    assert entry_files(root) == []


def test_background_fill_without_budget_is_skipped(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    limits = FillLimits(max_concurrency=1, max_host_bytes=1 << 20)
    held = limits.try_acquire(1)
    config = LakehouseCacheConfig(root=tmp_path / "c", policy="read_through", max_bytes=1 << 30)
    with LakehouseCache(config, limits=limits) as cache:
        assert cache.read(source) == DATA
        assert cache.wait_for_fills(timeout=5)
        (event,) = cache.events.events(EventKind.FILL_SKIPPED)
        assert event.reason == "no_budget"
        assert event.fill_mode is FillMode.BACKGROUND
        assert entry_files(tmp_path / "c") == []
        assert held is not None
        held.release()
        assert cache.read(source) == DATA  # budget back: this miss warms the cache
        assert cache.wait_for_fills(timeout=30)
        assert len(entry_files(tmp_path / "c")) == 1


def test_blocking_fill_waits_a_bounded_time_then_reads_remote(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    limits = FillLimits(max_concurrency=1, max_host_bytes=1 << 20)
    held = limits.try_acquire(1)
    config = LakehouseCacheConfig(
        root=tmp_path / "c",
        policy="fill_before_read",
        max_bytes=1 << 30,
        blocking_fill_timeout_s=0.3,
    )
    with LakehouseCache(config, limits=limits) as cache:
        start = time.monotonic()
        with cache.open(source) as f:
            assert f.read() == DATA
            assert f.diagnostics.read_mode is ReadMode.REMOTE
            assert f.diagnostics.reason == "fill_timeout:no_budget"
        # bounded by its 0.3 s setting (generously: the host may be loaded); the
        # fill itself never gets its budget
        assert 0.25 < time.monotonic() - start < 30
        (event,) = cache.events.events(EventKind.FILL_TIMEOUT)
        assert event.reason == "no_budget"
        # another filler holding the entry lock: same bounded wait, then remote
        assert held is not None
        held.release()
        key = cache.plan(source).key
        lock = cache.store.lock(key)  # type: ignore[union-attr,arg-type]
        assert lock.acquire(timeout=0)
        try:
            with cache.open(source) as f:
                assert f.read() == DATA
                assert f.diagnostics.reason == "fill_timeout:lock"
        finally:
            lock.release()
    assert entry_files(tmp_path / "c") == []


def test_background_fills_share_one_budget(tmp_path: Path) -> None:
    sources = _sources(tmp_path, 6, size=300_000)
    limits = FillLimits(max_concurrency=2, max_host_bytes=10**6)
    config = LakehouseCacheConfig(root=tmp_path / "c", policy="read_through", max_bytes=1 << 30)
    seen_max = 0

    def observe(_: Any) -> None:
        nonlocal seen_max
        seen_max = max(seen_max, limits.in_flight()[0])

    with LakehouseCache(config, limits=limits, on_event=observe) as cache:
        for src, data in sources:
            assert cache.read(src) == data
        assert cache.wait_for_fills(timeout=30)
        counts = cache.events.counts()
        assert counts.get("fill_completed", 0) + counts.get("fill_skipped", 0) == 6
    assert seen_max <= 2
    assert limits.in_flight() == (0, 0)


def test_orphan_record_is_removed_at_open(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
        key = cache.plan(source).key
    data = entry_files(root)[0]
    data.unlink()  # as if a fill crashed between the record and the publication
    record = data.with_name(f"{key}.json")
    os.utime(record, (time.time() - 7200, time.time() - 7200))
    make_cache(root).close()
    assert not record.exists()


def test_foreign_layout_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir(mode=0o700)
    (root / "layout.json").write_text('{"format": "something-else"}')
    with pytest.raises(CacheIntegrityError, match="layout"):
        make_cache(root)


def test_symlinked_root_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CacheSecurityError):
        make_cache(link)


def test_stats_report_reads_and_bytes(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        cache.read(source)
        cache.read(source)
        stats = cache.stats(recent=1)
    assert stats["root"] == str(tmp_path / "c")
    assert stats["entries"] == 1
    assert stats["bytes"] == len(DATA)
    assert stats["reads"] == {
        "hit": 1,
        "miss": 1,
        "miss-followed": 0,
        "bypass": 0,
        "stale": 0,
        "total": 2,
    }
    assert stats["read_modes"] == {"local": 2, "remote": 0}
    assert stats["fill_modes"] == {"none": 1, "background": 0, "blocking": 1}
    assert stats["events"]["fill_completed"] == 1
    (last,) = stats["recent_reads"]
    assert (last["cache_status"], last["read_mode"], last["fill_mode"]) == ("hit", "local", "none")
    assert stats["counts"]["read.hit"] == 1


def test_read_stats_merges_closed_caches_of_a_root(tmp_path: Path) -> None:
    from nexus_cache.errors import ConfigError
    from nexus_cache.lakehouse import read_stats

    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    for _ in range(2):
        with make_cache(root, policy="fill_before_read") as cache:
            cache.read(source)
    stats = read_stats(root, recent=5)
    assert stats["processes"] == 2  # two caches: two summaries
    assert (stats["reads"]["miss"], stats["reads"]["hit"]) == (1, 1)
    assert [r["cache_status"] for r in stats["recent_reads"]] == ["miss", "hit"]
    (root / "stats" / "junk.json").write_text("[1, 2")  # malformed: skipped
    assert read_stats(root)["processes"] == 2
    with pytest.raises(FileNotFoundError):
        read_stats(tmp_path / "missing")
    with pytest.raises(ConfigError, match="NEXUS_LAKEHOUSE_CACHE_ROOT"):
        read_stats()


@pytest.mark.parametrize("log_reads", [True, False])
def test_log_reads_setting_logs_each_read_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_reads: bool
) -> None:
    import logging

    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    caplog.set_level(logging.INFO, logger="nexus_cache.lakehouse")
    with make_cache(tmp_path / "c", policy="fill_before_read", log_reads=log_reads) as cache:
        cache.read(source)
        cache.read(source)
    lines = [r.getMessage() for r in caplog.records if "lakehouse read" in r.getMessage()]
    if not log_reads:
        assert lines == []
        return
    assert lines == [
        f"lakehouse read {source}: miss local fill=blocking",
        f"lakehouse read {source}: hit local fill=none",
    ]


def test_threads_missing_one_object_do_one_fill(tmp_path: Path) -> None:
    import threading

    source = str(write_old_file(tmp_path / "a.parquet", os.urandom(3 << 20)))
    expected = Path(source).read_bytes()
    results: list[bytes] = []
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        barrier = threading.Barrier(6)

        def reader() -> None:
            barrier.wait()
            results.append(cache.read(source))

        threads = [threading.Thread(target=reader) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [expected] * 6
        assert fill_counts(cache) == 1


def test_background_fill_of_one_key_runs_once(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    with make_cache(tmp_path / "c", policy="read_through") as cache:
        handles = [cache.open(source) for _ in range(3)]
        for h in handles:
            assert h.diagnostics.fill_mode is FillMode.BACKGROUND
            h.close()
        assert cache.wait_for_fills(timeout=30)
        assert fill_counts(cache) == 1
        skipped = cache.events.events(EventKind.FILL_SKIPPED)
        # the later closes found the fill queued or running, or the entry already there
        assert all(e.reason == "in_progress" for e in skipped)


def test_full_filesystem_creating_a_new_root_reads_remotely_with_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse import CacheStatus, EventKind, LakehouseCache

    source = str(write_old_file(tmp_path / "src" / "a.parquet", b"payload"))
    full = tmp_path / "full"
    real_mkdir = os.mkdir

    def mkdir_on_full_disk(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(str(full)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir_on_full_disk)
    cache = LakehouseCache.from_env(
        {
            "NEXUS_LAKEHOUSE_CACHE_ROOT": str(full / "root"),
            "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
            "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1M",
        }
    )
    with cache:
        (event,) = cache.events.events(EventKind.ROOT_UNAVAILABLE)
        assert event.reason == "enospc"
        assert str(full / "root") in str(event.location)
        with cache.open(source) as f:
            assert f.read() == b"payload"
            assert f.diagnostics.cache_status is CacheStatus.BYPASS
            assert f.diagnostics.reason == "root_unavailable"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
@pytest.mark.parametrize("policy", ["disabled", "fill_before_read"])
def test_foreign_owned_entry_reads_remotely_and_verify_lists_it_and_goes_on(
    tmp_path: Path, policy: str
) -> None:
    from nexus_cache.lakehouse import CacheStatus, EventKind, ReadMode

    a = str(write_old_file(tmp_path / "a.parquet", DATA))
    b = str(write_old_file(tmp_path / "b.parquet", DATA[::-1]))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(a)
        cache.prefetch(b)
        foreign_key = cache.plan(a).key
    foreign = root / "entries" / foreign_key[:2] / foreign_key
    os.chown(foreign, 54321, 54321)
    with make_cache(root, policy=policy) as cache:
        for _ in range(2):  # the second open tries the remembered-identity path too
            with cache.open(a) as f:
                assert f.read() == DATA
                diag = f.diagnostics
            assert (diag.cache_status, diag.read_mode, diag.reason) == (
                CacheStatus.BYPASS,
                ReadMode.REMOTE,
                "entry_refused",
            )
        refused = cache.events.events(EventKind.ENTRY_REFUSED)
        assert refused
        assert "54321" in str(refused[0].reason)
        assert cache.read(b) == DATA[::-1]  # other entries still hit
        bad = cache.verify(remove=False)
        assert list(bad) == [foreign_key]
        assert "54321" in bad[foreign_key]
        assert cache.verify() == bad  # removed this time
        assert not foreign.exists()
        assert len(entry_files(root)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_foreign_owned_entry_of_a_remembered_s3_object_reads_remotely(
    tmp_path: Path, s3: Any, s3_endpoint: str, s3_bucket: str
) -> None:
    from nexus_cache.lakehouse import CacheStatus, EventKind

    from ._helpers import put_object

    put_object(s3_endpoint, s3_bucket, "x.parquet", DATA)
    url = f"s3://{s3_bucket}/x.parquet"
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        assert cache.read(url, fs=s3) == DATA  # fills, and remembers the identity
        key = cache.plan(url, fs=s3).key
        assert key is not None
        os.chown(root / "entries" / key[:2] / key, 54321, 54321)
        with cache.open(url, fs=s3) as f:  # planned from the remembered identity
            assert f.read() == DATA
            assert f.diagnostics.cache_status is CacheStatus.BYPASS
        assert cache.events.events(EventKind.ENTRY_REFUSED)


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs filled to the last block (needs root with CAP_SYS_ADMIN)."""
    import subprocess

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("mounting a tmpfs needs root with CAP_SYS_ADMIN")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError, match="No space left"):  # noqa: PT012
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_really_full_filesystem_creating_a_new_root_reads_remotely(
    tmp_path: Path, full_tmpfs: Path
) -> None:
    from nexus_cache.lakehouse import EventKind, LakehouseCache

    source = str(write_old_file(tmp_path / "src" / "a.parquet", b"payload"))
    cache = LakehouseCache.from_env({"NEXUS_LAKEHOUSE_CACHE_ROOT": str(full_tmpfs / "root")})
    with cache, cache.open(source) as f:
        assert f.read() == b"payload"
        assert f.diagnostics.reason == "root_unavailable"
    assert [e.reason for e in cache.events.events(EventKind.ROOT_UNAVAILABLE)] == ["enospc"]
