from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from nexus_cache._storage import FileLock
from nexus_cache.errors import CacheSecurityError, LockUsageError

from . import _workers

CTX = multiprocessing.get_context("spawn")


def test_processes_are_mutually_excluded(tmp_path):
    lock = tmp_path / "lock"
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs = [
        CTX.Process(target=_workers.locked_increments, args=(str(lock), str(counter), 15))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counter.read_text() == "60"


def test_try_and_timeout_while_another_process_holds(tmp_path):
    path = str(tmp_path / "lock")
    ready, release = CTX.Event(), CTX.Event()
    p = CTX.Process(target=_workers.hold_lock, args=(path, ready, release))
    p.start()
    try:
        assert ready.wait(30)
        lock = FileLock(path)
        assert not lock.acquire(timeout=0)
        t0 = time.monotonic()
        assert not lock.acquire(timeout=0.2)
        assert time.monotonic() - t0 >= 0.19
        assert not lock.locked
        # shared lockers are excluded by an exclusive holder too
        assert not FileLock(path, shared=True).acquire(timeout=0)
        release.set()
        assert lock.acquire(timeout=10)
        lock.release()
    finally:
        release.set()
        p.join(30)


def test_lock_dies_with_its_holder(tmp_path):
    path = str(tmp_path / "lock")
    ready = CTX.Event()
    p = CTX.Process(target=_workers.hold_lock_forever, args=(path, ready))
    p.start()
    assert ready.wait(30)
    assert not FileLock(path).acquire(timeout=0)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    lock = FileLock(path)
    assert lock.acquire(timeout=5)
    lock.release()


def test_shared_locks_coexist(tmp_path):
    path = tmp_path / "lock"
    a, b = FileLock(path, shared=True), FileLock(path, shared=True)
    assert a.acquire(timeout=0)
    assert b.acquire(timeout=0)
    assert not FileLock(path).acquire(timeout=0)
    a.release()
    b.release()
    assert FileLock(path).acquire(timeout=0)


def test_one_object_is_a_thread_lock_and_not_reentrant(tmp_path):
    lock = FileLock(tmp_path / "lock")
    inside = []
    with lock:
        with pytest.raises(LockUsageError, match="not reentrant"):
            lock.acquire()
        t = threading.Thread(target=lambda: inside.append(lock.acquire(timeout=0.1)))
        t.start()
        t.join()
    assert inside == [False]
    with pytest.raises(LockUsageError, match="not held"):
        lock.release()
    assert issubclass(LockUsageError, RuntimeError)  # callers catching RuntimeError still do


def test_symlinked_lock_file_refused(tmp_path):
    real = tmp_path / "real"
    real.write_bytes(b"")
    link = tmp_path / "lock"
    link.symlink_to(real)
    with pytest.raises(OSError):  # O_NOFOLLOW gives ELOOP
        FileLock(link).acquire()
    os.chown(real, 54321, 54321)
    with pytest.raises(CacheSecurityError):
        FileLock(real).acquire()
