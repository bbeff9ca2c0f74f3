"""SQLite backend: WAL, file safety, integrity, batched LRU stamps, schema guard."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from nexus_cache.errors import (
    CacheClosedError,
    CacheIntegrityError,
    CacheSecurityError,
    ConfigError,
)
from nexus_cache.program import SQLiteProgramCache

OTHER_UID = 54321


@pytest.fixture
def db(tmp_path):
    return tmp_path / "sub" / "cache.sqlite"


def raw(db):
    return sqlite3.connect(db, isolation_level=None)


def test_wal_mode_private_file_raw_blobs(db):
    with SQLiteProgramCache(db) as c:
        c[b"k"] = b"\x7fELF raw"
    assert stat.S_IMODE(os.lstat(db).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(db.parent).st_mode) == 0o700
    conn = raw(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT value FROM entries").fetchone()[0] == b"\x7fELF raw"
    conn.close()


def test_default_path(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with SQLiteProgramCache() as c:
        assert c.path == tmp_path / "xdg" / "nexus-cache" / "program-cache.sqlite"
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DB", str(tmp_path / "x.db"))
    with SQLiteProgramCache() as c:
        assert c.path == tmp_path / "x.db"


def test_corrupt_blob_is_detected_counted_removed(db):
    c = SQLiteProgramCache(db)
    c[b"k"] = b"A" * 1000
    c[b"ok"] = b"fine"
    conn = raw(db)
    conn.execute("UPDATE entries SET value = ? WHERE key = ?", (b"A" * 999 + b"B", b"k"))
    conn.close()
    assert c.get(b"k") is None
    s = c.stats()
    assert (s.corrupt, s.misses, s.entries, s.bytes) == (1, 1, 1, 4)
    assert c[b"ok"] == b"fine"
    c.close()


def test_verify_reports_and_removes(db):
    c = SQLiteProgramCache(db)
    c.update({b"a": b"1" * 10, b"b": b"2" * 10})
    conn = raw(db)
    conn.execute("UPDATE entries SET value = ? WHERE key = ?", (b"3" * 10, b"b"))
    conn.close()
    report = c.verify()
    assert (report.checked, report.ok, report.corrupt) == (2, 1, [b"b".hex()])
    assert len(c) == 1
    assert c.verify().corrupt == []
    c.close()


def test_hits_write_nothing_until_flushed(db):
    c = SQLiteProgramCache(db)
    c[b"a"] = b"1"
    (stamp,) = raw(db).execute("SELECT last_access FROM entries").fetchone()
    c[b"a"]
    assert raw(db).execute("SELECT last_access FROM entries").fetchone()[0] == stamp
    c.close()  # flushes the batch
    assert raw(db).execute("SELECT last_access FROM entries").fetchone()[0] > stamp


def test_lru_by_last_access_across_processes_view(db):
    c = SQLiteProgramCache(db, max_size_bytes=350)
    for k in (b"a", b"b", b"c"):
        c[k] = k * 100
    c[b"a"]
    other = SQLiteProgramCache(db, max_size_bytes=350)
    other[b"d"] = b"d" * 100  # c's pending stamp is not visible to it yet...
    assert other.get(b"a") is None  # ...so it evicts by what the database says
    c.close()
    other.close()


def test_cap_is_exact(db):
    c = SQLiteProgramCache(db, max_size_bytes=1000)
    for i in range(30):
        c[f"k{i}"] = bytes([i]) * 70
        assert c.stats().bytes <= 1000
    assert len(c) == 14
    assert c.stats().evictions == 16
    c.close()


def test_prune(db):
    c = SQLiteProgramCache(db)
    for k in (b"a", b"b", b"c"):
        c[k] = k * 100
    c[b"a"]
    assert c.prune(150) == (2, 200)
    assert c.get(b"a") == b"a" * 100
    with pytest.raises(ConfigError):
        c.prune(-1)
    c.close()


def test_closed_cache_says_so(db):
    c = SQLiteProgramCache(db)
    c.close()
    with pytest.raises(CacheClosedError, match="closed"):
        c[b"k"] = b"v"
    with pytest.raises(CacheClosedError, match="closed"):
        c.get(b"k")
    assert issubclass(CacheClosedError, ValueError)  # callers catching ValueError still do


def test_symlinked_db_refused(tmp_path):
    real = tmp_path / "real.sqlite"
    SQLiteProgramCache(real).close()
    (tmp_path / "link.sqlite").symlink_to(real)
    with pytest.raises(CacheSecurityError, match="symbolic link"):
        SQLiteProgramCache(tmp_path / "link.sqlite")


def test_foreign_db_refused(db):
    SQLiteProgramCache(db).close()
    os.chown(db, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheSecurityError, match="owned by uid"):
        SQLiteProgramCache(db)


def test_unwritable_location_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="file/sub"):
        SQLiteProgramCache(blocker / "sub" / "c.sqlite")


def test_future_schema_refused(db):
    SQLiteProgramCache(db).close()
    conn = raw(db)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(ConfigError, match="schema 99"):
        SQLiteProgramCache(db)


def test_totals_follow_out_of_band_edits(db):
    c = SQLiteProgramCache(db)
    c.update({b"a": b"1" * 10, b"b": b"2" * 20})
    conn = raw(db)
    conn.execute("DELETE FROM entries WHERE key = ?", (b"a",))
    conn.close()
    assert (len(c), c.stats().bytes) == (1, 20)
    c.close()


@pytest.mark.parametrize("empty", [b"", ""])
def test_prune_zero_removes_the_empty_key_too(db, empty):
    c = SQLiteProgramCache(db)
    c[empty] = b"v" * 10
    c[b"x"] = b"w" * 10
    assert c.prune(0) == (2, 20)
    assert len(c) == 0
    assert c.get(empty) is None
    c.close()


def test_a_file_that_is_not_a_database_is_named(db):
    db.parent.mkdir(mode=0o700)
    db.write_bytes(b"these are not the pages you are looking for" * 100)
    with pytest.raises(ConfigError, match=f"{db} is not a SQLite database"):
        SQLiteProgramCache(db)


@pytest.mark.parametrize("cut", [100, 4096, 50_000])
def test_a_truncated_database_is_named(db, cut):
    with SQLiteProgramCache(db) as c:
        for i in range(100):
            c[b"k%d" % i] = os.urandom(3000)
    data = db.read_bytes()
    db.write_bytes(data[:cut])

    def use() -> None:
        c = SQLiteProgramCache(db)
        c.get(b"k99")
        c.stats()

    with pytest.raises(CacheIntegrityError, match=f"{db} is damaged.*remove it"):
        use()


def test_foreign_schemas_are_refused_and_left_alone(tmp_path):
    cases = {
        "other-tables": ["CREATE TABLE users (name, email)"],
        "entries-of-another-shape": ["CREATE TABLE entries (a, b)"],
        "our-version-their-tables": ["CREATE TABLE x (a)", "PRAGMA user_version=1"],
    }
    for name, statements in cases.items():
        path = tmp_path / f"{name}.sqlite"
        conn = raw(path)
        for stmt in statements:
            conn.execute(stmt)
        conn.close()
        before = path.read_bytes()
        with pytest.raises(
            ConfigError, match=f"{path} is a SQLite database with a foreign schema"
        ):
            SQLiteProgramCache(path)
        assert path.read_bytes() == before, name


def test_our_own_tables_before_the_version_is_set_are_not_foreign(db):
    # What a process opening the file sees while another has just created the
    # schema: our tables, version not yet read as set. That is ours, not foreign.
    from nexus_cache.program._sqlite_db import SCHEMA

    db.parent.mkdir(mode=0o700)
    conn = raw(db)
    for stmt in SCHEMA:
        conn.execute(stmt)
    conn.close()
    with SQLiteProgramCache(db) as c:
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
