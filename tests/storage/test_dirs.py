from __future__ import annotations

import os
import stat

import pytest

from nexus_cache._storage import check_owned_regular, ensure_private_dir
from nexus_cache.errors import CacheSecurityError

OTHER_UID = 54321


def test_creates_nested_dirs_private_despite_umask(tmp_path):
    old = os.umask(0)
    try:
        p = ensure_private_dir(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", p):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    assert p.is_dir()


def test_existing_dir_is_accepted_and_not_rechmodded(tmp_path):
    d = tmp_path / "shared"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    assert ensure_private_dir(d) == d
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o755


def test_symlinked_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(CacheSecurityError, match="symbolic link"):
        ensure_private_dir(link)


def test_foreign_owner_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir()
    os.chown(d, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheSecurityError, match=f"uid {OTHER_UID}"):
        ensure_private_dir(d)


def test_regular_file_in_place_of_dir(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        ensure_private_dir(f)


def test_unwritable_parent_names_the_path(tmp_path):
    # A regular file as a parent stops even root from creating the directory.
    f = tmp_path / "file"
    f.write_bytes(b"")
    target = f / "cache"
    with pytest.raises(NotADirectoryError, match=str(target)):
        ensure_private_dir(target)


def test_create_false_on_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ensure_private_dir(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_check_owned_regular(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    check_owned_regular(f, os.lstat(f))
    link = tmp_path / "l"
    link.symlink_to(f)
    with pytest.raises(CacheSecurityError, match="symbolic link"):
        check_owned_regular(link, os.lstat(link))
    with pytest.raises(CacheSecurityError, match="not a regular file"):
        check_owned_regular(tmp_path, os.lstat(tmp_path))
    os.chown(f, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        check_owned_regular(f, os.lstat(f))
