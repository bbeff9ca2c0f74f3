"""Entries are published before they are fsynced, and never read torn after a reboot."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from nexus_cache.lakehouse import CacheStatus, EventKind, FillMode, ReadMode
from nexus_cache.lakehouse.fill import _fill as fill_module
from nexus_cache.lakehouse.store import _durable as durable

from ._helpers import entry_files, fill_counts, make_cache, put_object, write_old_file

DATA = os.urandom(200_000)
_REAL_SYNC = durable._sync


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def held_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Holds every queued fsync until the event is set (set at teardown anyway)."""
    release = threading.Event()
    real = durable._sync

    def held(fd: int, record: str, discard: Any) -> None:
        release.wait(30)
        real(fd, record, discard)

    monkeypatch.setattr(durable, "_sync", held)
    yield release
    release.set()
    assert durable.wait_for_syncs(30)


def _reboot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every existing inode look older than the current boot."""
    time.sleep(0.01)
    monkeypatch.setattr(durable, "_BOOT_NS", time.time_ns())


def test_reader_does_not_wait_for_the_fsync(tmp_path: Path, held_syncs: threading.Event) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.read_mode is ReadMode.LOCAL
        assert f.diagnostics.fill_mode is FillMode.BLOCKING
    (data,) = entry_files(root)
    assert _mode(data) == durable.PENDING_MODE
    assert durable.pending_syncs() == 1
    # published: this boot's next reads are hits
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.HIT
    assert not cache.wait_for_fills(timeout=0.05)
    held_syncs.set()
    assert cache.wait_for_fills(timeout=30)
    assert _mode(data) == durable.DURABLE_MODE
    assert _mode(data.with_name(data.name + ".json")) == durable.DURABLE_MODE
    cache.close()


def test_entry_left_pending_by_a_reboot_is_refilled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_syncs: threading.Event
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    assert cache.read(source) == DATA
    (data,) = entry_files(root)
    first_inode = data.stat().st_ino
    _reboot(monkeypatch)
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.MISS
    removed = cache.events.events(EventKind.ENTRY_REMOVED)
    assert [e.reason for e in removed] == ["not made durable before a reboot"]
    assert fill_counts(cache) == 2
    (data,) = entry_files(root)
    assert data.stat().st_ino != first_inode
    held_syncs.set()
    assert cache.wait_for_fills(timeout=30)
    assert _mode(data) == durable.DURABLE_MODE
    # durable now: a hit even though the inode predates the (simulated) boot
    _reboot(monkeypatch)
    with cache.open(source) as f:
        assert f.diagnostics.cache_status is CacheStatus.HIT
    cache.close()


def test_metadata_changes_after_a_reboot_do_not_make_a_pending_entry_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_syncs: threading.Event
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(source)
    (data,) = entry_files(root)
    _reboot(monkeypatch)
    time.sleep(0.05)  # past the boot even on the kernel's coarse file clock
    # What an administrator's `chown -R` does after the crash, or the sweep of a
    # temp still hard-linked to the entry: its inode changes, its bytes do not.
    st = data.stat()
    os.chown(data, st.st_uid, st.st_gid)
    os.link(data, tmp_path / "second-link")
    os.unlink(tmp_path / "second-link")
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.MISS  # was: a hit on maybe-torn bytes
    removed = cache.events.events(EventKind.ENTRY_REMOVED)
    assert [e.reason for e in removed] == ["not made durable before a reboot"]
    cache.close(wait=False)


def test_read_only_caches_do_not_read_an_entry_left_pending_by_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_syncs: threading.Event
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    make_cache(root, policy="fill_before_read").read(source)
    _reboot(monkeypatch)
    reader = make_cache(root)  # root only: uses hits, never fills
    with reader.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.read_mode is ReadMode.REMOTE


def test_verify_makes_a_whole_pending_entry_durable_and_removes_a_torn_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_syncs: threading.Event
) -> None:
    good = str(write_old_file(tmp_path / "good.parquet", DATA))
    torn = str(write_old_file(tmp_path / "torn.parquet", DATA[::-1]))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(good)
    cache.read(torn)
    torn_path = next(p for p in entry_files(root) if p.name == cache.plan(torn).key)
    with open(torn_path, "r+b") as f:  # what a power cut may leave: right size, wrong bytes
        f.write(b"\0" * 4096)
    _reboot(monkeypatch)
    assert list(cache.verify()) == [cache.plan(torn).key]
    (data,) = entry_files(root)
    assert data.name == cache.plan(good).key
    assert _mode(data) == durable.DURABLE_MODE
    with cache.open(good) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.HIT


def test_without_a_boot_clock_fills_fsync_before_publishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable, "_BOOT_NS", None)
    queued: list[int] = []
    monkeypatch.setattr(
        fill_module, "make_durable_later", lambda fd, rec, discard: queued.append(fd)
    )
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    assert cache.read(source) == DATA
    (data,) = entry_files(root)
    assert _mode(data) == durable.DURABLE_MODE
    assert queued == []
    # a pending entry cannot be dated without the clock: never trusted
    os.chmod(data, durable.PENDING_MODE)
    with cache.open(source) as f:
        assert f.diagnostics.cache_status is CacheStatus.MISS
    cache.close()


def _publish_and_die(root: str, source: str) -> None:
    # hold the fsync forever, then die the way a killed process does
    durable._sync = lambda fd, record, discard: time.sleep(3600)  # type: ignore[assignment]
    make_cache(Path(root), policy="fill_before_read").read(source)
    os._exit(0)


def test_a_process_killed_before_the_fsync_leaves_an_entry_readable_in_this_boot(
    tmp_path: Path,
) -> None:
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    proc = multiprocessing.get_context("spawn").Process(
        target=_publish_and_die, args=(str(root), source)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    (data,) = entry_files(root)
    assert _mode(data) == durable.PENDING_MODE
    cache = make_cache(root, policy="fill_before_read")
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.HIT
    assert fill_counts(cache) == 0
    cache.close()


# step boundaries: empty, one byte, exactly one step, one byte over, two steps,
# and many steps (49) hashed on the digest thread
@pytest.mark.parametrize("size", [0, 1, 4096, 4097, 8192, 200_001])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_multi_step_fills_hash_every_byte_in_order(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
    size: int,
) -> None:
    monkeypatch.setattr(fill_module, "_CHUNK", 4096)
    payload = os.urandom(size)
    kwargs: dict[str, Any] = {}
    if where == "local":
        source = str(write_old_file(tmp_path / "a.parquet", payload))
    else:
        endpoint, bucket = (
            request.getfixturevalue("s3_endpoint"),
            request.getfixturevalue("s3_bucket"),
        )
        put_object(endpoint, bucket, "a.parquet", payload)
        source, kwargs["fs"] = f"s3://{bucket}/a.parquet", request.getfixturevalue("s3")
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    with cache.open(source, **kwargs) as f:
        assert f.read() == payload
        assert f.diagnostics.read_mode is ReadMode.LOCAL
    (data,) = entry_files(root)
    record = json.loads(data.with_name(data.name + ".json").read_text())
    assert record["digest"] == "xxh3_128:" + xxhash.xxh3_128(payload).hexdigest()
    assert data.read_bytes() == payload
    assert cache.verify() == {}
    cache.close()


def _read_in_forked_child(root: str, source: str, out: Any) -> None:
    durable._sync = _REAL_SYNC  # type: ignore[assignment]  # the parent's is held
    cache = make_cache(Path(root), policy="fill_before_read")
    data = cache.read(source)
    # a fresh worker in the child: its own fsync happens and close() returns
    out.put((data == DATA, cache.wait_for_fills(timeout=30)))
    cache.close()


def test_a_forked_child_gets_its_own_fsync_worker(
    tmp_path: Path, held_syncs: threading.Event
) -> None:
    first = str(write_old_file(tmp_path / "a.parquet", DATA))
    second = str(write_old_file(tmp_path / "b.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(first)  # the parent's worker now holds this one's fsync
    assert durable.pending_syncs() == 1
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_read_in_forked_child, args=(str(root), second, out))
    proc.start()
    assert out.get(timeout=60) == (True, True)
    proc.join(60)
    assert proc.exitcode == 0
    held_syncs.set()
    assert cache.wait_for_fills(timeout=30)
    assert all(_mode(p) == durable.DURABLE_MODE for p in entry_files(root))
    cache.close()


def test_an_entry_whose_fsync_fails_is_removed_and_filled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dying_disk(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(durable, "_fsync", dying_disk)
    source = str(write_old_file(tmp_path / "a.parquet", DATA))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    with cache.open(source) as f:
        assert f.read() == DATA  # served from the validated bytes, before the fsync
    assert cache.wait_for_fills(timeout=30)
    # after a write-back error the page cache may not hold the fill's bytes:
    # the entry is gone rather than trusted for the rest of the boot
    assert entry_files(root) == []
    removed = cache.events.events(EventKind.ENTRY_REMOVED)
    assert [e.reason for e in removed] == ["fsync failed: [Errno 5] Input/output error"]
    monkeypatch.setattr(durable, "_fsync", os.fsync)
    with cache.open(source) as f:
        assert f.read() == DATA
        assert f.diagnostics.cache_status is CacheStatus.MISS
    assert cache.wait_for_fills(timeout=30)
    (data,) = entry_files(root)
    assert _mode(data) == durable.DURABLE_MODE
    cache.close()
