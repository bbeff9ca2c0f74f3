"""Real processes (spawn) sharing one persistent cache."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from nexus_cache.program.filestream import _scan

from . import _mp_workers as w
from ._backends import PERSISTENT, open_cache

CTX = multiprocessing.get_context("spawn")


def run_all(procs, timeout=90):
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def proc(target, *args):
    return CTX.Process(target=target, args=args)


@pytest.mark.parametrize("kind", PERSISTENT)
def test_concurrent_writers_one_key(kind, tmp_path):
    base = str(tmp_path)
    run_all([proc(w.write_one_key, kind, base, b"K", i, 40) for i in range(3)])
    with open_cache(kind, base) as c:
        final = c[b"K"]
        assert w.is_valid(final)
        assert final[4:9] == b"00039"  # some writer's last value
        assert len(c) == 1
        assert c.verify().corrupt == []
    if kind == "filestream":
        assert os.listdir(tmp_path / "fs" / "tmp") == []


@pytest.mark.parametrize("kind", PERSISTENT)
def test_concurrent_writers_distinct_keys(kind, tmp_path):
    base = str(tmp_path)
    run_all([proc(w.write_distinct, kind, base, i, 40) for i in range(3)])
    with open_cache(kind, base) as c:
        assert len(c) == 120
        for i in range(3):
            for seq in range(40):
                assert c[f"w{i}-k{seq}"] == w.make_value(i, seq)
        s = c.stats()
        assert s.entries == 120
        assert s.bytes == sum(len(w.make_value(i, q)) for i in range(3) for q in range(40))


@pytest.mark.parametrize("kind", PERSISTENT)
def test_reader_never_sees_a_torn_entry(kind, tmp_path):
    base = str(tmp_path)
    with open_cache(kind, base) as c:
        c[b"K"] = w.make_value(0, 0)
    stop = CTX.Event()
    out = str(tmp_path / "reader.json")
    reader = proc(w.read_until, kind, base, b"K", stop, out)
    reader.start()
    writers = [proc(w.write_one_key, kind, base, b"K", i, 60) for i in (1, 2)]
    run_all(writers)
    stop.set()
    reader.join(60)
    assert reader.exitcode == 0
    result = read_json(out)
    assert result["bad"] == 0
    assert result["corrupt"] == 0
    assert result["hits"] > 0


@pytest.mark.parametrize("kind", PERSISTENT)
def test_churning_evictions_racing_a_rewriter(kind, tmp_path):
    # Two churners push the cache through many eviction passes while a third
    # process keeps rewriting one key and reading it back. Under CPU pressure
    # plain LRU may legitimately evict the rewritten key between its store and
    # read, so what must hold is: no torn or wrong bytes, no corruption, the
    # cap, no leftovers, and never an older version coming back.
    base = str(tmp_path)
    cap = 40_000
    out = str(tmp_path / "rewriter.json")
    procs = [proc(w.churn, kind, base, cap, i, 120) for i in (1, 2)]
    procs.append(proc(w.rewrite_and_check, kind, base, cap, b"R", 120, out))
    run_all(procs)
    result = read_json(out)
    assert result["wrong"] == 0
    assert result["lost"] < 120
    with open_cache(kind, base) as c:
        assert c.get(b"R") in (None, w.make_value(99, 119))
        s = c.stats()
        assert s.bytes <= cap
        assert c.verify().corrupt == []
    if kind == "filestream":
        assert os.listdir(tmp_path / "fs" / "tmp") == []


def _full_cache(base):
    # old (least recently read) + mid fill 700 of 1000; storing new (400) then
    # needs one eviction pass down to 900, whose first candidate is old.
    with open_cache("filestream", base, max_size_bytes=1000) as c:
        c[b"old"] = b"o" * 400
        c[b"mid"] = b"m" * 300
        st = os.lstat(c._path_for(b"old"))
        os.utime(c._path_for(b"old"), ns=(1_000_000_000, st.st_mtime_ns))


def _race(base, action):
    reached, go = CTX.Event(), CTX.Event()
    out = os.path.join(base, "evictor.json")
    run_all(
        [
            proc(w.evict_with_pause, base, reached, go, out),
            proc(w.act_when_told, base, action, b"old", reached, go),
        ]
    )
    return read_json(out)


def test_eviction_racing_a_rewriter_spares_the_fresh_entry(tmp_path):
    # Process A's pass has scanned and picked "old"; process B rewrites "old"
    # before A unlinks it. The guard must leave B's fresh file alone, and A
    # must go on to the next candidate instead.
    base = str(tmp_path)
    _full_cache(base)
    result = _race(base, "rewrite")
    assert result == {"outcomes": ["changed", "removed"], "evictions": 1}
    with open_cache("filestream", base) as c:
        assert c.get(b"old") == b"v2" * 200  # the rewrite survived
        assert c.get(b"new") == b"n" * 400
        assert c.get(b"mid") is None
        assert os.listdir(tmp_path / "fs" / "tmp") == []


def test_over_eviction_race_across_processes(tmp_path):
    # The seed review's race: process B deletes "old" before A unlinks it. A
    # must credit those bytes and stop: "mid" (newer than old) and the fresh
    # "new" both survive, and the shared usage counter stays right.
    base = str(tmp_path)
    _full_cache(base)
    result = _race(base, "delete")
    assert result == {"outcomes": ["gone"], "evictions": 0}
    with open_cache("filestream", base) as c:
        assert c.get(b"new") == b"n" * 400
        assert c.get(b"mid") == b"m" * 300
        assert c.get(b"old") is None
        assert c._usage.read() == 700


@pytest.mark.parametrize("cap", [1 << 30, 12_000], ids=["no-eviction", "evicting"])
def test_byte_counter_stays_exact_under_rewrites_and_deletes(tmp_path, cap):
    # Processes rewriting the same keys used to count each replaced entry's
    # bytes once per writer: the counter grew far past the bytes on disk.
    base = str(tmp_path)
    open_cache("filestream", base, max_size_bytes=cap).close()
    run_all([proc(w.rewrite_and_delete, base, cap, i, 150) for i in range(4)])
    with open_cache("filestream", base, max_size_bytes=cap) as c:
        on_disk = _scan.scan(str(c.path / "entries")).total_bytes
        assert c._usage.read() == on_disk
        assert c.stats().bytes == on_disk


def test_processes_creating_one_sqlite_cache_at_once_all_succeed(tmp_path):
    # One creates the schema while the others judge the file: ours, not foreign.
    base = str(tmp_path)
    go = CTX.Event()
    procs = [proc(w.open_at_once, base, go, i) for i in range(6)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(90)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    with open_cache("sqlite", base) as c:
        assert len(c) == 6


def test_switching_to_wal_waits_out_an_immediate_database_is_locked():
    # SQLite can refuse the journal-mode switch at once, without its busy
    # handler, while another process opens the same new file.
    import sqlite3

    from nexus_cache.program._sqlite import _enable_wal

    class Conn:
        def __init__(self, refusals, error="database is locked"):
            self.refusals, self.error, self.calls = refusals, error, 0

        def execute(self, sql):
            self.calls += 1
            if self.calls <= self.refusals:
                raise sqlite3.OperationalError(self.error)

    conn = Conn(3)
    _enable_wal(conn)  # type: ignore[arg-type]
    assert conn.calls == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _enable_wal(Conn(10**6), timeout_s=0.05)  # type: ignore[arg-type]
    other = Conn(1, "disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _enable_wal(other)  # type: ignore[arg-type]
    assert other.calls == 1  # not a lock: no retry
