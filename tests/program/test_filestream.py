"""File-stream backend: on-disk format, LRU stamps, guards, integrity, security."""

from __future__ import annotations

import os
import shutil
import stat
import time

import pytest

from nexus_cache._storage import UnlinkResult, atomic_write
from nexus_cache._storage._names import host_tag
from nexus_cache.errors import CacheSecurityError, ConfigError
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program._integrity import (
    RECORD_SIZE,
    SIDECAR_SUFFIX,
    XATTR_NAME,
    entry_check,
    entry_location,
    entry_name,
    probe_carrier,
)
from nexus_cache.program.filestream import _cache, _evictq, _scan, _stamps

OTHER_UID = 54321


def entry_path(cache, key):
    sub, name = entry_location(key)
    return cache.path / "entries" / sub / name


def set_atime(path, atime_s):
    st = os.lstat(path)
    os.utime(path, ns=(int(atime_s * 1e9), st.st_mtime_ns))


@pytest.fixture
def cache(tmp_path):
    return FileStreamProgramCache(tmp_path / "c")


def _supported(tmp_path) -> tuple[str, ...]:
    """The carriers this filesystem can hold: the probe's pick and every one after it."""
    (tmp_path / "probe").mkdir(exist_ok=True)
    best = probe_carrier(str(tmp_path / "probe"))
    return ("mtime", "xattr", "sidecar")[("mtime", "xattr", "sidecar").index(best) :]


@pytest.fixture(params=["mtime", "xattr", "sidecar"])
def carrier(request, tmp_path, monkeypatch):
    """Each record carrier in turn (one the filesystem cannot hold is skipped)."""
    if request.param not in _supported(tmp_path):
        pytest.skip(f"this filesystem cannot hold {request.param} records")
    monkeypatch.setattr(_cache, "probe_carrier", lambda tmp: request.param)
    return request.param


@pytest.fixture
def any_cache(tmp_path, carrier):
    c = FileStreamProgramCache(tmp_path / "c")
    assert c.record_carrier == carrier
    return c


def strip_record(cache, p):
    """What losing an entry's record looks like on each carrier."""
    if cache.record_carrier == "mtime":  # a `touch`: the mtime no longer carries the check
        os.utime(p, ns=(time.time_ns(), time.time_ns()))
    elif cache.record_carrier == "xattr":
        os.removexattr(p, XATTR_NAME)
    else:
        os.unlink(str(p) + SIDECAR_SUFFIX)


def copy_with_record(cache, src, dst):
    """Copy an entry and everything that vouches for it (as `cp -a` would)."""
    shutil.copy2(src, dst)  # bytes and mtime
    if cache.record_carrier == "xattr":
        os.setxattr(dst, XATTR_NAME, os.getxattr(src, XATTR_NAME))
    elif cache.record_carrier == "sidecar":
        shutil.copyfile(str(src) + SIDECAR_SUFFIX, str(dst) + SIDECAR_SUFFIX)


# -- layout ----------------------------------------------------------------


def test_entry_on_disk_is_the_raw_binary(cache):
    payload = b"\x7fELF\x02\x01\x01\x33" + os.urandom(4000)
    cache[b"k"] = payload
    p = entry_path(cache, b"k")
    assert p.read_bytes() == payload  # no header, no framing: cuobjdump reads it as is
    assert stat.S_IMODE(os.lstat(p).st_mode) == 0o600
    assert os.listdir(cache.path / "tmp") == []


