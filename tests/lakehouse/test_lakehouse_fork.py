"""A forked child (multiprocessing's default on Linux before 3.14, DataLoader
workers) uses its parent's caches as if it had made them itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._helpers import entry_files, write_old_file

# The parent's background fill is held mid-copy (by the fill's write seam) when
# it forks; the child then reads and exits normally, running the exit hooks.
_FORK_SCRIPT = """
import os, sys, threading, time
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig, _fill

root, first, second = sys.argv[1:4]
release = threading.Event()
real = _fill._write_chunk
def held(fd, data):
    release.wait(60)
    real(fd, data)
_fill._write_chunk = held
cache = LakehouseCache(LakehouseCacheConfig(
    root=root, policy="read_through", max_bytes="1G", fill_max_concurrency=1,
    fill_exit_wait_s=20,
))
cache.read(first)
while cache.limits.in_flight()[0] == 0:  # the fill of `first` is running, held
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    _fill._write_chunk = real
    idle = cache.wait_for_fills(timeout=5)
    budget = cache.limits.in_flight()
    cache.read(second)
    filled = cache.wait_for_fills(timeout=20)
    print("child", idle, budget, filled, cache.events.counts().get("fill_completed", 0))
    sys.stdout.flush()
    sys.exit(0)
started = time.monotonic()
os.waitpid(pid, 0)
print("child_exit_s", time.monotonic() - started)
release.set()
assert cache.wait_for_fills(timeout=30)
"""


def test_forked_child_does_not_inherit_the_parents_running_fills(tmp_path: Path) -> None:
    first = write_old_file(tmp_path / "first.parquet", os.urandom(8192))
    second = write_old_file(tmp_path / "second.parquet", os.urandom(4096))
    root = tmp_path / "c"
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(root), str(first), str(second)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    # nothing of the parent's to wait for, the whole budget, and its own fill ran
    assert lines["child"] == "True (0, 0) True 1", done.stderr
    # its exit did not wait NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S for the parent's fill
    assert float(lines["child_exit_s"]) < 10, done.stderr
    assert sorted(p.read_bytes() for p in entry_files(root)) == sorted(
        [first.read_bytes(), second.read_bytes()]
    )
