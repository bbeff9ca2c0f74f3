"""A forked child (multiprocessing's default on Linux before 3.14, DataLoader
workers) uses its parent's caches as if it had made them itself."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.lakehouse import CacheStatus, default_cache, read_stats

from ._helpers import entry_files, make_cache, make_s3fs, put_object, write_old_file

# The parent's background fill is held mid-copy (by the fill's write seam) when
# it forks; the child then reads and exits normally, running the exit hooks.
_FORK_SCRIPT = """
import os, sys, threading, time
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.lakehouse.fill import _fill

root, first, second = sys.argv[1:4]
release = threading.Event()
real = _fill._write_chunk
def held(fd, data):
    release.wait(60)
    real(fd, data)
_fill._write_chunk = held
cache = LakehouseCache(LakehouseCacheConfig(
    root=root, policy="read_through", max_bytes="1G", fill_max_concurrency=1,
    fill_exit_wait_s=20,
))
cache.read(first)
while cache.limits.in_flight()[0] == 0:  # the fill of `first` is running, held
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    _fill._write_chunk = real
    idle = cache.wait_for_fills(timeout=5)
    budget = cache.limits.in_flight()
    cache.read(second)
    filled = cache.wait_for_fills(timeout=20)
    print("child", idle, budget, filled, cache.events.counts().get("fill_completed", 0))
    sys.stdout.flush()
    sys.exit(0)
started = time.monotonic()
os.waitpid(pid, 0)
print("child_exit_s", time.monotonic() - started)
release.set()
assert cache.wait_for_fills(timeout=30)
"""


def test_forked_child_does_not_inherit_the_parents_running_fills(tmp_path: Path) -> None:
    first = write_old_file(tmp_path / "first.parquet", os.urandom(8192))
    root = tmp_path / "c"
    # entries whose keys share a lock stripe would make the child's fill wait
    # for the parent's (in_progress): pick a second object on another stripe
    keys = make_cache(root)
    stripe = keys.plan(str(first)).key[:3]
    for i in range(10):
        second = write_old_file(tmp_path / f"second-{i}.parquet", os.urandom(4096))
        if keys.plan(str(second)).key[:3] != stripe:
            break
    keys.close()
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(root), str(first), str(second)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    # nothing of the parent's to wait for, the whole budget, and its own fill ran
    assert lines["child"] == "True (0, 0) True 1", done.stderr
    # its exit did not wait NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S for the parent's fill
    assert float(lines["child_exit_s"]) < 10, done.stderr
    assert sorted(p.read_bytes() for p in entry_files(root)) == sorted(
        [first.read_bytes(), second.read_bytes()]
    )


def _warm_read_in_child(cache: Any, url: str, endpoint: str, out: Any) -> None:
    with cache.open(url, fs=make_s3fs(endpoint)) as f:
        out.put((f.read(), f.diagnostics.cache_status.value))


def test_forked_child_reads_a_warm_s3_hit(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, s3: Any
) -> None:
    data = os.urandom(3000)
    put_object(s3_endpoint, s3_bucket, "t.parquet", data)
    url = f"s3://{s3_bucket}/t.parquet"
    cache = make_cache(tmp_path / "c", policy="fill_before_read")
    for _ in range(3):  # fill, then hits whose identity probes ran on the probe pool
        with cache.open(url, fs=s3) as f:
            assert f.read() == data
    assert f.diagnostics.cache_status is CacheStatus.HIT
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_warm_read_in_child, args=(cache, url, s3_endpoint, out))
    proc.start()
    try:
        # the child's probe used to wait forever for a thread left in the parent
        assert out.get(timeout=30) == (data, "hit")
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    cache.close()


def _read_and_close_in_child(cache: Any, source: str, out: Any) -> None:
    cache.read(source)
    out.put(cache.stats()["reads"]["total"])
    cache.close()  # writes this process's read summary


def test_forked_child_reports_its_own_reads(tmp_path: Path) -> None:
    first = str(write_old_file(tmp_path / "first.parquet", os.urandom(4096)))
    second = str(write_old_file(tmp_path / "second.parquet", os.urandom(4096)))
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    cache.read(first)
    cache.read(first)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_read_and_close_in_child, args=(cache, second, out))
    proc.start()
    assert out.get(timeout=60) == 1  # its own read, not the parent's two as well
    proc.join(60)
    assert proc.exitcode == 0
    cache.read(first)
    cache.close()
    # two summaries (they used to share the parent's file name and overwrite
    # each other): the parent's miss and two hits, the child's miss
    stats = read_stats(root)
    assert stats["processes"] == 2
    assert (stats["reads"]["hit"], stats["reads"]["miss"]) == (2, 2)


def _default_cache_in_child(root: str, out: Any) -> None:
    out.put(str(default_cache(root).store.root))


def test_forked_child_gets_a_default_cache_while_the_parent_opens_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent's thread is held inside default_cache() while it opens a
    # root (its layout check waits for an event), when the parent forks.
    from nexus_cache.lakehouse.store._store import EntryStore

    slow_root = tmp_path / "slow"
    opening, release = threading.Event(), threading.Event()
    check_layout = EntryStore._check_layout

    def slow_check_layout(store: EntryStore) -> None:
        if store.root == slow_root:
            opening.set()
            release.wait(60)
        check_layout(store)

    monkeypatch.setattr(EntryStore, "_check_layout", slow_check_layout)
    opener = threading.Thread(target=lambda: default_cache(slow_root).close(), daemon=True)
    opener.start()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    try:
        assert opening.wait(30)  # the opener is held inside default_cache() now
        proc = ctx.Process(target=_default_cache_in_child, args=(str(tmp_path / "c"), out))
        proc.start()
        try:
            assert out.get(timeout=30) == str(tmp_path / "c")  # used to hang forever
            proc.join(30)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join()
    finally:
        release.set()
        opener.join(30)
