"""What the file-stream test files share: entry paths, atime, record carriers."""

from __future__ import annotations

import os
import shutil
import time

from nexus_cache.program._integrity import SIDECAR_SUFFIX, XATTR_NAME, entry_location

OTHER_UID = 54321


def entry_path(cache, key):
    sub, name = entry_location(key)
    return cache.path / "entries" / sub / name


def set_atime(path, atime_s):
    st = os.lstat(path)
    os.utime(path, ns=(int(atime_s * 1e9), st.st_mtime_ns))


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
