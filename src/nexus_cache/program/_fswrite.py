"""The store path of the file-stream cache: one temp, one fsync, one rename.

A specialised, string-only version of ``_storage.publish_temp`` for the hot
path (no ``pathlib``, no per-call mappings): each store costs ``open``,
``write``, ``fsetxattr``, ``fsync``, ``close`` and ``rename``, and a directory
is only created when the rename or the open says it is missing (``ENOENT``),
so a deleted ``tmp/`` or shard directory heals on the next store.

Crash safety is that of ``publish_temp``: the bytes and their integrity
record are fsynced on the temp before the rename, so a power cut never
exposes a torn or empty entry; a crash leaves at most a temp, which the
stale-temp sweep removes.
"""

from __future__ import annotations

import os

from nexus_cache._storage import ensure_private_dir, host_tag

__all__ = ["publish_entry"]

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_open, _write, _close, _fsync = os.open, os.write, os.close, os.fsync
_setxattr, _replace, _urandom, _getpid = os.setxattr, os.replace, os.urandom, os.getpid


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def publish_entry(tmp_dir: str, final: str, data: bytes, xattr: tuple[str, bytes] | None) -> int:
    """Publish ``data`` at ``final`` atomically; thread- and process-safe.

    With ``xattr`` (name, value) the attribute is set on the temp's fd, so
    it appears atomically with the bytes. Returns the published inode when
    ``xattr`` is ``None`` (a sidecar must name it), else 0. On any error the
    temp is removed and the error re-raised.
    """
    # Same shape as _storage.temp_name, so the stale-temp sweep judges it.
    tmp = f"{tmp_dir}/{host_tag()}-{_getpid()}-{_urandom(8).hex()}.tmp"
    try:
        fd = _open(tmp, _TEMP_FLAGS, 0o600)
    except FileNotFoundError:
        ensure_private_dir(tmp_dir)  # tmp/ deleted behind our back
        fd = _open(tmp, _TEMP_FLAGS, 0o600)
    try:
        try:
            done = _write(fd, data)
            if done < len(data):
                view = memoryview(data)
                while done < len(data):
                    done += _write(fd, view[done:])
            ino = 0
            if xattr is not None:
                _setxattr(fd, xattr[0], xattr[1])
            else:
                ino = os.fstat(fd).st_ino
            _fsync(fd)
        finally:
            _close(fd)
        try:
            _replace(tmp, final)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            ensure_private_dir(final.rpartition("/")[0])  # a new (or deleted) shard
            _replace(tmp, final)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return ino
