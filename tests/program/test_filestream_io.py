"""File-stream backend: what a store leaves on disk, temp files, counts, clear errors."""

from __future__ import annotations

import os
import shutil
import stat
import time

import pytest

from nexus_cache._storage._names import host_tag
from nexus_cache.errors import CacheSecurityError
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program._integrity import (
    RECORD_SIZE,
    SIDECAR_SUFFIX,
    XATTR_NAME,
    entry_check,
    entry_name,
)

from ._filestream import OTHER_UID, entry_path

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
