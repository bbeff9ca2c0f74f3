from __future__ import annotations

import os
import time

import pytest

from nexus_cache._storage import (
    StatKey,
    UnlinkResult,
    atomic_write,
    lstat_key,
    stat_key,
    touch_if_unchanged,
    unlink_if_unchanged,
)

ASIDE = [False, True]


@pytest.fixture
def env(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp_path, tmp


def _aside(flag, tmp):
    return {"aside_dir": tmp} if flag else {}


def test_stat_keys(env):
    root, _ = env
    f = root / "f"
    f.write_bytes(b"abc")
    st = os.lstat(f)
    assert stat_key(st) == StatKey(st.st_ino, 3, st.st_mtime_ns)
    assert lstat_key(f) == stat_key(st)
    assert lstat_key(root / "missing") is None


@pytest.mark.parametrize("aside", ASIDE)
def test_unlink_removes_unchanged(env, aside):
    root, tmp = env
    f = root / "f"
    f.write_bytes(b"abc")
    assert unlink_if_unchanged(f, lstat_key(f), **_aside(aside, tmp)) is UnlinkResult.REMOVED
    assert not f.exists()
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("aside", ASIDE)
def test_unlink_reports_gone(env, aside):
    root, tmp = env
    f = root / "f"
    f.write_bytes(b"abc")
    key = lstat_key(f)
    os.unlink(f)
    assert unlink_if_unchanged(f, key, **_aside(aside, tmp)) is UnlinkResult.GONE


@pytest.mark.parametrize("aside", ASIDE)
def test_unlink_leaves_replacement(env, aside):
    root, tmp = env
    f = root / "f"
    atomic_write(f, b"old", tmp_dir=tmp, fsync=False)
    key = lstat_key(f)
    atomic_write(f, b"new!", tmp_dir=tmp, fsync=False)  # a rewriter won
    assert unlink_if_unchanged(f, key, **_aside(aside, tmp)) is UnlinkResult.CHANGED
    assert f.read_bytes() == b"new!"
    assert os.listdir(tmp) == []


def test_aside_keeps_newest_when_two_writers_raced(env, monkeypatch):
    # The evictor grabs a replacement, and yet another writer publishes before
    # it can put the replacement back: the newest file must win.
    root, tmp = env
    f = root / "f"
    atomic_write(f, b"v1", tmp_dir=tmp, fsync=False)
    key = lstat_key(f)
    atomic_write(f, b"v2", tmp_dir=tmp, fsync=False)
    real_lstat = os.lstat
    fired = []

    def lstat_then_publish(path, *a, **kw):
        st = real_lstat(path, *a, **kw)
        if not fired and os.path.dirname(os.fspath(path)) == str(tmp):
            fired.append(1)
            atomic_write(f, b"v3", tmp_dir=tmp, fsync=False)
        return st

    monkeypatch.setattr(os, "lstat", lstat_then_publish)
    assert unlink_if_unchanged(f, key, aside_dir=tmp) is UnlinkResult.CHANGED
    monkeypatch.undo()
    assert fired
    assert f.read_bytes() == b"v3"
    assert os.listdir(tmp) == []


def test_touch_bumps_atime_keeps_mtime(env):
    root, _ = env
    f = root / "f"
    f.write_bytes(b"abc")
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    key = lstat_key(f)
    before = time.time_ns()
    assert touch_if_unchanged(f, key)
    st = os.lstat(f)
    assert st.st_atime_ns >= before - 10_000_000
    assert st.st_mtime_ns == 2_000_000_000


def test_touch_by_fd(env):
    root, _ = env
    f = root / "f"
    f.write_bytes(b"abc")
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    fd = os.open(f, os.O_RDONLY)
    try:
        assert touch_if_unchanged(fd, lstat_key(f))
    finally:
        os.close(fd)
    assert os.lstat(f).st_atime_ns > 1_000_000_000
    assert os.lstat(f).st_mtime_ns == 2_000_000_000


def test_touch_refuses_changed_missing_and_symlink(env):
    root, tmp = env
    f = root / "f"
    atomic_write(f, b"old", tmp_dir=tmp, fsync=False)
    key = lstat_key(f)
    atomic_write(f, b"new", tmp_dir=tmp, fsync=False)
    os.utime(f, ns=(5, 7))
    assert not touch_if_unchanged(f, key)
    assert os.lstat(f).st_atime_ns == 5  # replacement untouched
    assert not touch_if_unchanged(root / "missing", key)
    link = root / "l"
    link.symlink_to(f)
    assert not touch_if_unchanged(link, lstat_key(f))
