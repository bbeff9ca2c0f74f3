"""Private cache directories and ownership checks (POSIX only)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nexus_cache.errors import CacheSecurityError

__all__ = ["check_owned_regular", "ensure_private_dir", "read_regular"]

_DIR_MODE = 0o700


def _refuse_symlink(path: Path) -> CacheSecurityError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return CacheSecurityError(
        f"{path} is a symbolic link (to {target}); refusing to follow it for a cache. "
        "Point the cache at the real directory instead, or remove the link."
    )


def _refuse_owner(path: Path, uid: int) -> CacheSecurityError:
    return CacheSecurityError(
        f"{path} is owned by uid {uid}, not by the current user (uid {os.geteuid()}); "
        "refusing to trust it. Use a cache location you own, or fix its ownership."
    )


def _check_dir(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _refuse_symlink(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(
            f"{path} exists and is not a directory; choose another cache location or remove it"
        )
    if st.st_uid != os.geteuid():
        raise _refuse_owner(path, st.st_uid)


def _wrap(exc: OSError, path: Path) -> OSError:
    msg = (
        f"cannot create cache directory {path}: {exc.strerror or exc}; "
        "choose a writable location you own"
    )
    if exc.errno is None:
        return OSError(msg)
    return type(exc)(exc.errno, msg)


def _make_dirs(path: Path) -> None:
    # Create missing components top-down so each gets 0700 regardless of umask;
    # components that already exist (e.g. ~/.cache) are left untouched.
    missing: list[Path] = []
    cur = path
    while True:
        try:
            os.lstat(cur)
            break
        except FileNotFoundError:
            missing.append(cur)
            if cur.parent == cur:
                break
            cur = cur.parent
    for comp in reversed(missing):
        try:
            os.mkdir(comp, _DIR_MODE)
        except FileExistsError:
            continue  # a concurrent creator won; the final check below judges it
        except OSError as exc:
            raise _wrap(exc, path) from exc
        os.chmod(comp, _DIR_MODE)


def ensure_private_dir(path: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Return ``path`` as a directory the current user owns, creating it (0700) if asked.

    Refuses with :class:`CacheSecurityError` a path that is a symlink or is owned
    by another uid. Parents that already exist are trusted as they are (a
    symlinked ``~/.cache`` is common and fine). With ``create=False`` a missing
    directory raises ``FileNotFoundError``. Safe to race with other processes
    creating the same directory.
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if not create:
            raise FileNotFoundError(
                2, f"cache directory {p} does not exist; create it or pass another path"
            ) from None
        _make_dirs(p)
        try:
            st = os.lstat(p)
        except FileNotFoundError as exc:  # removed again by someone else
            raise _wrap(exc, p) from exc
    except OSError as exc:
        raise _wrap(exc, p) from exc
    _check_dir(p, st)
    return p


def check_owned_regular(path: str | os.PathLike[str], st: os.stat_result) -> None:
    """Refuse (``CacheSecurityError``) unless ``st`` is a regular file we own.

    ``st`` must come from ``os.lstat`` or ``os.fstat`` so a symlink is seen as one.
    """
    mode = st.st_mode
    if stat.S_ISREG(mode) and st.st_uid == os.geteuid():
        return  # the hit path: no Path object unless there is something to say
    p = Path(path)
    if stat.S_ISLNK(mode):
        raise _refuse_symlink(p)
    if not stat.S_ISREG(mode):
        raise CacheSecurityError(f"{p} is not a regular file; remove it from the cache directory")
    if st.st_uid != os.geteuid():
        raise _refuse_owner(p, st.st_uid)


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """All bytes of the regular file at ``path`` (a symlink is followed).

    Opened non-blocking and checked before any read: a FIFO, socket or device
    in its place is refused (``CacheSecurityError``, a ``PermissionError``)
    instead of holding the reader until a writer appears, which is what a
    plain ``open`` of a FIFO does. A missing file raises ``FileNotFoundError``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheSecurityError(
                f"{os.fspath(path)} is not a regular file; remove it from the cache directory"
            )
        return f.read()
