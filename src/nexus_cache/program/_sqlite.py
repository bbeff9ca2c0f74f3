"""A program cache in one SQLite database (WAL), shared by threads and processes."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from nexus_cache.errors import CacheClosedError, ConfigError
from nexus_cache.program._caps import validate_cap
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._paths import default_sqlite_path
from nexus_cache.program._report import EntryInfo, VerifyReport
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    value_to_store,
)
from nexus_cache.program._sqlite_db import (
    SCHEMA,
    SCHEMA_VERSION,
    Txn,
    check_schema,
    db_error,
    prepare_file,
)

__all__ = ["SQLiteProgramCache"]

_BUSY_TIMEOUT_S = 30.0


def _enable_wal(conn: sqlite3.Connection, timeout_s: float = _BUSY_TIMEOUT_S) -> None:
    """Switch ``conn``'s database to WAL, waiting out other openers.

    Changing the journal mode needs the database to itself, and SQLite may
    answer "database is locked" at once, without its busy handler, while
    another process opens or switches the same new file: several processes
    creating one cache at the same moment did. So this retries, backing off,
    for as long as the connection's own busy timeout.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


# Access stamps are batched: a hit does no write, and the batch is flushed
# before any store, eviction or listing, when it grows, or when it ages.
_TOUCH_BATCH = 256
_TOUCH_MAX_AGE_NS = 1_000_000_000


class _Guard:
    """The cache's lock, plus one translation: a SQLite error that says what is
    wrong with the file (not a database, damaged, foreign schema) leaves as our
    error naming the path; any other error passes unchanged."""

    __slots__ = ("_lock", "_path")

    def __init__(self, lock: threading.Lock, path: Path) -> None:
        self._lock = lock
        self._path = path

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._lock.release()
        if isinstance(exc, sqlite3.DatabaseError):
            ours = db_error(self._path, exc)
            if ours is not exc:
                raise ours from exc


