"""Real processes (spawn): single fill under contention, SIGKILL mid-fill, dead pins."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.lakehouse.store._pins import live_pins

from ._helpers import (
    entry_files,
    make_cache,
    put_object,
    worker_hold_pin,
    worker_open_roots,
    worker_read,
    worker_slow_fill,
    write_old_file,
)

CTX = mp.get_context("spawn")


def _run_at_once(target: Any, args: tuple[Any, ...], n: int) -> list[Any]:
    """Run ``target(*args, barrier, results)`` in ``n`` spawned processes; what each put."""
    barrier = CTX.Barrier(n)
    results = CTX.Queue()
    procs = [CTX.Process(target=target, args=(*args, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out


def _run_readers(root: Path, source: str, endpoint: str | None, n: int) -> list[tuple]:
    return _run_at_once(worker_read, (str(root), source, endpoint), n)


def test_many_processes_one_s3_object_one_fill(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    data = os.urandom(6 * 1024 * 1024)
    put_object(s3_endpoint, s3_bucket, "big.parquet", data)
    root = tmp_path / "c"
    out = _run_readers(root, f"s3://{s3_bucket}/big.parquet", s3_endpoint, n=5)
    expected = hashlib.sha256(data).hexdigest()
    assert [digest for _, digest, _, _ in out] == [expected] * 5
    assert sum(fills for *_, fills in out) == 1  # exactly one process filled
    assert all(diag["read_mode"] == "local" for _, _, diag, _ in out)
    (entry,) = entry_files(root)
    assert entry.read_bytes() == data


def test_many_processes_one_local_object_one_fill(tmp_path: Path) -> None:
    data = os.urandom(4 * 1024 * 1024)
    source = write_old_file(tmp_path / "remote" / "x.parquet", data)
    out = _run_readers(tmp_path / "c", str(source), None, n=4)
    assert {digest for _, digest, _, _ in out} == {hashlib.sha256(data).hexdigest()}
    assert sum(fills for *_, fills in out) == 1


def test_processes_creating_one_root_at_once_all_open_it(tmp_path: Path) -> None:
    # A process that found no layout.json, then listed the root after another
    # had written it, took the new root for a foreign directory.
    roots = [str(tmp_path / f"c{i}") for i in range(60)]
    failures = _run_at_once(worker_open_roots, (roots,), n=4)
    assert failures == [[]] * 4


def test_a_root_another_opener_just_initialised_is_not_foreign(tmp_path: Path) -> None:
    from nexus_cache.lakehouse.store import _store

    root = tmp_path / "c"
    make_cache(root, policy="fill_before_read").close()  # as a racing opener leaves it
    _store._refuse_foreign_contents(root)  # listed after its layout.json landed: no error


@pytest.mark.parametrize("seed", range(5))
def test_sigkill_during_fill_leaves_no_partial_entry(tmp_path: Path, seed: int) -> None:
    data = os.urandom(2 * 1024 * 1024)  # 32 slow chunks: about 0.1 s of fill
    source = str(write_old_file(tmp_path / "remote" / "x.parquet", data))
    root = tmp_path / "c"
    started = CTX.Event()
    proc = CTX.Process(target=worker_slow_fill, args=(str(root), source, started))
    proc.start()
    assert started.wait(timeout=60)
    # seed 0 kills at once (mid-fill for sure); the others at random points
    time.sleep(0.0 if seed == 0 else random.Random(seed).uniform(0.0, 0.15))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    entries = entry_files(root)
    temps = list((root / "tmp").iterdir())
    if seed == 0:
        assert temps  # the fill really was cut off
        assert entries == []
    # no visible partial entry: either nothing, or the whole object
    for entry in entries:
        assert entry.read_bytes() == data
    # the next open sweeps what the dead filler left
    with make_cache(root, policy="fill_before_read") as cache:
        assert list((root / "tmp").iterdir()) == []
        with cache.open(source) as f:
            assert f.read() == data
            assert f.diagnostics.read_mode.value == "local"
        assert cache.verify() == {}


def test_dead_readers_pin_is_reclaimed(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    source = str(write_old_file(tmp_path / "x.parquet", data))
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        cache.prefetch(source)
    pinned = CTX.Event()
    proc = CTX.Process(target=worker_hold_pin, args=(str(root), source, pinned))
    proc.start()
    assert pinned.wait(timeout=60)
    cache = make_cache(root, max_bytes=1)
    assert cache.prune().removed == 0  # the live reader's pin protects the entry
    assert len(entry_files(root)) == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert len(list((root / "pins").iterdir())) == 1  # the crash left the pin behind
    result = cache.prune()
    assert result.removed == 1
    assert list((root / "pins").iterdir()) == []  # reclaimed
    assert entry_files(root) == []


def test_pin_of_reused_pid_is_reclaimed(tmp_path: Path) -> None:
    """A pin naming a live pid with another start time belongs to a dead process."""
    from nexus_cache._storage._names import host_tag

    pins = tmp_path / "pins"
    pins.mkdir()
    key = "ab" * 32
    (pins / f"{key}.{host_tag()}-{os.getpid()}-1-00.pin").touch()
    assert live_pins(pins) == {}
    assert list(pins.iterdir()) == []
