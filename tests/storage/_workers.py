"""Functions run in spawned child processes by the storage tests."""

from __future__ import annotations

import os
import time

from nexus_cache._storage import FileLock, new_temp, write_all


def locked_increments(lock_path: str, counter_path: str, n: int) -> None:
    # Read-modify-write with a pause in the middle: without mutual exclusion
    # the processes overwrite each other's increments.
    for _ in range(n):
        with FileLock(lock_path):
            with open(counter_path) as f:
                value = int(f.read() or "0")
            time.sleep(0.001)
            with open(counter_path, "w") as f:
                f.write(str(value + 1))


def hold_lock(lock_path: str, ready, release) -> None:  # type: ignore[no-untyped-def]
    with FileLock(lock_path):
        ready.set()
        release.wait(30)


def hold_lock_forever(lock_path: str, ready) -> None:  # type: ignore[no-untyped-def]
    lock = FileLock(lock_path)
    lock.acquire()
    ready.set()
    time.sleep(60)


def write_half_then_hang(tmp_dir: str, ready) -> None:  # type: ignore[no-untyped-def]
    fd, _path = new_temp(tmp_dir)
    write_all(fd, b"\x7fELF" + b"x" * 4096)
    os.fsync(fd)
    ready.set()
    time.sleep(60)  # killed here, mid-write, before publication


def exit_now() -> None:
    return None