def test_each_carrier_holds_the_record_where_it_says(any_cache):
    payload = os.urandom(4000)
    any_cache[b"k"] = payload
    p = entry_path(any_cache, b"k")
    digest = bytes.fromhex(entry_name(b"k"))  # the 32 bytes the name spells
    st = os.lstat(p)  # before any read: the kernel's relatime would move the atime
    assert p.read_bytes() == payload
    if any_cache.record_carrier == "mtime":
        assert st.st_mtime_ns % 10**9 == entry_check(payload, digest) % 10**9
        assert st.st_mtime_ns < time.time_ns()  # never in the future
        assert st.st_atime_ns < st.st_mtime_ns  # never read since its write
        assert XATTR_NAME not in os.listxattr(p)
    elif any_cache.record_carrier == "xattr":
        assert len(os.getxattr(p, XATTR_NAME)) == RECORD_SIZE == 36
    else:
        assert os.path.exists(str(p) + SIDECAR_SUFFIX)
    assert any_cache.uses_xattrs == (any_cache.record_carrier == "xattr")
    assert any_cache[b"k"] == payload


def test_the_probe_prefers_the_mtime_carrier_where_timestamps_are_exact(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    os.utime(plain, ns=(1_700_000_000_123_456_789, 1_700_000_000_987_654_321))
    exact = os.stat(plain).st_mtime_ns == 1_700_000_000_987_654_321
    carrier = FileStreamProgramCache(tmp_path / "c").record_carrier
    assert (carrier == "mtime") == exact
    real = os.utime

    def rounding(target, *a, ns=None, **kw):  # a filesystem keeping microseconds only
        if ns is not None:
            ns = tuple(t // 1000 * 1000 for t in ns)
        return real(target, *a, ns=ns, **kw)

    monkeypatch.setattr(os, "utime", rounding)
    assert FileStreamProgramCache(tmp_path / "d").record_carrier in ("xattr", "sidecar")


def test_root_and_subdirs_private(tmp_path):
    old = os.umask(0)
    try:
        c = FileStreamProgramCache(tmp_path / "a" / "c")
        c[b"k"] = b"v"
    finally:
        os.umask(old)
    for d in (c.path, c.path / "entries", c.path / "tmp", entry_path(c, b"k").parent):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700, d


def test_default_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "explicit"))
    assert FileStreamProgramCache().path == tmp_path / "explicit"
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert FileStreamProgramCache().path == tmp_path / "xdg" / "nexus-cache" / "program-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    want = tmp_path / "home" / ".cache" / "nexus-cache" / "program-cache"
    assert FileStreamProgramCache().path == want


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


# -- temp handling ------------------------------------------------------------


def test_uncapped_stores_keep_no_counter_and_capped_ones_see_them(tmp_path):
    # An uncapped object has no cap to enforce: its stores neither create nor
    # lock the shared counter. It removes the counter (at most once a second),
    # so a capped object sharing the root rebuilds it and counts those bytes.
    capped = FileStreamProgramCache(tmp_path / "c", max_size_bytes=10_000)
    capped[b"a"] = b"x" * 100
    assert capped._usage.read() == 100
    free = FileStreamProgramCache(tmp_path / "c")
    free[b"b"] = b"y" * 200
    assert not (tmp_path / "c" / "usage").exists()
    free[b"c"] = b"z" * 300  # within the second: not even an unlink
    assert not (tmp_path / "c" / "usage").exists()
    capped[b"d"] = b"w" * 50
    assert capped._usage.read() == 650  # rebuilt from a scan: nothing lost
    free[b"e"] = b"v" * 5  # the counter exists again, but this object forgot it < 1 s ago
    assert capped._usage.read() == 650
    del free[b"a"]  # removals still subtract
    assert capped._usage.read() == 550


def test_deleted_shard_dir_heals_on_store(cache):
    cache[b"k"] = b"v"
    shard = entry_path(cache, b"k").parent
    shutil.rmtree(shard)
    cache[b"k"] = b"v2"
    assert cache[b"k"] == b"v2"
    assert stat.S_IMODE(os.lstat(shard).st_mode) == 0o700
    assert os.listdir(cache.path / "tmp") == []


def test_tmp_dir_self_heals(cache):
    shutil.rmtree(cache.path / "tmp")
    cache[b"k"] = b"v"
    assert cache[b"k"] == b"v"
    assert stat.S_IMODE(os.lstat(cache.path / "tmp").st_mode) == 0o700


