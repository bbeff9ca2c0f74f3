"""File-stream backend: LRU by atime, stamps off the read path, stat-guarded eviction."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from nexus_cache._storage import UnlinkResult, atomic_write
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program.filestream import _cache, _evictq, _scan, _stamps

from ._filestream import entry_path, set_atime

# -- LRU by atime ------------------------------------------------------------


def test_hit_stamps_atime_and_keeps_mtime(any_cache):
    any_cache[b"k"] = b"v"
    p = entry_path(any_cache, b"k")
    mtime = os.lstat(p).st_mtime_ns
    os.utime(p, ns=(1_000_000_000, mtime))
    before = time.time_ns()
    assert any_cache[b"k"] == b"v"
    _stamps.flush()  # the stamp is written beside the read (see _stamps)
    st = os.lstat(p)
    assert st.st_atime_ns >= before - 50_000_000
    assert st.st_mtime_ns == mtime
    assert FileStreamProgramCache(any_cache.path)[b"k"] == b"v"  # still vouched for


def test_a_deferred_stamp_lands_without_a_flush(cache):
    cache[b"k"] = b"v"
    p = entry_path(cache, b"k")
    before = time.time_ns()
    assert cache[b"k"] == b"v"
    deadline = time.monotonic() + 5
    while os.lstat(p).st_atime_ns < before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.lstat(p).st_atime_ns >= before  # the background thread wrote it


def test_eviction_sees_this_processs_queued_stamps(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    for i, k in enumerate((b"a", b"b", b"c")):
        c[k] = k * 300
        set_atime(entry_path(c, k), 1000 + i)
    c[b"a"]  # its stamp is queued, not yet written
    assert c.prune(600) == (1, 300)
    assert c.get(b"b") is None
    assert c.get(b"a") == b"a" * 300
    assert [e.name for e in c.iter_entries()][-1] == entry_path(c, b"a").name


def test_hit_within_the_stamp_window_writes_nothing(cache, monkeypatch):
    # Re-reads are ordered to 1 s: an atime that a read stamped (after the
    # mtime) that recently is not rewritten, so a hot entry costs no metadata
    # write; one a little older is stamped again, and so is an entry never
    # read since its write (atime <= mtime), however recent.
    cache[b"k"] = b"v"
    p = entry_path(cache, b"k")
    mtime = os.lstat(p).st_mtime_ns
    stamps = []

    def spy():  # in place of starting the thread: write at once, record what landed
        queued = list(_stamps.QUEUE.pending)
        _stamps.flush()
        for path in queued:
            st = os.lstat(path)
            stamps.append((st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(_stamps.QUEUE, "scheduled", False)
    monkeypatch.setattr(_stamps.QUEUE, "schedule", spy)
    os.utime(p, ns=(max(time.time_ns() - 200_000_000, mtime + 1), mtime))
    assert FileStreamProgramCache(cache.path)[b"k"] == b"v"  # a fresh object reads the disk
    assert stamps == []
    os.utime(p, ns=(time.time_ns() - 1_500_000_000, mtime))
    before = time.time_ns()
    assert FileStreamProgramCache(cache.path)[b"k"] == b"v"
    assert len(stamps) == 1
    assert stamps[0][0] >= before
    assert stamps[0][1] == mtime
    _stamps.flush()
    assert os.lstat(p).st_atime_ns >= before
    os.utime(p, ns=(time.time_ns() + 10**11, mtime))  # a future atime (clock step) is redone
    assert FileStreamProgramCache(cache.path)[b"k"] == b"v"
    assert len(stamps) == 2
    cache[b"n"] = b"new"  # never read: atime <= mtime, stamped on its first read
    assert FileStreamProgramCache(cache.path)[b"n"] == b"new"
    assert len(stamps) == 3
    _stamps.flush()
    st = os.lstat(entry_path(cache, b"n"))
    assert st.st_atime_ns > st.st_mtime_ns


def test_eviction_follows_atime_not_write_order(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=1000)
    for i, k in enumerate((b"a", b"b", b"c")):
        c[k] = k * 300
        set_atime(entry_path(c, k), 1000 + i)
    c[b"a"]  # newest read now, despite being the oldest write
    c[b"d"] = b"d" * 300  # 1200 > 1000: evict down to 900
    assert c.get(b"b") is None
    assert [c.get(k) is not None for k in (b"a", b"c", b"d")] == [True, True, True]
    assert c.stats().evictions == 1


@pytest.mark.parametrize("reads", [1, 2])  # the first defers its stamp; a kept one stamps now
def test_hit_racing_a_rewrite_never_stamps_the_fresh_file(any_cache, monkeypatch, reads):
    any_cache[b"k"] = b"old bytes"
    p = entry_path(any_cache, b"k")
    for _ in range(reads - 1):
        assert any_cache[b"k"] == b"old bytes"
        os.utime(p, ns=(1, os.lstat(p).st_mtime_ns))  # due for a stamp again
        any_cache._memo.clear()
    real = _cache._read
    fresh = {}

    def read_then_rewrite(fd, n):
        data = real(fd, n)
        # a rewriter replaces the entry after our open, before our stamp
        atomic_write(p, b"fresh bytes", tmp_dir=any_cache.path / "tmp")
        os.utime(p, ns=(5, 7))
        fresh["st"] = os.lstat(p)
        return data

    monkeypatch.setattr(_cache, "_read", read_then_rewrite)
    assert any_cache[b"k"] == b"old bytes"  # we read the inode we opened
    _stamps.flush()
    st = os.lstat(p)
    assert (st.st_ino, st.st_atime_ns, st.st_mtime_ns) == (fresh["st"].st_ino, 5, 7)


# -- stat guards ------------------------------------------------------------


def _rewrite_during_scan(monkeypatch, cache, key, value):
    real_scan = _scan.scan

    def scan_then_rewrite(*a, **kw):
        result = real_scan(*a, **kw)
        if kw.get("with_stat", True):
            monkeypatch.setattr(_scan, "scan", real_scan)
            other = FileStreamProgramCache(cache.path)  # another writer
            other[key] = value
        return result

    monkeypatch.setattr(_scan, "scan", scan_then_rewrite)


def test_clear_spares_an_entry_rewritten_after_its_scan(cache, monkeypatch):
    cache.update({b"a": b"1", b"b": b"2", b"c": b"3"})
    _rewrite_during_scan(monkeypatch, cache, b"b", b"rewritten")
    cache.clear()
    assert cache.get(b"a") is None
    assert cache.get(b"c") is None
    assert cache.get(b"b") == b"rewritten"
    assert len(cache) == 1


def test_prune_spares_an_entry_rewritten_after_its_scan(cache, monkeypatch):
    cache.update({b"a": b"1" * 10, b"b": b"2" * 10})
    _rewrite_during_scan(monkeypatch, cache, b"a", b"rewritten")
    assert cache.prune(0) == (1, 10)
    assert cache.get(b"a") == b"rewritten"
    assert cache.get(b"b") is None


def test_prune_frees_oldest_first(cache):
    for i, k in enumerate((b"a", b"b", b"c")):
        cache[k] = k * 100
        set_atime(entry_path(cache, k), 1000 + i)
    assert cache.prune(150) == (2, 200)
    assert cache.get(b"c") == b"c" * 100
    assert len(cache) == 1


def test_over_eviction_race_credits_the_concurrent_delete(tmp_path, monkeypatch):
    # The seed review's race: after eviction's scan, another process deletes
    # the oldest entry first. Its bytes must be credited, or the pass goes on
    # and evicts newer entries it had no need to touch.
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=1000)
    c[b"old"] = b"a" * 400
    c[b"mid"] = b"m" * 300
    set_atime(entry_path(c, b"old"), 1000)
    set_atime(entry_path(c, b"mid"), 2000)
    old_path = str(entry_path(c, b"old"))
    real = _scan.unlink_if_unchanged
    other = FileStreamProgramCache(c.path)  # stands for another process
    calls = []

    holds = []
    real_hold = c._usage.hold

    def hold():
        # Holds: the store's, the rescan's, then eviction's first removal; the
        # other process deletes "old" just before that one (a deleter takes
        # the counter's lock too, so it cannot land inside ours).
        holds.append(1)
        if len(holds) == 3:
            del other[b"old"]
        return real_hold()

    def record(path, expected, **kw):
        calls.append(path)
        result = real(path, expected, **kw)
        if path == old_path:
            assert result is UnlinkResult.GONE
        return result

    monkeypatch.setattr(c._usage, "hold", hold)
    monkeypatch.setattr(_scan, "unlink_if_unchanged", record)
    c[b"new"] = b"b" * 400  # 1100 > 1000: free down to 900; old's 400 suffice
    assert calls == [old_path]  # one candidate, then the pass stopped
    assert c.get(b"new") == b"b" * 400
    assert c.get(b"mid") == b"m" * 300
    assert c.get(b"old") is None
    s = c.stats()
    assert s.evictions == 0  # the other process evicted it, not us
    assert s.bytes == 700
    assert c._usage.read() == 700


def test_fresh_entry_survives_even_when_alone_above_low_water(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=1000)
    c[b"old"] = b"a" * 500
    c[b"new"] = b"b" * 950  # only new fits; it is above the 900 low-water mark itself
    assert c.get(b"old") is None
    assert c.get(b"new") == b"b" * 950


def test_each_store_evicts_a_bounded_batch_from_one_scan(tmp_path, monkeypatch):
    # Bounded latency: the store that crosses the cap evicts what gets it back
    # under the cap plus at most _EVICT_EXTRA more, and later stores above the
    # low-water mark carry on from the same scan's list, rather than one store
    # draining the cache to 90% of the cap (O(entries) unlinks) by itself.
    extra = _cache._EVICT_EXTRA
    n, size = 1000, 100
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=n * size, memory_bytes=0)
    for i in range(n):
        c[b"k%d" % i] = b"x" * size
        set_atime(entry_path(c, b"k%d" % i), 1000 + i)  # k0 least recently read
    assert c.stats().evictions == 0  # exactly at the cap
    real_unlink, real_scan = _scan.unlink_if_unchanged, _scan.scan
    unlinks, scans = [], []

    def counting_unlink(path, expected, **kw):
        unlinks.append(path)
        return real_unlink(path, expected, **kw)

    def counting_scan(*a, **kw):
        scans.append(a)
        return real_scan(*a, **kw)

    monkeypatch.setattr(_scan, "unlink_if_unchanged", counting_unlink)
    monkeypatch.setattr(_scan, "scan", counting_scan)
    per_store = []
    for i in range(n, n + 40):
        before = len(unlinks)
        c[b"k%d" % i] = b"y" * size
        per_store.append(len(unlinks) - before)
        assert c._usage.read() <= n * size
        if i == n:
            c[b"k%d" % (extra + 1)]  # read after the scan: no longer among the oldest
    # 100_100 -> under the cap (1) + 64 more = 93_600; then 93_700 -> 90_000
    # (37, the one read since the scan skipped); then one per store at 90_100.
    assert per_store == [1 + extra, 37] + [1] * 38
    assert len(scans) == 1  # one scan served all 40 stores
    assert c.get(b"k%d" % (extra + 1)) is not None
    gone = [k for k in range(extra + 1 + 37 + 38 + 1) if c.get(b"k%d" % k) is None]
    assert gone == [k for k in range(extra + 1 + 37 + 38 + 1) if k != extra + 1]
    assert c.stats().evictions == sum(per_store)
    assert c._usage.read() == c.stats().bytes == 90_000


def test_stale_candidate_list_that_runs_dry_over_the_cap_rescans(tmp_path, monkeypatch):
    # The list outlives its scan: a candidate rewritten since is skipped, and
    # when that leaves the list empty with the store still over the cap, the
    # same store rescans (once) and evicts from the fresh list.
    monkeypatch.setattr(_evictq, "_MIN_KEEP", 0)  # keep only what the bytes rule asks
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=1000, memory_bytes=0)
    keys = [bytes([k]) for k in b"abcdefghij"]
    for i, k in enumerate(keys):
        c[k] = k * 100
        set_atime(entry_path(c, k), 1000 + i)
    real_scan = _scan.scan
    scans = []
    monkeypatch.setattr(_scan, "scan", lambda *a, **kw: scans.append(a) or real_scan(*a, **kw))
    c[b"k"] = b"k" * 100  # 1100: list [a, b, c]; a then b go, down to 900
    assert len(c._candidates) == 1
    other = FileStreamProgramCache(c.path, max_size_bytes=1000)  # capped: keeps the counter
    other[b"c"] = b"C" * 100  # another writer rewrites c
    c[b"l"] = b"l" * 200  # 1100 again: c is skipped, the list runs dry, rescan
    assert len(scans) == 2
    assert [c.get(k) is None for k in keys] == [True] * 2 + [False] + [True] * 2 + [False] * 5
    assert c.get(b"c") == b"C" * 100
    assert c._usage.read() == c.stats().bytes == 900


def test_usage_counter_tracks_and_self_heals(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=10_000)
    usage = c._usage
    c[b"a"] = b"x" * 100
    c[b"b"] = b"x" * 50
    assert usage.read() == 150
    c[b"a"] = b"x" * 10
    del c[b"b"]
    assert usage.read() == 10
    os.unlink(c.path / "usage")
    c[b"c"] = b"y" * 5  # rebuilt from a scan
    assert usage.read() == 15
    shutil.rmtree(c.path / "entries" / entry_path(c, b"a").parent.name)  # out-of-band delete
    c.prune(10_000)  # any pass rescans and corrects drift
    assert usage.read() == 5
