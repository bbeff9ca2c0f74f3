"""Stat-guarded unlink and touch: never disturb a file someone replaced meanwhile.

A file is identified by ``StatKey(ino, size, mtime_ns)``. Writers publish by
rename, so a rewrite always brings a new inode; a guard that compares the key
it snapshotted with the key it sees now refuses to act on a replacement.
"""

from __future__ import annotations

import enum
import os
import time
from typing import NamedTuple

from nexus_cache._storage._names import temp_name

__all__ = [
    "StatKey",
    "UnlinkResult",
    "lstat_key",
    "stat_key",
    "touch_if_unchanged",
    "unlink_if_unchanged",
]


class StatKey(NamedTuple):
    ino: int
    size: int
    mtime_ns: int


def stat_key(st: os.stat_result) -> StatKey:
    return StatKey(st.st_ino, st.st_size, st.st_mtime_ns)


def lstat_key(path: str | os.PathLike[str]) -> StatKey | None:
    """Key of ``path`` (not following a symlink), or ``None`` when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return StatKey(st.st_ino, st.st_size, st.st_mtime_ns)


class UnlinkResult(enum.Enum):
    REMOVED = "removed"  # we removed exactly the expected file
    GONE = "gone"  # already gone: a concurrent deleter won; its bytes are freed all the same
    CHANGED = "changed"  # replaced since the snapshot; left alone


def unlink_if_unchanged(
    path: str | os.PathLike[str],
    expected: StatKey,
    *,
    aside_dir: str | os.PathLike[str] | None = None,
) -> UnlinkResult:
    """Remove ``path`` only if it is still the file ``expected`` describes.

    Without ``aside_dir`` this is re-lstat then unlink: a rewriter whose rename
    lands in the microseconds between the two loses its fresh file (the entry
    is simply missing afterwards, never torn).

    With ``aside_dir`` (a directory on the same filesystem, e.g. the temp dir)
    the window is closed: the file is first renamed aside atomically, then
    judged; a replacement grabbed by mistake is linked back unless an even
    newer file has been published meanwhile. A reader racing this sees a miss
    for that instant. A crash leaves the aside file as an ordinary stale temp.
    """
    if aside_dir is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return UnlinkResult.GONE
        if StatKey(st.st_ino, st.st_size, st.st_mtime_ns) != expected:
            return UnlinkResult.CHANGED
        try:
            os.unlink(path)
        except FileNotFoundError:
            return UnlinkResult.GONE
        return UnlinkResult.REMOVED

    aside = os.path.join(aside_dir, temp_name("del-"))
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        if not os.path.isdir(aside_dir):
            # the aside dir vanished (someone wiped it): fall back to the plain guard
            return unlink_if_unchanged(path, expected)
        return UnlinkResult.GONE
    try:
        st = os.lstat(aside)
        if StatKey(st.st_ino, st.st_size, st.st_mtime_ns) == expected:
            return UnlinkResult.REMOVED
        # We grabbed a replacement: put it back unless something newer is there now.
        try:
            os.link(aside, path, follow_symlinks=False)
        except FileExistsError:
            pass
        return UnlinkResult.CHANGED
    finally:
        try:
            os.unlink(aside)
        except FileNotFoundError:
            pass


def touch_if_unchanged(path_or_fd: str | os.PathLike[str] | int, expected: StatKey) -> bool:
    """Set atime to now and keep mtime, only if the file still matches ``expected``.

    Given an open fd, the check and the update hit the same inode, so a
    rewriter's freshly renamed file is never touched (no TOCTOU). Given a path,
    the file is opened without following symlinks first. Returns whether the
    stamp was written.
    """
    if isinstance(path_or_fd, int):
        return _touch_fd(path_or_fd, expected)
    try:
        fd = os.open(path_or_fd, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:  # gone, or a symlink (ELOOP): nothing of ours to touch
        return False
    try:
        return _touch_fd(fd, expected)
    finally:
        os.close(fd)


def _touch_fd(fd: int, expected: StatKey) -> bool:
    st = os.fstat(fd)
    if StatKey(st.st_ino, st.st_size, st.st_mtime_ns) != expected:
        return False
    os.utime(fd, ns=(time.time_ns(), expected.mtime_ns))
    return True
