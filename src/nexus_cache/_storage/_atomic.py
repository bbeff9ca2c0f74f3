"""Atomic publication: write a private temp, fsync, then rename into place.

A reader of the final path sees the old file or the new one, never a torn
one; a crash at any instant leaves at most a temp file, which
:func:`~nexus_cache._storage.sweep_stale_temps` removes later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from nexus_cache._storage._dirs import ensure_private_dir
from nexus_cache._storage._names import temp_name

__all__ = [
    "atomic_write",
    "fsync_dir",
    "new_temp",
    "publish_temp",
    "rename_into_place",
    "stage_temp",
    "unlink_quietly",
    "write_all",
]

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW


def new_temp(tmp_dir: str | os.PathLike[str], *, prefix: str = "") -> tuple[int, Path]:
    """Create a fresh temp file (0600, ``O_EXCL``) in ``tmp_dir``; return ``(fd, path)``.

    If ``tmp_dir`` was deleted behind our back it is recreated (0700) once.
    """
    tmp = os.fspath(tmp_dir)
    name = temp_name(prefix)
    path = os.path.join(tmp, name)
    try:
        fd = os.open(path, _TEMP_FLAGS, 0o600)
    except FileNotFoundError:
        ensure_private_dir(tmp)
        fd = os.open(path, _TEMP_FLAGS, 0o600)
    return fd, Path(path)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data).cast("B")
    total = len(view)
    done = os.write(fd, view)
    while done < total:
        done += os.write(fd, view[done:])


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or unlink in it is durable."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def unlink_quietly(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` if possible; a cleanup that must not mask the real error."""
    try:
        os.unlink(path)
    except OSError:
        pass


_unlink_quietly = unlink_quietly
_open, _write, _close, _fsync, _setxattr = os.open, os.write, os.close, os.fsync, os.setxattr
_utime = os.utime


def stage_temp(
    tmp_dir: str,
    data: bytes,
    *,
    xattr: tuple[str, bytes] | None = None,
    times_ns: tuple[int, int] | None = None,
    fsync: bool = True,
    want_inode: bool = False,
) -> tuple[str, int]:
    """Write ``data`` to a fresh temp in ``tmp_dir``, ready for :func:`rename_into_place`.

    The hot half of a publication, string paths only: ``open(O_EXCL)``,
    ``write``, ``fsetxattr`` (``xattr`` = name, value: set on the fd, so it
    is published atomically with the bytes), ``futimens`` (``times_ns``:
    the file's atime and mtime, published with the bytes likewise),
    ``fsync`` and ``close``. A
    deleted ``tmp_dir`` is recreated (0700). Returns ``(temp path, inode)``;
    the inode is 0 unless ``want_inode``. On any error the temp is removed
    and the error re-raised. Thread- and process-safe (unique names).
    """
    tmp = f"{tmp_dir}/{temp_name()}"
    try:
        fd = _open(tmp, _TEMP_FLAGS, 0o600)
    except FileNotFoundError:
        ensure_private_dir(tmp_dir)  # tmp/ deleted behind our back
        fd = _open(tmp, _TEMP_FLAGS, 0o600)
    try:
        try:
            done = _write(fd, data)
            if done < len(data):
                write_all(fd, memoryview(data)[done:])
            if xattr is not None:
                _setxattr(fd, xattr[0], xattr[1])
            if times_ns is not None:
                _utime(fd, ns=times_ns)
            ino = os.fstat(fd).st_ino if want_inode else 0
            if fsync:
                _fsync(fd)
        finally:
            _close(fd)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp, ino


def rename_into_place(tmp_path: str, final: str) -> None:
    """Rename a staged temp over ``final`` (atomic); creates a missing parent (0700).

    Readers of ``final`` see the old file or the new one, never a torn one.
    On any error the temp is removed and the error re-raised.
    """
    try:
        try:
            os.replace(tmp_path, final)
        except FileNotFoundError:
            if not os.path.exists(tmp_path):
                raise
            ensure_private_dir(final.rpartition("/")[0])  # a new (or deleted) parent
            os.replace(tmp_path, final)
    except BaseException:
        unlink_quietly(tmp_path)
        raise


def publish_temp(
    fd: int,
    tmp_path: str | os.PathLike[str],
    final: str | os.PathLike[str],
    *,
    xattrs: Mapping[str, bytes] | None = None,
    fsync: bool = True,
    replace: bool = True,
    fsync_parent: bool = False,
) -> bool:
    """Publish a fully written temp at ``final``; always closes ``fd``.

    Sets ``xattrs`` on the fd (so they appear atomically with the bytes),
    fsyncs the file, closes it, then renames it over ``final`` (``replace=True``)
    or hard-links it there only if ``final`` does not exist yet
    (``replace=False``; returns ``False`` and discards the temp when it does).
    Missing parents of ``final`` are created 0700.

    ``fsync`` makes the bytes (and xattrs) durable before the rename, so even
    a power cut never exposes a torn or empty file at ``final``.
    ``fsync_parent`` also fsyncs the parent directory so that the publication
    itself survives a power cut; a cache rarely needs this (a lost publication
    is just a miss) and it costs another journal commit. On any
    error the temp is removed and the error re-raised. Returns ``True`` when our
    bytes are now at ``final``.
    """
    try:
        try:
            if xattrs:
                for name, value in xattrs.items():
                    os.setxattr(fd, name, value)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        parent = os.path.dirname(os.fspath(final))
        if replace:
            try:
                os.replace(tmp_path, final)
            except FileNotFoundError:
                if not os.path.exists(tmp_path):
                    raise
                ensure_private_dir(parent)
                os.replace(tmp_path, final)
            published = True
        else:
            try:
                os.link(tmp_path, final, follow_symlinks=False)
            except FileExistsError:
                published = False
            except FileNotFoundError:
                if not os.path.exists(tmp_path):
                    raise
                ensure_private_dir(parent)
                try:
                    os.link(tmp_path, final, follow_symlinks=False)
                    published = True
                except FileExistsError:
                    published = False
            else:
                published = True
            _unlink_quietly(tmp_path)
        if fsync_parent and published:
            fsync_dir(parent or ".")
        return published
    except BaseException:
        _unlink_quietly(tmp_path)
        raise


def atomic_write(
    final: str | os.PathLike[str],
    data: bytes | bytearray | memoryview,
    *,
    tmp_dir: str | os.PathLike[str],
    xattrs: Mapping[str, bytes] | None = None,
    fsync: bool = True,
    replace: bool = True,
    fsync_parent: bool = False,
) -> bool:
    """Write ``data`` to ``final`` atomically (see :func:`publish_temp`)."""
    fd, tmp_path = new_temp(tmp_dir)
    try:
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp_path)
        raise
    return publish_temp(
        fd,
        tmp_path,
        final,
        xattrs=xattrs,
        fsync=fsync,
        replace=replace,
        fsync_parent=fsync_parent,
    )
