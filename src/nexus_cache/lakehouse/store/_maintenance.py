"""Retention, verification and clearing of lakehouse entries.

Retention is a best-effort LRU toward ``max_bytes``: not a reservation, not a hard
quota. Entries are ordered by access time (hits stamp it explicitly, so ``noatime``
mounts do not matter) and removed oldest first until the total fits, skipping every
entry with a live pin and every entry whose fill lock is busy. One pass runs at a
time per root (others skip). A reader that pinned an entry after the pass listed the
pins, but before it removed the file, either already holds the descriptor (its
read completes from the unlinked file) or gets :class:`StalePlanError` and plans
again: a reader never sees a torn entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from nexus_cache._storage import FileLock, lstat_key
from nexus_cache.errors import CacheSecurityError
from nexus_cache.lakehouse.identity._identity import SourceIdentity
from nexus_cache.lakehouse.store._durable import DURABLE_MODE, needs_refill
from nexus_cache.lakehouse.store._store import EntryStore, digest_matches

__all__ = [
    "EntryListing",
    "LakehouseRoot",
    "RetentionResult",
    "RootSummary",
    "VerifyResult",
    "clear_entries",
    "enforce_retention",
    "verify_entry",
    "verify_all",
]


@dataclasses.dataclass(frozen=True)
class RetentionResult:
    """What one retention pass did (``ran=False``: another pass was running).

    Parameters
    ----------
    ran : bool
        False when another pass was running.
    removed, freed_bytes : int
        Entries removed and their bytes.
    total_bytes : int
        The bytes left.
    pinned_skipped : int
        Entries kept because a reader held them.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source)
    >>> size = pathlib.Path(source).stat().st_size
    >>> from nexus_cache.lakehouse import LakehouseRoot
    >>> result = LakehouseRoot(root / "cache").prune(max_bytes=0)
    >>> result.ran, result.removed, result.freed_bytes == size, result.total_bytes
    (True, 1, True, 0)
    >>> tmp.cleanup()
    """

    ran: bool
    removed: int = 0
    freed_bytes: int = 0
    total_bytes: int = 0
    pinned_skipped: int = 0


def enforce_retention(
    store: EntryStore,
    max_bytes: int,
    *,
    protect: Iterable[str] = (),
    progress: Callable[[int], None] | None = None,
) -> RetentionResult:
    """Remove least recently used, unpinned entries until the total fits ``max_bytes``.

    ``protect`` names keys to keep regardless (e.g. an entry just filled for a
    waiting reader). Process-safe; never removes a pinned entry.
    """
    lock = FileLock(store.root / "retention.lock")
    if not lock.acquire(timeout=0):
        return RetentionResult(ran=False)
    try:
        entries = list(store.iter_entries())
        total = sum(e.size for e in entries)
        if total <= max_bytes:
            return RetentionResult(ran=True, total_bytes=total)
        pins = store.live_pins()
        keep = set(protect)
        removed = freed = skipped = 0
        for entry in sorted(entries, key=lambda e: e.atime_ns):
            if total <= max_bytes:
                break
            if progress is not None:
                progress(1)
            if entry.key in keep or pins.get(entry.key):
                skipped += 1
                continue
            if store.remove(entry.key, entry.stat):
                removed += 1
                freed += entry.size
                total -= entry.size
        return RetentionResult(True, removed, freed, total, skipped)
    finally:
        lock.release()


def verify_entry(store: EntryStore, key: str) -> str | None:
    """``None`` when ``key``'s bytes match its record, else what is wrong.

    An entry left not durable by a reboot (:mod:`._durable`) whose bytes match
    is made durable on the way.
    """
    record = store.read_record(key)
    if record is None:
        return "identity record missing or unreadable"
    try:
        identity = SourceIdentity.from_record(record["identity"])
        size = int(record["size"])
        digest = str(record["digest"])
    except (KeyError, TypeError, ValueError):
        return "identity record malformed"
    if record.get("key") != key or identity.key != key:
        return "identity record belongs to another key"
    if size != identity.content.size:
        return "record size differs from the identity's size"
    try:
        fd = store.open_data(key)
    except FileNotFoundError:
        return "data missing"
    except CacheSecurityError as exc:  # foreign owner, not a regular file: list it, go on
        return f"refused: {exc}"
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        # O_NOFOLLOW: the entry became a symbolic link since it was listed
        return f"refused: {store.data_path(key)} is a symbolic link"
    try:
        st = os.fstat(fd)
        if st.st_size != size:
            return f"size {st.st_size} != recorded {size}"
        if not digest_matches(fd, digest):
            return "content digest differs from the record"
        if needs_refill(st):
            # Its bytes are proven whole: make it durable, so reads use it again.
            os.fsync(fd)
            os.fchmod(fd, DURABLE_MODE)
    finally:
        os.close(fd)
    return None


def verify_all(
    store: EntryStore,
    *,
    remove: bool = True,
    progress: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Check every entry; remove bad ones when ``remove``. Returns ``{key: problem}``.

    An entry that cannot be opened as ours (another user's file, a non-regular
    file) is one more bad entry: listed, removed with ``remove``, and the pass
    goes on to the rest. An entry removed or replaced while the pass runs
    (retention, ``clear`` or a refill in another process) is not bad: it is
    gone. ``progress(1)`` is called once per entry checked.
    """
    bad: dict[str, str] = {}
    for entry in list(store.iter_entries()):
        if progress is not None:
            progress(1)
        problem = verify_entry(store, entry.key)
        if problem is None:
            continue
        if lstat_key(store.data_path(entry.key)) != entry.stat:
            # Not the file listed any more: its record or data went missing
            # under the check because it was removed (or refilled) meanwhile.
            continue
        bad[entry.key] = problem
        if remove:
            store.remove(entry.key, entry.stat, lock_timeout=5.0)
    for key, what in list(store.iter_irregular()):
        if progress is not None:
            progress(1)
        bad[key] = f"refused: {store.data_path(key)} is {what}"
        if remove:
            # Removes the link itself (never what it points to); a directory
            # stays and stays listed: a person has to look at it.
            with contextlib.suppress(OSError):
                store.remove(key, lock_timeout=5.0)
    return bad


