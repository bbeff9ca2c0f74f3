"""The SQLite side of :class:`SQLiteProgramCache`: file preparation, schema, transactions."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from nexus_cache._storage import check_owned_regular, ensure_private_dir

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Txn", "prepare_file"]

SCHEMA_VERSION = 1

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        key BLOB PRIMARY KEY,
        value BLOB NOT NULL,
        size INTEGER NOT NULL,
        crc INTEGER NOT NULL,
        last_access INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS entries_by_access ON entries (last_access)",
    """CREATE TABLE IF NOT EXISTS totals (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        entries INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO totals VALUES (0, 0, 0)",
    # Triggers keep the totals exact whoever edits the table.
    """CREATE TRIGGER IF NOT EXISTS entries_ins AFTER INSERT ON entries BEGIN
        UPDATE totals SET entries = entries + 1, bytes = bytes + NEW.size WHERE id = 0;
    END""",
    """CREATE TRIGGER IF NOT EXISTS entries_del AFTER DELETE ON entries BEGIN
        UPDATE totals SET entries = entries - 1, bytes = bytes - OLD.size WHERE id = 0;
    END""",
    """CREATE TRIGGER IF NOT EXISTS entries_upd AFTER UPDATE OF size ON entries BEGIN
        UPDATE totals SET bytes = bytes - OLD.size + NEW.size WHERE id = 0;
    END""",
)


def prepare_file(path: Path) -> None:
    """Create the database file 0600 (parents 0700), or check the existing one."""
    parent = path.parent
    if not parent.exists():
        ensure_private_dir(parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise type(exc)(
            exc.errno, f"cannot create program cache database {path}: {exc.strerror}"
        ) from exc
    check_owned_regular(path, os.lstat(path))
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        try:
            st = os.lstat(side)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
            check_owned_regular(side, st)


class Txn:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._conn.execute("COMMIT")
        else:
            self._conn.execute("ROLLBACK")
