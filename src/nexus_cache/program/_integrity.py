"""Integrity records of raw entries: never inside the entry's bytes.

An entry file holds the binary exactly as compiled (cuobjdump and nvdisasm
read it), so what vouches for it lives in the file's metadata. The check is
XXH3-64 of the bytes XORed with the entry's key tag, the CRC-32 of the
32-byte digest its name spells (see :func:`entry_location`; a read computes
that CRC anyway, to find the fan-out directory): an entry copied or renamed
onto another key's path no longer matches there and is never served for
that key. (XOR rather than XXH3's seed: a seed costs a secret derivation
per call, two thirds of the hash itself on 16 KiB.)

Where the record lives, in order of preference (``probe_carrier`` picks
one per cache root, at open):

* ``mtime``: the nanoseconds field of the entry's modification time *is*
  the check (modulo 10^9, about 30 bits). The writer sets it on the temp
  file before the fsync and the rename, so it is published with the bytes,
  and a reader gets it from the ``fstat`` it makes anyway: verifying an
  entry costs no system call beyond a bare read. Any write to the file
  after publication moves its mtime and so fails the check too. Needs a
  filesystem that keeps exact nanosecond timestamps (ext4, XFS, btrfs,
  tmpfs, ZFS do; Lustre, FAT and SMB mounts do not).
* ``xattr``: a 36-byte record ``MAGIC | check | length | key digest`` in
  the ``user.nexus.v2`` extended attribute, set on the temp file before the
  rename.
* ``sidecar``: the same record plus the entry's inode in ``<entry>.sum``,
  where the filesystem has neither.

XXH3 runs at memory speed (0.36 us per 16 KiB on the H200 host, against
4.8 us for zlib's CRC-32), and it catches truncations, bit rot, torn copies
and stray writes. It guards against accidents, not against an attacker: the cache
root is private (0700) for that.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import struct
import zlib

import xxhash

from nexus_cache._storage import new_temp

__all__ = [
    "FANOUT",
    "KEY_DIGEST_SIZE",
    "PLAIN_READ_FLAGS",
    "READ_FLAGS",
    "RECORD_SIZE",
    "SIDECAR_SUFFIX",
    "XATTR_NAME",
    "entry_check",
    "entry_digest",
    "entry_location",
    "entry_name",
    "entry_relpath",
    "entry_verdict",
    "is_outdated",
    "name_digest",
    "make_record",
    "make_sidecar",
    "open_entry",
    "parse_sidecar",
    "probe_carrier",
    "publish_times",
    "read_record",
    "read_rest",
    "record_matches",
]

# "user.nexus.v1" xattrs and "nxc2" sidecars (CRC-32 records) were written by
# earlier versions: never read now; verify lists such entries as outdated.
XATTR_NAME = "user.nexus.v2"
_OLD_XATTR_NAME = "user.nexus.v1"
_OLD_MAGIC = b"nxc2"
SIDECAR_SUFFIX = ".sum"
_MAGIC = b"nxc3"
_RECORD = struct.Struct("<4sQQ16s")  # magic, check, length, key digest
_SIDECAR = struct.Struct("<4sQQQ16s")  # magic, inode, check, length, key digest
KEY_DIGEST_SIZE = 16
RECORD_SIZE = _RECORD.size
_NS = 1_000_000_000
_pack, _xxh3, _crc32 = _RECORD.pack, xxhash.xxh3_64_intdigest, zlib.crc32
# O_NONBLOCK: a FIFO planted at an entry path must not hang the reader.
PLAIN_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# O_NOATIME: a read never moves the atime by itself (relatime would, on a
# fresh entry); the cache writes its own stamp (see the stamp window), and
# verify() leaves the LRU order alone.
READ_FLAGS = PLAIN_READ_FLAGS | getattr(os, "O_NOATIME", 0)
_NOT_SUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}


def entry_check(data: bytes, digest: bytes) -> int:
    """The 64-bit check of ``data`` stored as the entry named by ``digest``."""
    return _xxh3(data) ^ _crc32(digest)


# Other-length keys are hashed behind this prefix, so that no such key's name
# can equal a 32-byte key's own hex by accident (that would take a key that
# is the SHA-256 of this prefix and another key).
_NAME_DOMAIN = b"nexus-cache entry name\x00"


# entries/<subdir>/<name>: the subdir is two hex digits of a CRC-32 of the
# name's bytes, not the name's first two digits, because a 32-byte key is
# its own name and such keys need not be uniformly distributed (ASCII keys
# would all share one directory).
FANOUT = tuple(f"{i:02x}" for i in range(256))


def entry_digest(key: bytes) -> bytes:
    """The 32 bytes that name the entry of ``key``: a 32-byte key
    (``make_program_cache_key`` and cuda.core's both return a SHA-256) is
    its own name, so a read hashes nothing cryptographic to find its file;
    any other key is named by the SHA-256 of a domain prefix and the key."""
    return key if len(key) == 32 else hashlib.sha256(_NAME_DOMAIN + key).digest()


def entry_location(key: bytes) -> tuple[str, str]:
    """``(subdir, name)`` of the entry of ``key`` under ``entries/``: the
    name is :func:`entry_digest` in 64 hex digits."""
    digest = entry_digest(key)
    return FANOUT[_crc32(digest) & 255], digest.hex()


def entry_name(key: bytes) -> str:
    """The file name of the entry of ``key`` (see :func:`entry_location`)."""
    return entry_location(key)[1]


def entry_relpath(name: str) -> str:
    """``<subdir>/<name>`` of the entry named ``name``."""
    return FANOUT[_crc32(bytes.fromhex(name)) & 255] + "/" + name


def name_digest(name: str) -> bytes:
    """The 32-byte digest an entry's name (64 hex digits) spells."""
    return bytes.fromhex(name)


def publish_times(data: bytes, digest: bytes, now_ns: int) -> tuple[int, int]:
    """``(atime, mtime)`` for an entry of ``data`` written at ``now_ns``.

    The mtime carries the check: 1-2 s before ``now_ns`` (in the past, so it
    never looks like a write still to come), its nanoseconds field the check
    modulo 10^9. The atime is ``now_ns`` - 2 s: always before that mtime, so
    the entry reads as never read since its write (its first read stamps
    it), and still in write order among entries never read.
    """
    mtime = now_ns - now_ns % _NS - _NS + entry_check(data, digest) % _NS
    return now_ns - 2 * _NS, mtime


def make_record(data: bytes, digest: bytes) -> bytes:
    """The xattr record for ``data`` stored as the entry named by ``digest``."""
    return _pack(_MAGIC, entry_check(data, digest), len(data), digest[:KEY_DIGEST_SIZE])


def record_matches(record: bytes, data: bytes, digest: bytes) -> bool:
    """Whether ``record`` (as read back) vouches for exactly ``data`` as the entry ``digest``."""
    # One pack and one compare: equal exactly when magic, check, length and key all match.
    return record == make_record(data, digest)


def make_sidecar(ino: int, data: bytes, digest: bytes) -> bytes:
    check = entry_check(data, digest)
    return _SIDECAR.pack(_MAGIC, ino, check, len(data), digest[:KEY_DIGEST_SIZE])


def parse_sidecar(raw: bytes) -> tuple[int, bytes] | None:
    """``(inode, record)`` from a sidecar's bytes, or ``None`` when unreadable."""
    if len(raw) != _SIDECAR.size:
        return None
    magic, ino, check, length, kd = _SIDECAR.unpack(raw)
    if magic != _MAGIC:
        return None
    return ino, _pack(magic, check, length, kd)


def probe_carrier(tmp_dir: str) -> str:
    """Where records can live in ``tmp_dir``'s filesystem: ``"mtime"``, ``"xattr"``
    or ``"sidecar"`` (see the module docstring)."""
    fd, path = new_temp(tmp_dir, prefix="probe-")
    try:
        # Odd nanoseconds: a filesystem that rounds timestamps to any tick
        # (1 us, 100 ns, 2 s: all even) cannot keep them.
        want = (os.stat(fd).st_mtime_ns // _NS - 5) * _NS + 2 * secrets.randbelow(_NS // 2) + 1
        try:
            os.utime(fd, ns=(want, want))
        except OSError:
            pass  # no settable timestamps here: the lstat below disagrees
        os.close(fd)
        fd = -1
        if os.lstat(path).st_mtime_ns == want:
            return "mtime"
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            probe = make_record(b"", bytes(32))
            os.setxattr(fd, XATTR_NAME, probe)
            return "xattr" if os.getxattr(fd, XATTR_NAME) == probe else "sidecar"
        except OSError as exc:
            if exc.errno in _NOT_SUPPORTED:
                return "sidecar"
            raise
    finally:
        if fd >= 0:
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


def entry_verdict(
    carrier: str, fd: int, path: str, st: os.stat_result, data: bytes, digest: bytes
) -> bool | None:
    """Whether the record on ``carrier`` vouches for ``data`` read from ``fd``.

    ``False``: corrupt (a missing xattr record too: nothing vouches for the
    bytes); ``None``: unverifiable, a sidecar missing or naming another
    inode (a writer mid-publication: a plain miss).
    """
    if carrier == "mtime":
        return st.st_mtime_ns % _NS == entry_check(data, digest) % _NS
    record = read_record(fd, path, st.st_ino, carrier == "xattr")
    if record is None:
        return None
    return record_matches(record, data, digest)


def is_outdated(fd: int, path: str) -> bool:
    """Whether the entry open as ``fd`` carries a record of an earlier format."""
    try:
        os.getxattr(fd, _OLD_XATTR_NAME)
        return True
    except OSError:
        pass
    try:
        sfd = open_entry(path + SIDECAR_SUFFIX)
    except OSError:
        return False
    try:
        return os.read(sfd, 4) == _OLD_MAGIC
    finally:
        os.close(sfd)
