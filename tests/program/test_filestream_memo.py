"""File-stream backend: the in-memory memo of verified entries."""

from __future__ import annotations

import os
import time

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program.filestream import _stamps

from ._filestream import entry_path


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