def clear_entries(store: EntryStore) -> tuple[int, int]:
    """Remove every unpinned entry; returns ``(removed, pinned_kept)``."""
    pins = store.live_pins()
    removed = kept = 0
    for entry in list(store.iter_entries()):
        if pins.get(entry.key):
            kept += 1
        elif store.remove(entry.key, entry.stat, lock_timeout=5.0):
            removed += 1
    store.remove_orphan_records(older_than_s=0.0)
    return removed, kept


# -- the maintenance view of one root (the CLI's API, public for anyone) --------


@dataclasses.dataclass(frozen=True)
class EntryListing:
    """One entry as a person inspects it: key, size, last access, live pins, source URL.

    Parameters
    ----------
    key : str
        The entry's key.
    size : int
        Its size in bytes.
    atime_ns : int
        Its last access.
    pins : int
        Readers holding it now.
    location : str or None
        The URL it was filled from.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source)
    >>> size = pathlib.Path(source).stat().st_size
    >>> from nexus_cache.lakehouse import LakehouseRoot
    >>> entry = LakehouseRoot(root / "cache").entries()[0]
    >>> entry.size == size, entry.pins, entry.location.endswith("data.parquet")
    (True, 0, True)
    >>> tmp.cleanup()
    """

    key: str
    size: int
    atime_ns: int
    pins: int
    location: str | None