def _stale_temps(tmp):
    old = tmp / "crashed-writer.tmp"
    old.write_bytes(b"half")
    t = time.time_ns() - 2 * 3600 * 10**9
    os.utime(old, ns=(t, t))
    dead = tmp / f"{host_tag()}-999999999-abcd.tmp"  # no such pid
    dead.write_bytes(b"half")
    fresh = tmp / "someone-writing-now.tmp"
    fresh.write_bytes(b"half")
    return fresh


def test_stale_temps_swept_on_open(tmp_path):
    tmp = tmp_path / "c" / "tmp"
    tmp.mkdir(parents=True)
    fresh = _stale_temps(tmp)
    FileStreamProgramCache(tmp_path / "c")
    assert os.listdir(tmp) == [fresh.name]


def test_stale_temps_swept_during_eviction(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=100)
    fresh = _stale_temps(c.path / "tmp")
    c[b"a"] = b"x" * 60
    assert len(os.listdir(c.path / "tmp")) == 3  # no eviction yet
    c[b"b"] = b"x" * 60
    assert os.listdir(c.path / "tmp") == [fresh.name]


# -- integrity ----------------------------------------------------------------


def _corrupt_cases():
    def truncate(p):
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) - 1)

    def flip(p):
        with open(p, "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x01]))

    def extend(p):
        with open(p, "ab") as f:
            f.write(b"\0")

    def flip_keeping_times(p):  # bit rot: the bytes change, the timestamps do not
        st = os.lstat(p)
        flip(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    return {
        "truncate": truncate,
        "bitflip": flip,
        "bitrot": flip_keeping_times,
        "extend": extend,
    }


@pytest.mark.parametrize("case", [*sorted(_corrupt_cases()), "no-record"])
@pytest.mark.parametrize("read_first", [False, True])
def test_corruption_is_detected_counted_removed(any_cache, case, read_first):
    cache = any_cache
    payload = os.urandom(4096)
    cache[b"k"] = payload
    cache[b"other"] = b"fine"
    if read_first:  # so that the in-memory memo holds the verified bytes
        for _ in range(3):
            assert cache[b"k"] == payload
        assert cache._memo.get(b"k") is not None
    if case == "no-record":
        strip_record(cache, entry_path(cache, b"k"))
    else:
        _corrupt_cases()[case](entry_path(cache, b"k"))
    if case == "no-record" and cache.record_carrier == "sidecar":
        # A missing sidecar is a writer mid-publication: a plain miss, never served.
        cache._memo.clear()
        assert cache.get(b"k") is None
        assert cache.stats().corrupt == 0
        return
    with pytest.raises(KeyError):
        cache[b"k"]
    s = cache.stats()
    assert s.corrupt == 1
    assert s.misses == 1
    assert s.hits == (3 if read_first else 0)
    assert not entry_path(cache, b"k").exists()
    assert cache.get(b"k") is None
    assert cache.stats().corrupt == 1  # removed, so counted once
    assert cache[b"other"] == b"fine"
    cache[b"k"] = payload  # the next store heals it
    assert cache[b"k"] == payload


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
def test_verify_reports_and_removes(any_cache, case):
    cache = any_cache
    cache.update({b"a": b"x" * 300, b"b": b"y" * 300, b"c": b"z" * 300})
    _corrupt_cases()[case](entry_path(cache, b"b"))
    report = cache.verify()
    assert report.checked == 3
    assert report.ok == 2
    assert report.corrupt == [entry_path(cache, b"b").name]
    assert cache.get(b"b") is None
    assert cache.verify().corrupt == []


def test_sidecar_fallback_without_xattrs(tmp_path, monkeypatch):
    monkeypatch.setattr(_cache, "probe_carrier", lambda tmp: "sidecar")
    c = FileStreamProgramCache(tmp_path / "c")
    assert not c.uses_xattrs
    c[b"k"] = b"payload" * 100
    p = entry_path(c, b"k")
    assert p.read_bytes() == b"payload" * 100
    assert XATTR_NAME not in os.listxattr(p)
    assert os.path.exists(str(p) + SIDECAR_SUFFIX)
    assert c[b"k"] == b"payload" * 100
    assert len(c) == 1  # sidecars are not entries
    _corrupt_cases()["bitflip"](p)
    assert c.get(b"k") is None
    assert c.stats().corrupt == 1
    assert not os.path.exists(str(p) + SIDECAR_SUFFIX)
    # a sidecar that names another inode (a writer mid-publication) reads as a miss
    c[b"k"] = b"v1"
    other = FileStreamProgramCache(c.path)
    os.replace(str(p) + SIDECAR_SUFFIX, tmp_path / "saved")
    other[b"k"] = b"v2"
    os.replace(tmp_path / "saved", str(p) + SIDECAR_SUFFIX)
    assert c.get(b"k") is None
    assert c.stats().corrupt == 1  # not counted as corruption, not removed
    assert p.exists()
    c.clear()
    assert os.listdir(p.parent) == []


# -- security -----------------------------------------------------------------


def test_symlinked_root_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CacheSecurityError, match="symbolic link"):
        FileStreamProgramCache(tmp_path / "link")


def test_foreign_root_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        FileStreamProgramCache(root)


def test_symlinked_entry_refused(cache, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"planted")
    cache[b"k"] = b"v"
    p = entry_path(cache, b"k")
    os.unlink(p)
    p.symlink_to(target)
    with pytest.raises(CacheSecurityError, match="symbolic link"):
        cache[b"k"]
    report = cache.verify()
    assert [r[1] for r in report.refused] == ["symbolic link"]
    assert len(cache) == 0  # never counted as an entry
    assert target.read_bytes() == b"planted"


def test_foreign_owned_entry_refused(cache):
    cache[b"k"] = b"v"
    os.chown(entry_path(cache, b"k"), OTHER_UID, OTHER_UID)
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        cache[b"k"]
    assert cache.stats().entries == 0
    cache.clear()
    assert entry_path(cache, b"k").exists()  # not ours to delete


def test_foreign_owned_entry_refused_where_o_noatime_is_refused(cache, monkeypatch):
    # As a non-root user the kernel refuses O_NOATIME (EPERM) on a file we do
    # not own; the read must fall back and still refuse the entry clearly.
    cache[b"k"] = b"v"
    p = entry_path(cache, b"k")
    os.chown(p, OTHER_UID, OTHER_UID)
    real_open = os.open
    refused = []

    def open_like_non_root(path, flags, *args):
        if flags & os.O_NOATIME and os.lstat(path).st_uid != os.geteuid():
            refused.append(path)
            raise PermissionError(1, "Operation not permitted", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_like_non_root)
    monkeypatch.setattr(_cache, "_open", open_like_non_root)  # the read path's binding
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        cache[b"k"]
    assert refused == [str(p)]


def test_fifo_entry_does_not_hang(cache):
    cache[b"k"] = b"v"
    p = entry_path(cache, b"k")
    os.unlink(p)
    os.mkfifo(p)
    with pytest.raises(CacheSecurityError, match="not a regular file"):
        cache[b"k"]


def test_unwritable_root_is_a_clear_error(tmp_path):
    # chmod does not stop root; a regular file in the path stops everyone.
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=r"cannot create cache directory .*file/c"):
        FileStreamProgramCache(blocker / "c")


