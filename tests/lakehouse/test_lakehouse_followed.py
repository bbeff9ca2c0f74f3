"""Concurrent cold reads of one object: one copy, one ``miss``, the others followed.

Every reader plans the object while it is absent (a miss); the one that fills
it reports ``miss``, those that waited for its fill and found the entry
report ``miss-followed``, and the counters count the copy once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from pathlib import Path

from nexus_cache.lakehouse import read_stats

from ._helpers import entry_files, make_cache, worker_plan_then_read, write_old_file

READERS = 6


def test_threads_reading_one_cold_object_one_miss_five_followed(tmp_path: Path) -> None:
    data = os.urandom(4 << 20)
    source = str(write_old_file(tmp_path / "lake" / "x.parquet", data))
    cache = make_cache(tmp_path / "c", policy="fill_before_read", blocking_fill_timeout_s=60.0)
    plans = [cache.plan(source) for _ in range(READERS)]
    assert {p.status.value for p in plans} == {"miss"}
    start = threading.Barrier(READERS)
    statuses: list[str] = []
    read: list[bytes] = []

    def read_one(plan: object) -> None:
        start.wait(timeout=30)
        with cache.execute(plan) as f:  # type: ignore[arg-type]
            read.append(f.read())
            assert f.diagnostics.read_mode.value == "local"
            statuses.append(f.diagnostics.cache_status.value)

    threads = [threading.Thread(target=read_one, args=(p,)) for p in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert read == [data] * READERS
    assert sorted(statuses) == ["miss"] + ["miss-followed"] * (READERS - 1)
    stats = cache.stats()
    assert stats["reads"]["miss"] == 1  # the copies made
    assert stats["reads"]["miss-followed"] == READERS - 1
    assert stats["events"]["fill_completed"] == 1
    assert len(entry_files(tmp_path / "c")) == 1
    cache.close()


def test_processes_reading_one_cold_object_one_miss_five_followed(tmp_path: Path) -> None:
    # the fill lock is a file lock: processes follow one another's fill too
    source = str(write_old_file(tmp_path / "lake" / "x.parquet", os.urandom(4 << 20)))
    root = tmp_path / "c"
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(READERS), ctx.Queue()
    procs = [
        ctx.Process(target=worker_plan_then_read, args=(str(root), source, barrier, results))
        for _ in range(READERS)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert {planned for planned, _, _ in out} == {"miss"}
    assert sorted(status for _, status, _ in out) == ["miss"] + ["miss-followed"] * (READERS - 1)
    assert sum(fills for *_, fills in out) == 1
    merged = read_stats(root)
    assert merged["processes"] == READERS
    assert merged["reads"]["miss"] == 1
    assert merged["reads"]["miss-followed"] == READERS - 1
