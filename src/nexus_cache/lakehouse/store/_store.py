"""Entries of the lakehouse cache on disk.

Layout under the root (every directory 0700, every file 0600 except entry data
waiting to be made durable, 0700; all owned by us)::

    layout.json                  {"format": "nexus-lakehouse", "version": 1}
    entries/<k2>/<key>           the object's bytes, published once by rename/link
    entries/<k2>/<key>.json      identity record (JSON), written before the data
    pins/<key>.<pin-id>.pin      reader pins (see :mod:`._pins`)
    locks/<k3>.lock              fill/removal locks, striped by key prefix
    tmp/                         fill temps; stale ones are swept at open
    retention.lock               one retention pass at a time
    stats/<host>-<pid>-<n>.json  read summaries of processes (see :mod:`.._readlog`)

``<key>`` is the 64-hex SHA-256 entry key; ``<k2>``/``<k3>`` its first 2/3 digits.
Lock files are striped (4096 at most) and never deleted, because deleting a lock
file that another process has open splits the lock in two.

An entry is *present* when its data file exists with the identity's size and is
not a leftover of an earlier boot that never became durable (mode ``0700`` with
bytes written before this boot; see :mod:`._durable`). The record exists whenever
the data does (it is written first); it carries the identity, the size and an
XXH3-128 digest of the bytes taken during the fill, which ``verify`` checks.
Guarantees: process-safe and thread-safe; a crash at any instant leaves no
visible partial entry (only temps, swept later, or an orphan record without
data, which is not an entry and is removed by retention); a power cut leaves
no torn entry that is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import xxhash

from nexus_cache._storage import (
    FileLock,
    StatKey,
    UnlinkResult,
    atomic_write,
    check_owned_regular,
    ensure_private_dir,
    lstat_key,
    read_regular,
    stat_key,
    sweep_stale_temps,
    touch_if_unchanged,
    unlink_if_unchanged,
)
from nexus_cache.errors import CacheIntegrityError, StalePlanError
from nexus_cache.lakehouse.identity._identity import SourceIdentity
from nexus_cache.lakehouse.store._durable import needs_refill
from nexus_cache.lakehouse.store._pins import Pin, create_pin, live_pins

__all__ = [
    "DIGEST_ALGORITHM",
    "EntryInfo",
    "EntryState",
    "EntryStore",
    "OpenEntry",
    "RECORD_VERSION",
    "digest_matches",
    "format_digest",
    "new_hasher",
]

RECORD_VERSION = 1
_LAYOUT = {"format": "nexus-lakehouse", "version": 1}
_KEY_RE = re.compile(r"[0-9a-f]{64}\Z")
_CHUNK = 8 * 1024 * 1024


class EntryState(enum.Enum):
    PRESENT = "present"
    ABSENT = "absent"
    #: a data file exists with the wrong size (truncated or overwritten)
    DAMAGED = "damaged"
    #: published before the current boot and never made durable: maybe torn
    NOT_DURABLE = "not_durable"

    @property
    def must_refill(self) -> bool:
        """The data file exists but must be removed and filled again, never read."""
        return self in (EntryState.DAMAGED, EntryState.NOT_DURABLE)


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One entry as found on disk."""

    key: str
    path: Path
    stat: StatKey
    atime_ns: int

    @property
    def size(self) -> int:
        return self.stat.size


# The record's digest guards against bit rot and torn copies (verify checks
# it), not against an attacker (the root is private): a fast checksum. XXH3-128
# runs at memory speed, about eight times SHA-256 here, so a fill's hash costs
# a few milliseconds per 32 MiB instead of most of a cold read's overhead.
# Records of earlier versions carry SHA-256 and are still verified by it.
DIGEST_ALGORITHM = "xxh3_128"
_HASHERS: dict[str, Callable[[], Any]] = {
    "xxh3_128": xxhash.xxh3_128,
    "sha256": hashlib.sha256,
}


@dataclasses.dataclass(frozen=True)
class OpenEntry:
    """An entry opened for one read: its descriptor, the pin that keeps retention
    away while it is read, and its path. Whoever holds it closes both."""

    fd: int
    pin: Pin
    path: str

    def close(self) -> None:
        try:
            os.close(self.fd)
        finally:
            self.pin.release()


def new_hasher() -> Any:
    """A hasher of :data:`DIGEST_ALGORITHM` (``update``, ``hexdigest``)."""
    return _HASHERS[DIGEST_ALGORITHM]()