def test_nothing_is_unpickled(cache):
    # A pickle bomb stored as an entry comes back as the raw bytes, unexecuted.
    import pickle

    class Boom:
        def __reduce__(self):
            return (os._exit, (3,))

    blob = pickle.dumps(Boom())
    cache[b"k"] = blob
    assert cache[b"k"] == blob


# -- in-memory memo of verified entries ------------------------------------------


def test_memo_sees_other_writers_and_deleters(cache):
    other = FileStreamProgramCache(cache.path)  # stands for another process
    cache[b"k"] = b"v1"
    p = b"k"  # the memo is keyed by the cache key
    assert cache[b"k"] == b"v1"  # first read from disk: not kept
    assert cache._memo.get(p) is None
    assert cache[b"k"] == b"v1"  # second read of the same version: kept
    assert cache._memo.get(p) is not None
    assert cache[b"k"] == b"v1"  # served from memory after one lstat
    other[b"k"] = b"v2-longer"
    assert cache[b"k"] == b"v2-longer"
    assert cache[b"k"] == b"v2-longer"
    other[b"k"] = b"v3-samesz"  # same size as v2, new inode
    assert cache[b"k"] == b"v3-samesz"
    del other[b"k"]
    assert cache.get(b"k") is None
    assert cache._memo.get(p) is None
    assert cache.stats().hits == 6


