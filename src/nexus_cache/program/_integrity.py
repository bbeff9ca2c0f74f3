"""Integrity records kept beside a raw entry, never inside it.

The record is ``MAGIC | crc32 | length | key digest`` (32 bytes): the key
digest is the first 16 bytes of the SHA-256 of the entry's key, which is also
the entry's file name, so an entry copied or renamed onto another key's path
(xattr and all) no longer matches the record there and is never served for
that key. The record lives in the entry's
``user.nexus.v1`` extended attribute, set on the temp file before the rename so
it is published atomically with the bytes. Filesystems without user xattrs get
a sidecar file ``<entry>.sum`` instead, which also names the entry's inode so
a reader can tell a sidecar that belongs to another version of the entry.

CRC-32 (zlib) is the digest: it costs ~4 us per 16 KiB here versus ~10 us for
SHA-256 and ~21 us for BLAKE2b, and it catches every truncation (with the
length) and every burst error up to 32 bits. It guards against accidents
(bit rot, torn copies, stray writes), not against an attacker: the cache root
is private (0700) for that.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib

from nexus_cache._storage import new_temp

__all__ = [
    "READ_FLAGS",
    "open_entry",
    "KEY_DIGEST_SIZE",
    "RECORD_SIZE",
    "key_digest_of_name",
    "SIDECAR_SUFFIX",
    "XATTR_NAME",
    "make_record",
    "make_sidecar",
    "parse_sidecar",
    "read_record",
    "read_rest",
    "record_matches",
    "xattrs_supported",
]

XATTR_NAME = "user.nexus.v1"
SIDECAR_SUFFIX = ".sum"
# "nxc1" records (no key digest) were written by earlier versions: they no
# longer match, so such an entry reads as corrupt once and is replaced.
_MAGIC = b"nxc2"
_RECORD = struct.Struct("<4sIQ16s")  # magic, crc, length, key digest
_SIDECAR = struct.Struct("<4sQIQ16s")  # magic, inode, crc, length, key digest
KEY_DIGEST_SIZE = 16
RECORD_SIZE = _RECORD.size
_pack, _crc32 = _RECORD.pack, zlib.crc32
# O_NONBLOCK: a FIFO planted at an entry path must not hang the reader.
PLAIN_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# O_NOATIME: a read never moves the atime by itself (relatime would, on a
# fresh entry); the cache writes its own stamp (see the stamp window), and
# verify() leaves the LRU order alone.
READ_FLAGS = PLAIN_READ_FLAGS | getattr(os, "O_NOATIME", 0)
_NOT_SUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}


def key_digest_of_name(name: str) -> bytes:
    """The key digest an entry named ``name`` (64 hex digits) must carry."""
    return bytes.fromhex(name[: 2 * KEY_DIGEST_SIZE])


def make_record(data: bytes, kd: bytes) -> bytes:
    """The record for ``data`` stored under the key whose SHA-256 starts with ``kd``."""
    return _RECORD.pack(_MAGIC, zlib.crc32(data), len(data), kd)


def record_matches(record: bytes, data: bytes, kd: bytes) -> bool:
    """Whether ``record`` (as read back) vouches for exactly ``data`` under key digest ``kd``."""
    # One pack and one compare: equal exactly when magic, CRC, length and key all match.
    return record == _pack(_MAGIC, _crc32(data), len(data), kd)


def make_sidecar(ino: int, data: bytes, kd: bytes) -> bytes:
    return _SIDECAR.pack(_MAGIC, ino, zlib.crc32(data), len(data), kd)


def parse_sidecar(raw: bytes) -> tuple[int, bytes] | None:
    """``(inode, record)`` from a sidecar's bytes, or ``None`` when unreadable."""
    if len(raw) != _SIDECAR.size:
        return None
    magic, ino, crc, length, kd = _SIDECAR.unpack(raw)
    if magic != _MAGIC:
        return None
    return ino, _RECORD.pack(magic, crc, length, kd)


def xattrs_supported(tmp_dir: str) -> bool:
    """Probe whether files in ``tmp_dir`` accept ``user.*`` extended attributes."""
    fd, path = new_temp(tmp_dir, prefix="probe-")
    try:
        probe = make_record(b"", bytes(KEY_DIGEST_SIZE))
        os.setxattr(fd, XATTR_NAME, probe)
        return os.getxattr(fd, XATTR_NAME) == probe
    except OSError as exc:
        if exc.errno in _NOT_SUPPORTED:
            return False
        raise
    finally:
        os.close(fd)
        os.unlink(path)


def open_entry(path: str) -> int:
    """Open an entry (or sidecar) for reading without following a symlink."""
    try:
        return os.open(path, READ_FLAGS)
    except PermissionError:
        # The kernel refuses O_NOATIME on a file we do not own: open it plainly,
        # and the caller's ownership check refuses it with a clear message.
        return os.open(path, PLAIN_READ_FLAGS)


def read_rest(fd: int, head: bytes, size: int) -> bytes:
    """``head`` plus what follows it in ``fd`` up to ``size`` bytes in all."""
    parts = [head]
    got = len(head)
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break  # shrank under us: the record check will reject it
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _sidecar_record(path: str, ino: int) -> bytes | None:
    try:
        fd = open_entry(path + SIDECAR_SUFFIX)
    except OSError:
        return None
    try:
        parsed = parse_sidecar(os.read(fd, 64))
    finally:
        os.close(fd)
    if parsed is None or parsed[0] != ino:
        return None  # belongs to another version of the entry (or none): unverifiable
    return parsed[1]


def read_record(fd: int, path: str, ino: int, use_xattr: bool) -> bytes | None:
    """The integrity record of the open entry ``fd``.

    ``b""`` when an xattr record is missing (nothing vouches for the bytes:
    treat as corrupt); ``None`` when a sidecar is missing or names another
    inode (a writer mid-publication: treat as a plain miss).
    """
    if use_xattr:
        try:
            return os.getxattr(fd, XATTR_NAME)
        except OSError:
            return b""
    return _sidecar_record(path, ino)
