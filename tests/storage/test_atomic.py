from __future__ import annotations

import os
import stat

import pytest

from nexus_cache._storage import (
    atomic_write,
    new_temp,
    publish_temp,
    rename_into_place,
    stage_temp,
    write_all,
)
from nexus_cache._storage._names import parse_temp_name


def _tmp(root):
    d = root / "tmp"
    d.mkdir(exist_ok=True)
    return d


def test_atomic_write_publishes_bytes_and_xattrs(tmp_path):
    final = tmp_path / "entries" / "ab" / "e"
    assert atomic_write(final, b"payload", tmp_dir=_tmp(tmp_path), xattrs={"user.t": b"v1"})
    assert final.read_bytes() == b"payload"
    assert os.getxattr(final, "user.t") == b"v1"
    assert stat.S_IMODE(os.lstat(final).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(final.parent).st_mode) == 0o700
    assert os.listdir(tmp_path / "tmp") == []


def test_replace_true_overwrites(tmp_path):
    final = tmp_path / "e"
    atomic_write(final, b"old", tmp_dir=_tmp(tmp_path))
    ino = os.lstat(final).st_ino
    assert atomic_write(final, memoryview(b"new"), tmp_dir=_tmp(tmp_path), fsync=False)
    assert final.read_bytes() == b"new"
    assert os.lstat(final).st_ino != ino


def test_replace_false_keeps_first_and_discards_temp(tmp_path):
    final = tmp_path / "e"
    assert atomic_write(final, b"first", tmp_dir=_tmp(tmp_path), replace=False)
    assert not atomic_write(final, b"second", tmp_dir=_tmp(tmp_path), replace=False)
    assert final.read_bytes() == b"first"
    assert os.listdir(tmp_path / "tmp") == []


def test_new_temp_recreates_deleted_tmp_dir(tmp_path):
    tmp = _tmp(tmp_path)
    os.rmdir(tmp)
    fd, path = new_temp(tmp, prefix="w-")
    os.close(fd)
    assert path.parent == tmp
    assert path.name.startswith("w-")
    assert stat.S_IMODE(os.lstat(tmp).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_new_temp_names_are_unique(tmp_path):
    names = set()
    for _ in range(50):
        fd, path = new_temp(_tmp(tmp_path))
        os.close(fd)
        names.add(path.name)
    assert len(names) == 50


def test_failed_publish_removes_temp_and_raises(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"")  # a file where a parent directory should be
    tmp = _tmp(tmp_path)
    fd, path = new_temp(tmp)
    write_all(fd, b"abc")
    with pytest.raises(OSError):  # ENOTDIR is what the kernel says
        publish_temp(fd, path, blocker / "sub" / "e")
    assert os.listdir(tmp) == []


def test_bad_xattr_removes_temp_and_closes_fd(tmp_path):
    tmp = _tmp(tmp_path)
    fd, path = new_temp(tmp)
    with pytest.raises(OSError):  # namespace "bogus." is rejected by the kernel
        publish_temp(fd, path, tmp_path / "e", xattrs={"bogus.name": b"x"})
    assert os.listdir(tmp) == []
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    assert not (tmp_path / "e").exists()


def test_write_all_large_buffer(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 7)
    final = tmp_path / "big"
    atomic_write(final, bytearray(data), tmp_dir=_tmp(tmp_path))
    assert final.read_bytes() == data


def test_fsync_parent_publishes_too(tmp_path):
    final = tmp_path / "d" / "e"
    assert atomic_write(final, b"x", tmp_dir=_tmp(tmp_path), fsync_parent=True)
    assert final.read_bytes() == b"x"


def test_stage_then_rename_publishes_bytes_xattr_and_heals_directories(tmp_path):
    tmp = tmp_path / "tmp"  # missing: recreated 0700
    final = tmp_path / "entries" / "cd" / "e"  # missing parent: created 0700
    data = os.urandom(300_000)
    path, ino = stage_temp(str(tmp), data, xattr=("user.t", b"rec"), want_inode=True)
    assert parse_temp_name(os.path.basename(path)) is not None  # the sweeper can judge it
    assert ino == os.lstat(path).st_ino
    assert stat.S_IMODE(os.lstat(tmp).st_mode) == 0o700
    rename_into_place(path, str(final))
    assert final.read_bytes() == data
    assert os.getxattr(final, "user.t") == b"rec"
    assert os.lstat(final).st_ino == ino
    assert stat.S_IMODE(os.lstat(final.parent).st_mode) == 0o700
    assert os.listdir(tmp) == []


def test_a_failed_rename_leaves_no_temp(tmp_path):
    final = tmp_path / "dir-in-the-way"
    final.mkdir()
    (final / "x").write_bytes(b"")
    path, _ = stage_temp(str(tmp_path / "tmp"), b"v")
    with pytest.raises(OSError):
        rename_into_place(path, str(final))
    assert os.listdir(tmp_path / "tmp") == []