def test_memo_hits_keep_stamping_atime(cache):
    cache.update({b"a": b"1", b"b": b"2"})
    for _ in range(2):
        cache[b"a"], cache[b"b"]  # both remembered now
    pa, pb = entry_path(cache, b"a"), entry_path(cache, b"b")
    for p in (pa, pb):
        os.utime(p, ns=(1_000_000_000, os.lstat(p).st_mtime_ns))
    before = time.time_ns()
    for _ in range(3):
        assert cache[b"a"] == b"1"
    assert os.lstat(pa).st_atime_ns >= before - 50_000_000
    assert os.lstat(pb).st_atime_ns == 1_000_000_000
    mtime = os.lstat(pa).st_mtime_ns
    cache[b"b"]
    _stamps.flush()
    assert os.lstat(pb).st_atime_ns >= before - 50_000_000
    assert os.lstat(pa).st_mtime_ns == mtime


def test_memo_can_be_disabled_and_is_validated(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    c[b"k"] = b"v"
    assert c[b"k"] == b"v"
    assert c._memo is None
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ConfigError, match="memory_bytes must be an int >= 0"):
            FileStreamProgramCache(tmp_path / "c", memory_bytes=bad)


def test_memory_bytes_takes_the_size_grammar_like_max_size_bytes(tmp_path):
    # docs/configuration.md: sizes given as strings read one grammar everywhere.
    assert FileStreamProgramCache(tmp_path / "c", memory_bytes="0")._memo is None
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes="1K", max_size_bytes="64M")
    c[b"k"] = b"v" * 100
    for _ in range(3):
        assert c[b"k"] == b"v" * 100
    assert c._memo is not None
    assert c._memo.get(b"k") is not None  # admitted on the second read
    c[b"big"] = b"x" * 2048
    for _ in range(3):
        assert c[b"big"] == b"x" * 2048
    assert c._memo.get(b"big") is None  # larger than the 1 KiB memo
    for bad in ("-1", "nan", "", "1e3", "1.5K", "\u0661"):
        with pytest.raises(ConfigError, match="memory_bytes="):
            FileStreamProgramCache(tmp_path / "c", memory_bytes=bad)


def test_memo_is_bounded_lru():
    from nexus_cache.program.filestream._readmemo import MemoEntry, VerifiedMemo

    memo = VerifiedMemo(1000)
    for name in "abcd":
        memo.put(name, MemoEntry("p", 1, 200, 0, 0, b"x" * 200))
    memo.get("a")
    memo.put("e", MemoEntry("p", 1, 200, 0, 0, b"x" * 200))
    memo.put("f", MemoEntry("p", 1, 200, 0, 0, b"x" * 200))
    assert memo.get("b") is None  # least recently used went first
    assert memo.get("a") is not None
    assert memo.nbytes == 1000
    memo.put("huge", MemoEntry("p", 1, 251, 0, 0, b"x" * 251))  # > a quarter: not kept
    assert memo.get("huge") is None


