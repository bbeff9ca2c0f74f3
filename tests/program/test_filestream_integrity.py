"""File-stream backend: damaged, stripped and moved entries are detected, never served."""

from __future__ import annotations

import os

import pytest

from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program._integrity import SIDECAR_SUFFIX, XATTR_NAME
from nexus_cache.program.filestream import _cache

from ._filestream import copy_with_record, entry_path, strip_record

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