class SQLiteProgramCache(ProgramCacheResource):
    """Compiled binaries as raw blobs in one SQLite database in WAL mode.

    Thread-safe: one connection behind a lock. Process-safe: writers take
    the database write lock (``BEGIN IMMEDIATE``) and wait up to 30 s for it;
    readers never block writers (WAL). A store, its byte accounting and its
    eviction happen in one transaction, so the cap is exact, eviction never
    over-evicts, and a crash rolls back cleanly. ``synchronous=NORMAL``: a
    power cut may lose the last few stores, never corrupt the database.

    LRU by last access: hits stamp entries in a batch flushed before the next
    store, eviction or listing (or after 1 s / 256 hits), so a hit itself
    never writes. Each blob carries a CRC-32 checked on read; a mismatch is
    removed, counted in ``stats().corrupt`` and reads as a miss. An entry
    larger than ``max_size_bytes`` is not stored (``stats().oversize``).
    Safe to use in a forked child (it reconnects). Operations after
    :meth:`close` raise :class:`~nexus_cache.errors.CacheClosedError` (a
    ``ValueError``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_size_bytes: int | str | None = None,
    ) -> None:
        self._max = validate_cap("max_size_bytes", max_size_bytes)
        path = Path(path).expanduser() if path is not None else default_sqlite_path()
        # Absolute now: the connection is reopened in a forked child (and after
        # close), which must not follow a changed working directory.
        self._path = path.absolute()
        prepare_file(self._path)
        self._lock = threading.Lock()
        self._guard = _Guard(self._lock, self._path)
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._closed = False
        self._touches: dict[bytes, int] = {}
        self._touch_since = 0
        self._counts = OpCounters()
        with self._guard:
            self._connection()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    # -- connection ---------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        """The live connection (caller holds ``_lock``); reconnects after a fork."""
        if self._closed:
            raise CacheClosedError(f"{self!r} is closed; open a new cache object")
        conn = self._conn
        if conn is not None and self._pid == os.getpid():
            return conn
        # A connection inherited across fork must not be used (nor closed) here.
        self._touches.clear()
        conn = sqlite3.connect(
            self._path,
            timeout=_BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            # Judge the file before changing anything in it (even the journal mode).
            self._check(conn)
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise db_error(self._path, exc) from exc
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _check(self, conn: sqlite3.Connection) -> None:
        """Refuse a newer schema or a database of someone else's (ConfigError)."""
        conn.execute("BEGIN")  # one snapshot for the version and the schema
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            self._check_version(conn, version)
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error says more
            raise
        conn.execute("COMMIT")

    def _check_version(self, conn: sqlite3.Connection, version: int) -> None:
        if version not in (0, SCHEMA_VERSION):
            raise ConfigError(
                f"{self._path} has program cache schema {version}, this version "
                f"reads {SCHEMA_VERSION}; point the cache at another path or clear it"
            )
        check_schema(conn, self._path, version)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # only effective on a new file
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                check_schema(conn, self._path, 0)
                for stmt in SCHEMA:
                    conn.execute(stmt)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _write(self, conn: sqlite3.Connection) -> Txn:
        return Txn(conn)

    # -- access stamps ------------------------------------------------------
    def _flush_touches(self, conn: sqlite3.Connection) -> None:
        """Write the batched access stamps (caller holds ``_lock``, no open transaction)."""
        if not self._touches:
            return
        batch = [(ts, k) for k, ts in self._touches.items()]
        self._touches.clear()
        with self._write(conn):
            conn.executemany(
                "UPDATE entries SET last_access = MAX(last_access, ?) WHERE key = ?", batch
            )

    # -- mapping ------------------------------------------------------------
    def __getitem__(self, key: bytes | str) -> bytes:
        kb = as_key_bytes(key)
        with self._guard:
            conn = self._connection()
            row = conn.execute("SELECT value, crc FROM entries WHERE key = ?", (kb,)).fetchone()
            if row is None:
                self._counts.miss()
                raise KeyError(key)
            value, crc = row
            if zlib.crc32(value) != crc:
                self._counts.miss(corrupt=1)
                with self._write(conn):
                    conn.execute("DELETE FROM entries WHERE key = ? AND crc = ?", (kb, crc))
                raise KeyError(key)
            self._counts.hit()
            now = time.time_ns()
            if not self._touches:
                self._touch_since = now
            self._touches[kb] = now
            if len(self._touches) >= _TOUCH_BATCH or now - self._touch_since > _TOUCH_MAX_AGE_NS:
                self._flush_touches(conn)
            return bytes(value)

    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        kb = as_key_bytes(key)
        data = value_to_store(value)
        size = len(data)
        cap = self._max
        with self._guard:
            conn = self._connection()
            self._flush_touches(conn)
            if cap is not None and size > cap:
                with self._write(conn):
                    conn.execute("DELETE FROM entries WHERE key = ?", (kb,))
                oversize = True
            else:
                oversize = False
                with self._write(conn):
                    conn.execute(
                        "INSERT INTO entries (key, value, size, crc, last_access) "
                        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                        "value = excluded.value, size = excluded.size, crc = excluded.crc, "
                        "last_access = excluded.last_access",
                        (kb, data, size, zlib.crc32(data), time.time_ns()),
                    )
                    if cap is not None:
                        self._counts.evicted(self._evict_in_txn(conn, cap, kb))
                self._counts.stored()
        if oversize:
            self._counts.skipped_oversize(self, size, cap or 0)

    def _total_bytes(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0])

    def _evict_in_txn(self, conn: sqlite3.Connection, target: int, keep: bytes | None) -> int:
        """Delete least recently used rows until at most ``target`` bytes remain.

        Runs inside the caller's write transaction, so the totals it reads are
        exact and no other writer can interleave: nothing is over-evicted.
        Finding the oldest rows is an index walk, so unlike the file-stream
        backend there is no scan to amortise and no low-water mark: a store
        evicts exactly down to the cap.
        """
        total = self._total_bytes(conn)
        if total <= target:
            return 0
        evicted = 0
        while total > target:
            if keep is None:  # every key may go, the empty key b"" included
                rows = conn.execute(
                    "SELECT key, size FROM entries ORDER BY last_access, key LIMIT 256"
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT key, size FROM entries WHERE key != ? "
                    "ORDER BY last_access, key LIMIT 256",
                    (keep,),
                ).fetchall()
            if not rows:
                break
            for k, size in rows:
                if total <= target:
                    break
                conn.execute("DELETE FROM entries WHERE key = ?", (k,))
                total -= size
                evicted += 1
        return evicted

    def prune(self, max_bytes: int) -> tuple[int, int]:
        """Evict least recently used entries until at most ``max_bytes`` remain.

        Returns ``(entries removed, bytes removed)``.
        """
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        with self._guard:
            conn = self._connection()
            self._flush_touches(conn)
            with self._write(conn):
                before = self._total_bytes(conn)
                n = self._evict_in_txn(conn, max_bytes, None)
                freed = before - self._total_bytes(conn)
            self._counts.evicted(n)
            self._vacuum(conn)
        return n, freed

    def _vacuum(self, conn: sqlite3.Connection) -> None:
        # Give freed pages back to the filesystem (auto_vacuum=INCREMENTAL).
        try:
            conn.execute("PRAGMA incremental_vacuum")
        except sqlite3.OperationalError:
            pass  # busy: another process will do it later

    def __delitem__(self, key: bytes | str) -> None:
        kb = as_key_bytes(key)
        with self._guard:
            conn = self._connection()
            self._touches.pop(kb, None)
            with self._write(conn):
                cur = conn.execute("DELETE FROM entries WHERE key = ?", (kb,))
            if cur.rowcount == 0:
                raise KeyError(key)

    def __len__(self) -> int:
        with self._guard:
            conn = self._connection()
            return int(conn.execute("SELECT entries FROM totals WHERE id = 0").fetchone()[0])

    def clear(self) -> None:
        with self._guard:
            conn = self._connection()
            self._touches.clear()
            with self._write(conn):
                conn.execute("DELETE FROM entries")
            self._vacuum(conn)

    def stats(self) -> CacheStats:
        with self._guard:
            conn = self._connection()
            entries, nbytes = conn.execute(
                "SELECT entries, bytes FROM totals WHERE id = 0"
            ).fetchone()
            return self._counts.snapshot(int(entries), int(nbytes))

    # -- administration (CLI) -----------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry, least recently used first; ``name`` is the key's hex."""
        with self._guard:
            conn = self._connection()
            self._flush_touches(conn)
            rows = conn.execute(
                "SELECT key, size, last_access FROM entries ORDER BY last_access, key"
            ).fetchall()
        for k, size, ts in rows:
            yield EntryInfo(bytes(k).hex(), int(size), int(ts), int(ts))

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every blob against its CRC-32; remove the corrupt ones.

        ``progress(1)`` is called once per entry checked (for progress bars).
        """
        report = VerifyReport()
        with self._guard:
            conn = self._connection()
            bad: list[tuple[bytes, int]] = []
            for k, value, crc, size in conn.execute(
                "SELECT key, value, crc, size FROM entries"
            ).fetchall():
                if progress is not None:
                    progress(1)
                report.checked += 1
                if zlib.crc32(value) == crc and len(value) == size:
                    report.ok += 1
                else:
                    bad.append((k, crc))
                    report.corrupt.append(bytes(k).hex())
            if bad:
                with self._write(conn):
                    conn.executemany("DELETE FROM entries WHERE key = ? AND crc = ?", bad)
                self._counts.found_corrupt(len(bad))
            ok = conn.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                report.refused.append((str(self._path), f"sqlite quick_check: {ok}"))
        return report

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            conn, self._conn = self._conn, None
            self._closed = True
            if conn is not None and self._pid == os.getpid():
                try:
                    if self._touches:
                        batch = [(ts, k) for k, ts in self._touches.items()]
                        with Txn(conn):
                            conn.executemany(
                                "UPDATE entries SET last_access = MAX(last_access, ?) "
                                "WHERE key = ?",
                                batch,
                            )
                finally:
                    self._touches.clear()
                    conn.close()

    def __repr__(self) -> str:
        return f"SQLiteProgramCache({str(self._path)!r}, max_size_bytes={self._max})"
