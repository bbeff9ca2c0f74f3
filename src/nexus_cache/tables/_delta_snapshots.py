"""Resolved Delta snapshots, reused while they are provably the table's content.

A Delta version never changes: the log is append-only, and version ``N`` is
what the commits up to ``N.json`` say. So a resolved :class:`TableSnapshot`
may be served again for the same table and version, without loading the
log, as long as that version's commit file is the same file. One listing of
``_delta_log/`` tells both the table's current version (the largest
``NNNNNNNNNNNNNNNNNNNN.json``) and the identity of a version's commit file
(size and modification time; on an object store its ETag or modification
time too): :func:`log_state`. Anything unusual is a doubt and the caller
loads the log as it would without a cache: a listing that fails, no commit
file, a checkpoint newer than every commit, a ``_commits/`` directory
(commits not yet in the log), a version whose commit file is not listed.

:class:`SnapshotCache` is a small LRU of snapshots keyed by the table's
resolved location, the identity of its storage options and the version,
each entry stamped with its commit file's identity; :data:`DELTA_SNAPSHOTS`
is the one per process. Thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nexus_cache._lru import BoundedLRU
from nexus_cache.tables.snapshot import TableSnapshot

__all__ = [
    "DELTA_SNAPSHOTS",
    "SNAPSHOT_CACHE_ENTRIES",
    "LogState",
    "SnapshotCache",
    "log_state",
    "options_identity",
]

#: how many resolved Delta snapshots one process keeps (least recently used dropped)
SNAPSHOT_CACHE_ENTRIES = 16

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.[^/]*)?\.parquet$")
# object-store listing keys that change when an object is rewritten
_ETAG_KEYS = ("ETag", "etag")
_TIME_KEYS = ("LastModified", "last_modified", "mtime", "updated", "generation", "created")

# a local file's modification time is as coarse as the kernel's clock tick (or
# the file system's, seconds on some): younger than this, its stamp holds a digest
_RACY_NS = 2_000_000_000

Stamp = tuple[Any, ...]


@dataclass(frozen=True)
class LogState:
    """What one listing of ``_delta_log/`` says: the latest version, and the
    identity of a listed commit file (:meth:`stamp`)."""

    latest: int
    _stamp: Callable[[int], Stamp | None]

    def stamp(self, version: int) -> Stamp | None:
        """The identity of commit file ``version`` (None: not listed, or gone)."""
        try:
            return self._stamp(version)
        except (OSError, ValueError):
            return None


def log_state(fs: Any, path: str) -> LogState | None:
    """The state of the log of the Delta table at ``path`` (local when ``fs`` is
    None), from one listing of ``_delta_log/``; None on any doubt."""
    log = path.rstrip("/") + "/_delta_log"
    try:
        return _local_state(log) if fs is None else _remote_state(fs, log)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _local_state(log: str) -> LogState | None:
    commits: dict[int, str] = {}
    checkpoint = -1
    with os.scandir(log) as listing:
        for entry in listing:
            if entry.name == "_commits":
                return None  # commits that are not in the log yet
            found = _COMMIT.match(entry.name)
            if found:
                commits[int(found.group(1))] = entry.path
                continue
            found = _CHECKPOINT.match(entry.name)
            if found:
                checkpoint = max(checkpoint, int(found.group(1)))
    if not commits or checkpoint > max(commits):
        return None

    def stamp(version: int) -> Stamp | None:  # one stat, of the commit a read needs
        if version not in commits:
            return None
        st = os.stat(commits[version])
        # a file modified within the clock's granularity of now could be rewritten
        # with the same size and time: its content is part of its identity then
        young = st.st_mtime_ns > time.time_ns() - _RACY_NS
        digest = _digest(commits[version]) if young else None
        return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, digest)

    return LogState(max(commits), stamp)


def _digest(name: str) -> str:
    with open(name, "rb") as handle:
        return hashlib.blake2b(handle.read()).hexdigest()


def _remote_state(fs: Any, log: str) -> LogState | None:
    fs.invalidate_cache(log)  # a listing cached by fsspec cannot be proven fresh
    entries = fs.ls(log, detail=True)
    stamps: dict[int, Stamp] = {}
    checkpoint = -1
    for info in entries:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        if name == "_commits":
            return None
        found = _COMMIT.match(name)
        if found:
            stamp = _remote_stamp(info)
            if stamp is None:
                return None  # no identity to prove the file unchanged
            stamps[int(found.group(1))] = stamp
            continue
        found = _CHECKPOINT.match(name)
        if found:
            checkpoint = max(checkpoint, int(found.group(1)))
    if not stamps or checkpoint > max(stamps):
        return None
    return LogState(max(stamps), stamps.get)


def _remote_stamp(info: Mapping[str, Any]) -> Stamp | None:
    etag = next((str(info[k]) for k in _ETAG_KEYS if info.get(k)), None)
    when = next((str(info[k]) for k in _TIME_KEYS if info.get(k)), None)
    if etag is None and when is None:
        return None
    return (int(info.get("size") or 0), etag, when)


def options_identity(options: Mapping[str, Any] | None) -> str:
    """A digest of storage options (a cache key keeps no credentials)."""
    if not options:
        return ""
    text = json.dumps(sorted((str(k), str(v)) for k, v in options.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class SnapshotCache:
    """A bounded LRU of resolved snapshots, each valid while its stamp is the same.

    ``key`` names a table version (location, options identity, version);
    :meth:`get` returns the snapshot stored under ``key`` only when it was
    stored with ``stamp`` (an entry with another stamp is dropped). Thread-safe.
    """

    def __init__(self, entries: int = SNAPSHOT_CACHE_ENTRIES) -> None:
        self.entries = entries
        self._items: BoundedLRU[tuple[Any, ...], tuple[Stamp, TableSnapshot]] = BoundedLRU(entries)
        self._counts_lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...], stamp: Stamp) -> TableSnapshot | None:
        found = self._items.get(key)
        if found is not None and found[0] != stamp:
            self._items.pop(key)  # stored for another commit file: stale
            found = None
        with self._counts_lock:
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
        return found[1]

    def put(self, key: tuple[Any, ...], stamp: Stamp, snapshot: TableSnapshot) -> None:
        self._items.put(key, (stamp, snapshot))

    def clear(self) -> None:
        self._items.clear()
        with self._counts_lock:
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


#: the process's cache of resolved Delta snapshots
DELTA_SNAPSHOTS = SnapshotCache()