# -- the record binds the key -------------------------------------------------


@pytest.mark.parametrize("move", ["copy-with-record", "rename"])
def test_an_entry_moved_onto_another_keys_path_is_not_served(any_cache, move):
    cache = any_cache
    cache[b"A"] = b"bytes of A"
    cache[b"B"] = b"bytes of B"
    a, b = entry_path(cache, b"A"), entry_path(cache, b"B")
    if move == "rename":
        os.replace(a, b)
        if cache.record_carrier == "sidecar":  # the record moves with it, inode and all
            os.replace(str(a) + SIDECAR_SUFFIX, str(b) + SIDECAR_SUFFIX)
    else:
        copy_with_record(cache, a, b)
    cache._memo = None  # a fresh process: nothing remembered
    assert cache.get(b"B") is None
    if cache.record_carrier == "sidecar" and move != "rename":
        return  # the sidecar names the inode it vouches for: a copy is unverifiable, a miss
    assert cache.stats().corrupt == 1
    report = FileStreamProgramCache(cache.path).verify()
    assert report.corrupt == []
    assert report.ok == (0 if move == "rename" else 1)


def test_verify_refuses_a_moved_entry(any_cache):
    cache = any_cache
    cache[b"A"] = b"bytes of A"
    cache[b"B"] = b"bytes of B"
    copy_with_record(cache, entry_path(cache, b"A"), entry_path(cache, b"B"))
    report = cache.verify()
    if cache.record_carrier == "sidecar":  # names another inode: unverifiable, never served
        assert report.unverified == [entry_path(cache, b"B").name]
        assert cache.get(b"B") is None
        return
    assert report.corrupt == [entry_path(cache, b"B").name]
    assert report.ok == 1
    assert cache[b"A"] == b"bytes of A"


# -- counts and clear errors --------------------------------------------------


def test_len_and_stats_count_the_same_entries(cache):
    cache[b"mine"] = b"v" * 10
    cache[b"theirs"] = b"w" * 10
    cache[b"linked"] = b"x" * 10
    os.chown(entry_path(cache, b"theirs"), OTHER_UID, OTHER_UID)
    p = entry_path(cache, b"linked")
    p.unlink()
    p.symlink_to(entry_path(cache, b"mine"))
    assert len(cache) == cache.stats().entries == 1


@pytest.mark.parametrize("kind", ["directory", "symlink"])
@pytest.mark.parametrize("cap", [None, 1000])
def test_a_usage_path_that_is_not_a_file_is_named(tmp_path, kind, cap):
    FileStreamProgramCache(tmp_path / "c").close()
    usage = tmp_path / "c" / "usage"
    usage.unlink(missing_ok=True)
    if kind == "directory":
        usage.mkdir()
    else:
        usage.symlink_to(tmp_path / "elsewhere")

    def store() -> None:
        c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=cap)
        c[b"k"] = b"v"

    if kind == "symlink" and cap is None:
        store()  # an uncapped store removes the counter, the link with it
        assert not usage.is_symlink()
        return
    with pytest.raises(
        CacheSecurityError, match=f"{usage} is a {kind.replace('symlink', 'symbolic link')}"
    ):
        store()


@pytest.mark.parametrize("cap", [None, 1000])
def test_an_entry_path_that_is_a_directory_is_named(tmp_path, cap):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes=cap)
    p = entry_path(c, b"k")
    p.mkdir(parents=True)
    with pytest.raises(CacheSecurityError, match=f"{p} is not a regular file"):
        c.get(b"k")
    with pytest.raises(
        CacheSecurityError, match=f"{p} is a directory where a cache entry belongs"
    ):
        c[b"k"] = b"v"
    with pytest.raises(
        CacheSecurityError, match=f"{p} is a directory where a cache entry belongs"
    ):
        del c[b"k"]
    assert c.verify().refused == [(str(p), "not a regular file")]
    assert os.listdir(c.path / "tmp") == []