@dataclasses.dataclass(frozen=True)
class RootSummary:
    """Totals of one root: entries and their bytes, pinned entries, live pins, temps.

    Parameters
    ----------
    root : pathlib.Path
        The cache root.
    entries, bytes : int
        Complete entries and their bytes.
    pinned_entries, live_pins : int
        Entries that readers hold, and the pins held.
    temps : int
        Fills in progress (or left by a crash, swept at the next open).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source)
    >>> size = pathlib.Path(source).stat().st_size
    >>> from nexus_cache.lakehouse import LakehouseRoot
    >>> summary = LakehouseRoot(root / "cache").summary()
    >>> summary.entries, summary.bytes == size, summary.live_pins
    (1, True, 0)
    >>> tmp.cleanup()
    """

    root: Path
    entries: int
    bytes: int
    pinned_entries: int
    live_pins: int
    temps: int


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """``checked`` entries; ``bad`` maps each failing key to what is wrong with it.

    Parameters
    ----------
    checked : int
        Entries re-hashed.
    bad : dict of str to str
        Each failing key and what is wrong with it.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source)
    >>> size = pathlib.Path(source).stat().st_size
    >>> from nexus_cache.lakehouse import LakehouseRoot
    >>> LakehouseRoot(root / "cache").verify()
    VerifyResult(checked=1, bad={})
    >>> tmp.cleanup()
    """

    checked: int
    bad: dict[str, str]


class LakehouseRoot:
    """An existing lakehouse cache root, opened for inspection and maintenance.

    Never creates a root: opening a path that holds none raises
    ``FileNotFoundError`` naming it (``CacheSecurityError`` for a symlink or
    a directory of another user). Every method is process-safe and
    thread-safe against readers and fills running at the same time: pinned
    entries are never removed, and removals are stat-guarded like retention.

    Parameters
    ----------
    root : str or os.PathLike
        An existing cache root.

    Raises
    ------
    FileNotFoundError
        ``root`` holds no cache.
    CacheSecurityError
        ``root`` is a symlink or a directory of another user.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source)
    >>> size = pathlib.Path(source).stat().st_size
    >>> from nexus_cache.lakehouse import LakehouseRoot
    >>> store = LakehouseRoot(root / "cache")
    >>> store.summary().entries, [e.size for e in store.entries()] == [size]
    (1, True)
    >>> store.verify().bad
    {}
    >>> store.prune(max_bytes=0).removed
    1
    >>> tmp.cleanup()
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._store = EntryStore(root, create=False)

    @property
    def root(self) -> Path:
        return self._store.root

    def summary(self) -> RootSummary:
        entries = list(self._store.iter_entries())
        pins = self._store.live_pins()
        try:
            temps = len(os.listdir(self._store.tmp_dir))
        except FileNotFoundError:
            temps = 0
        return RootSummary(
            self._store.root,
            len(entries),
            sum(e.size for e in entries),
            len(pins),
            sum(pins.values()),
            temps,
        )

    def entries(self) -> list[EntryListing]:
        """Every entry, most recently used first, with its source URL from the record."""
        pins = self._store.live_pins()
        out = []
        for entry in sorted(self._store.iter_entries(), key=lambda e: e.atime_ns, reverse=True):
            record = self._store.read_record(entry.key) or {}
            identity = record.get("identity")
            location = identity.get("location") if isinstance(identity, dict) else None
            out.append(
                EntryListing(
                    entry.key,
                    entry.size,
                    entry.atime_ns,
                    pins.get(entry.key, 0),
                    location if isinstance(location, str) else None,
                )
            )
        return out

    def verify(
        self, *, remove: bool = True, progress: Callable[[int], None] | None = None
    ) -> VerifyResult:
        """Re-hash every entry against its record; remove the bad ones when ``remove``."""
        checked = 0

        def count(n: int) -> None:
            nonlocal checked
            checked += n
            if progress is not None:
                progress(n)

        bad = verify_all(self._store, remove=remove, progress=count)
        return VerifyResult(checked, bad)

    def prune(
        self, max_bytes: int, *, progress: Callable[[int], None] | None = None
    ) -> RetentionResult:
        """One retention pass toward ``max_bytes`` (least recently used, unpinned first)."""
        return enforce_retention(self._store, max_bytes, progress=progress)

    def clear(self) -> tuple[int, int]:
        """Remove every unpinned entry; returns ``(removed, pinned_kept)``."""
        return clear_entries(self._store)
