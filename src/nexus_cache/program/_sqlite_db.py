"""The SQLite side of :class:`SQLiteProgramCache`: file preparation, schema, transactions."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from nexus_cache._storage import check_owned_regular, ensure_private_dir
from nexus_cache.errors import CacheIntegrityError, ConfigError

__all__ = [
    "COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Txn",
    "check_schema",
    "db_error",
    "prepare_file",
]

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


#: the columns of ``entries``, in order, as ``PRAGMA table_info`` lists them
COLUMNS = ("key", "value", "size", "crc", "last_access")
_OURS = frozenset(
    {"entries", "entries_by_access", "totals", "entries_ins", "entries_del", "entries_upd"}
)


def _foreign(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"{path} is a SQLite database with a foreign schema ({what}), not a nexus-cache "
        "program cache; point SQLiteProgramCache (or NEXUS_PROGRAM_CACHE_DB) at another "
        "path. Nothing in it was changed."
    )


def check_schema(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """Refuse a database that holds tables we did not create (ConfigError).

    At version 0 our own objects may already be there (another process
    created them and set the version just after our read), so only objects
    that are not ours, or an ``entries`` table of another shape, are foreign.
    """
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    names = {n for n in names if not n.startswith("sqlite_")}
    if version == 0 and names - _OURS:
        raise _foreign(path, f"tables {', '.join(sorted(names - _OURS))}")
    if version == 0 and "entries" not in names:
        return  # empty: ours to create
    columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(entries)"))
    if columns != COLUMNS or (version != 0 and "totals" not in names):
        raise _foreign(path, f"entries columns {columns!r}")


def db_error(path: Path, exc: sqlite3.DatabaseError) -> Exception:
    """Our error for a SQLite failure that says what is wrong with the file at ``path``."""
    text = str(exc)
    if "file is not a database" in text:
        return ConfigError(
            f"{path} is not a SQLite database ({text}); point SQLiteProgramCache (or "
            "NEXUS_PROGRAM_CACHE_DB) at another path, or remove the file"
        )
    if "malformed" in text or "corrupt" in text:
        return CacheIntegrityError(
            f"program cache database {path} is damaged ({text}), e.g. truncated; remove "
            "it (and its -wal and -shm files): the cache starts empty and refills"
        )
    if "no such table" in text or "no such column" in text:
        return _foreign(path, text)
    return exc


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
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        # Not "remove it" (check_owned_regular's advice for a cache's own
        # files): this is the user's path, likely another cache's directory.
        raise IsADirectoryError(
            f"{path} is a directory, not a SQLite program cache database; point "
            "SQLiteProgramCache (or NEXUS_PROGRAM_CACHE_DB, or --path with --backend sqlite) "
            "at a database file",
        )
    check_owned_regular(path, st)
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
