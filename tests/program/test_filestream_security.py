"""File-stream backend: symlinks, foreign owners, FIFOs and unwritable roots are refused."""

from __future__ import annotations

import os

import pytest

from nexus_cache.errors import CacheSecurityError
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program.filestream import _cache

from ._filestream import OTHER_UID, entry_path


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