def format_digest(hasher: Any, algorithm: str = DIGEST_ALGORITHM) -> str:
    """The record's spelling of a digest: ``<algorithm>:<hex>``."""
    return f"{algorithm}:{hasher.hexdigest()}"


def _file_digest(fd: int, algorithm: str = DIGEST_ALGORITHM) -> str:
    """``<algorithm>:<hex>`` of everything readable from ``fd`` (from offset 0)."""
    hasher = _HASHERS[algorithm]()
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
    return format_digest(hasher, algorithm)


def digest_matches(fd: int, recorded: str) -> bool:
    """Whether the bytes of ``fd`` have the digest ``recorded`` (``<algorithm>:<hex>``);
    ``False`` for an algorithm this version does not know."""
    algorithm = recorded.partition(":")[0]
    return algorithm in _HASHERS and _file_digest(fd, algorithm) == recorded


#: what a root holds before its layout.json is written (another opener racing us)
_OWN_NAMES = frozenset({"entries", "pins", "locks", "tmp", "stats", "retention.lock"})


def _refuse_foreign_contents(root: Path) -> None:
    """Refuse to turn a directory that already holds something else into a root.

    Without this, a root pointed at a program cache (or a home directory)
    was adopted: its files were listed, pruned and cleared as entries, and
    the other cache removed ours as corrupt. A new root is empty, or holds
    only the directories a concurrent opener made before its ``layout.json``.
    """
    try:
        names = set(os.listdir(root))
    except FileNotFoundError:
        return
    if "layout.json" in names:
        return  # a concurrent opener finished initialising it: the layout check decides
    foreign = sorted(names - _OWN_NAMES)
    entries = root / "entries"
    if not foreign and entries.is_dir():
        with os.scandir(entries) as shards:
            for shard in shards:
                if shard.is_dir(follow_symlinks=False) and os.listdir(shard.path):
                    foreign = [f"entries/{shard.name}/..."]
                    break
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise CacheIntegrityError(
            f"{root} is not empty and holds no lakehouse layout.json ({shown}); it is not "
            "a lakehouse cache root. Point NEXUS_LAKEHOUSE_CACHE_ROOT at a new or empty "
            "directory"
        )


class EntryStore:
    """The entries under one cache root. Thread-safe and process-safe."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        """Open (``create``: and initialise) the cache at ``root``.

        With ``create=False`` the root must already hold a lakehouse cache.
        """
        self.root = ensure_private_dir(root, create=create)
        if not create and not (self.root / "layout.json").exists():
            raise FileNotFoundError(
                errno.ENOENT,
                f"{self.root} is not a lakehouse cache root (no layout.json); check the path",
            )
        if not (self.root / "layout.json").exists():
            _refuse_foreign_contents(self.root)
        self.entries_dir = self.root / "entries"
        self.pins_dir = self.root / "pins"
        self.locks_dir = self.root / "locks"
        self.tmp_dir = self.root / "tmp"
        self._entries = os.fspath(self.entries_dir)  # hit paths join strings, not Paths
        self._make_layout()

    def _make_layout(self) -> None:
        for directory in (self.entries_dir, self.pins_dir, self.locks_dir, self.tmp_dir):
            ensure_private_dir(directory)
        self._check_layout()

    def restore(self) -> bool:
        """Recreate the root's layout if it was removed while in use; ``True`` when
        something was missing (and is back now).

        A root removed under a running process (``rm -rf`` of the cache
        directory) leaves every later lock, temp and pin without a directory.
        The layout is made again exactly as a new root's is (private
        directories, ``layout.json``), so later fills work; entries are not
        brought back. A root replaced by something else (a file, a foreign
        directory) is refused as at open. Process-safe: concurrent restorers
        race as concurrent openers do.
        """
        if (
            all(
                d.is_dir() for d in (self.entries_dir, self.pins_dir, self.locks_dir, self.tmp_dir)
            )
            and (self.root / "layout.json").exists()
        ):
            return False
        ensure_private_dir(self.root)
        if not (self.root / "layout.json").exists():
            _refuse_foreign_contents(self.root)
        self._make_layout()
        return True

    def _check_layout(self) -> None:
        marker = self.root / "layout.json"
        try:
            found = json.loads(read_regular(marker).decode("utf-8"))
        except FileNotFoundError:
            atomic_write(marker, json.dumps(_LAYOUT).encode(), tmp_dir=self.tmp_dir)
            return
        except (OSError, ValueError, RecursionError) as exc:  # Recursion: deep nesting
            raise CacheIntegrityError(
                f"{marker} is unreadable ({exc}); remove it if {self.root} is a lakehouse cache"
            ) from exc
        if found != _LAYOUT:
            raise CacheIntegrityError(
                f"{self.root} holds cache layout {found!r}, not {_LAYOUT!r}; "
                "point NEXUS_LAKEHOUSE_CACHE_ROOT at another directory or clear this one"
            )

    # -- paths ---------------------------------------------------------------
    def data_path(self, key: str) -> Path:
        return self.entries_dir / key[:2] / key

    def _data(self, key: str) -> str:
        return f"{self._entries}/{key[:2]}/{key}"

    def record_path(self, key: str) -> Path:
        return self.entries_dir / key[:2] / f"{key}.json"

    def lock(self, key: str) -> FileLock:
        """A fresh (unheld) lock object guarding fills and removals of ``key``."""
        return FileLock(self.locks_dir / f"{key[:3]}.lock")

    # -- lookup --------------------------------------------------------------
    def lookup(self, key: str, size: int) -> tuple[EntryState, StatKey | None]:
        """Whether ``key`` is present with ``size`` bytes and may be read (one ``lstat``).

        An entry whose durability was cut off by a reboot is ``NOT_DURABLE``
        (see :mod:`._durable`).
        """
        try:
            st = os.lstat(self._data(key))
        except (FileNotFoundError, NotADirectoryError):
            # NotADirectoryError: the root (or its entries/) was replaced by a
            # file; no entry is there, and the fill says why (Filler)
            return EntryState.ABSENT, None
        found = stat_key(st)
        if found.size != size:
            return EntryState.DAMAGED, found
        if needs_refill(st):
            return EntryState.NOT_DURABLE, found
        return EntryState.PRESENT, found

    def lookup_tidy(self, key: str, size: int) -> tuple[EntryState, str | None]:
        """:meth:`lookup`, removing on the way an entry that must be filled again
        (damaged, or not made durable before a reboot) unless a fill holds its
        lock: ``(state, why it was removed, or None)``."""
        state, found = self.lookup(key, size)
        if not (state.must_refill and found and self.remove(key, found)):
            return state, None
        if state is EntryState.DAMAGED:
            return state, f"size {found.size} != {size}"
        return state, "not made durable before a reboot"

    def open_data(self, key: str) -> int:
        """Open the entry's data read-only; ``FileNotFoundError`` when absent."""
        try:
            # O_NONBLOCK: a FIFO in the entry's place (the lstat size of a FIFO
            # is that of an empty object) is opened at once and refused below,
            # not waited on; it changes nothing for a regular file
            fd = os.open(
                self._data(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            )
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            # A symbolic link in place of the data: refuse it like any entry
            # that is not ours (the read goes remote), instead of failing the read.
            check_owned_regular(self.data_path(key), os.lstat(self.data_path(key)))
            raise
        try:
            check_owned_regular(self._data(key), os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_entry(self, key: str, size: int, source: str, *, pin: Pin | None = None) -> OpenEntry:
        """Open ``key``'s entry to read it as planned: pinned (by ``pin``, or a new
        pin), opened, checked to hold ``size`` bytes, and stamped for LRU.

        Raises :class:`StalePlanError` (naming ``source``) when the entry
        vanished or has another size since it was planned, and
        :class:`~nexus_cache.errors.CacheSecurityError` for an entry that is
        not ours; either way the pin is released.
        """
        pin = pin or self.pin(key)
        try:
            try:
                fd = self.open_data(key)
            except FileNotFoundError:
                raise StalePlanError(
                    f"the cache entry of {source} vanished after planning; plan again"
                ) from None
            try:
                st = os.fstat(fd)
                if st.st_size != size:
                    raise StalePlanError(
                        f"the cache entry of {source} has {st.st_size} bytes, "
                        f"planned {size}; plan again"
                    )
                touch_if_unchanged(fd, stat_key(st))  # LRU stamp
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            pin.release()
            raise
        return OpenEntry(fd, pin, self._data(key))

    # -- records -------------------------------------------------------------
    @staticmethod
    def make_record(identity: SourceIdentity, size: int, digest: str) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "key": identity.key,
            "identity": identity.to_record(),
            "size": size,
            "digest": digest,
            "filled_by_pid": os.getpid(),
        }

    def write_record(self, key: str, record: dict[str, Any], *, fsync: bool = True) -> None:
        """Publish ``key``'s record; ``fsync=False`` leaves that to :mod:`._durable`."""
        data = json.dumps(record, sort_keys=True).encode("utf-8")
        atomic_write(self.record_path(key), data, tmp_dir=self.tmp_dir, fsync=fsync)

    def read_record(self, key: str) -> dict[str, Any] | None:
        """The entry's identity record, or ``None`` when missing or not valid JSON."""
        try:
            record = json.loads(read_regular(self.record_path(key)))
        # OSError: missing, or a FIFO, socket or device in its place (refused
        # unread); ValueError covers UnicodeDecodeError
        except (OSError, ValueError, RecursionError):
            return None
        return record if isinstance(record, dict) else None

    # -- pins ----------------------------------------------------------------
    def pin(self, key: str) -> Pin:
        try:
            return create_pin(self.pins_dir, key)
        except NotADirectoryError:
            # The root (or its pins/) was replaced by a file: no entry is there to
            # protect, and the fill that follows says why it cannot run (Filler).
            return Pin(key, None)

    def live_pins(self) -> dict[str, int]:
        """Live pins per key; pins of dead processes are reclaimed on the way."""
        return live_pins(self.pins_dir)

    # -- listing -------------------------------------------------------------
    def _scan_names(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        """``(dir entry, lstat)`` of every entry-named path under ``entries/``.

        Shards and files that vanish mid-scan (a concurrent prune) are skipped.
        """
        with contextlib.suppress(FileNotFoundError), os.scandir(self.entries_dir) as shards:
            for shard in shards:
                if not shard.is_dir(follow_symlinks=False):
                    continue
                try:
                    files = list(os.scandir(shard.path))
                except FileNotFoundError:
                    continue
                for entry in files:
                    if not _KEY_RE.match(entry.name):
                        continue
                    try:
                        yield entry, entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every data file under ``entries/`` (records and strays skipped)."""
        for entry, st in self._scan_names():
            if stat.S_ISREG(st.st_mode):
                yield EntryInfo(
                    entry.name,
                    Path(entry.path),
                    StatKey(st.st_ino, st.st_size, st.st_mtime_ns),
                    st.st_atime_ns,
                )

    def iter_irregular(self) -> Iterator[tuple[str, str]]:
        """``(key, what)`` for every entry name that is not a regular file.

        A symbolic link, a directory or a device node where an entry's data
        should be is never read (reads refuse it); :meth:`iter_entries` skips
        them, and maintenance lists them through this.
        """
        for entry, st in self._scan_names():
            if stat.S_ISLNK(st.st_mode):
                yield entry.name, "a symbolic link"
            elif not stat.S_ISREG(st.st_mode):
                yield entry.name, "not a regular file"

    def total_bytes(self) -> int:
        return sum(e.size for e in self.iter_entries())

    # -- removal -------------------------------------------------------------
    def remove(
        self, key: str, expected: StatKey | None = None, *, lock_timeout: float | None = 0.0
    ) -> bool:
        """Remove ``key``'s data (only if still ``expected``) and then its record.

        Takes the entry lock (``lock_timeout``; ``0`` = skip when a fill holds it),
        so a removal never splits a record from the data a concurrent fill
        publishes. Returns whether the data is gone afterwards.
        """
        lock = self.lock(key)
        if not lock.acquire(timeout=lock_timeout):
            return False
        try:
            return self.remove_locked(key, expected)
        finally:
            lock.release()

    def remove_locked(self, key: str, expected: StatKey | None) -> bool:
        """:meth:`remove` for a caller that already holds ``self.lock(key)``."""
        data = self.data_path(key)
        current = lstat_key(data)
        if current is not None:
            if expected is not None and current != expected:
                return False
            result = unlink_if_unchanged(data, current, aside_dir=self.tmp_dir)
            if result is UnlinkResult.CHANGED:
                return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.record_path(key))
        return True

    def sweep(self, *, older_than_s: float = 3600.0) -> int:
        """Remove temps left by crashed or long-dead fills; returns the count."""
        return sweep_stale_temps(self.tmp_dir, older_than_s=older_than_s)

    def remove_orphan_records(self, *, older_than_s: float = 600.0) -> int:
        """Remove records whose data never got published (a fill crashed between)."""
        cutoff = time.time() - older_than_s
        removed = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.entries_dir) as shards:
            for shard in shards:
                if not shard.is_dir(follow_symlinks=False):
                    continue
                for entry in list(os.scandir(shard.path)):
                    name = entry.name
                    if not name.endswith(".json") or not _KEY_RE.match(name[:-5]):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                            continue
                        if lstat_key(self.data_path(name[:-5])) is None:
                            removed += int(self.remove(name[:-5]))
        return removed
