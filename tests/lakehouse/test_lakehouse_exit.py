"""read_through from short-lived processes: fills finish at interpreter exit."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from nexus_cache.lakehouse import read_stats

from ._helpers import entry_files, write_old_file

# A one-shot reader: a fill slowed down as a large remote object would be, then
# the script ends right after its read, as scripts and CLI runs do.
_SCRIPT = """
import sys, time
from nexus_cache.lakehouse import _fill, default_cache

real = _fill._write_chunk
def slow(fd, data):
    time.sleep(float(sys.argv[2]))
    real(fd, data)
_fill._write_chunk = slow
data = default_cache().read(sys.argv[1])
assert len(data) == 4096, len(data)
"""


def _run(
    script: str, *args: str, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter that imports this checkout, with ``env``."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **env}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_shot(
    source: Path, root: Path, delay_s: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    settings = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(root),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "read_through",
        "NEXUS_LAKEHOUSE_CACHE_READ": "disabled",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1M",
        **env,
    }
    return _run(_SCRIPT, str(source), str(delay_s), env=settings)


def test_one_shot_read_through_process_leaves_a_published_entry(tmp_path: Path) -> None:
    source = write_old_file(tmp_path / "a.parquet", os.urandom(4096))
    root = tmp_path / "c"
    done = _one_shot(source, root, 1.0, {})
    assert done.returncode == 0, done.stderr
    (entry,) = entry_files(root)
    assert entry.read_bytes() == source.read_bytes()
    assert list((root / "tmp").iterdir()) == []
    # the finished process's reads are visible from here (what the CLI shows)
    stats = read_stats(root)
    assert stats["processes"] == 1
    assert stats["reads"]["miss"] == stats["reads"]["total"] == 1
    assert stats["fill_modes"]["background"] == 1
    assert stats["events"]["fill_completed"] == 1
    (last,) = stats["recent_reads"]
    assert (last["location"], last["read_mode"]) == (str(source), "remote")


def test_exit_wait_is_bounded_by_its_setting(tmp_path: Path) -> None:
    source = write_old_file(tmp_path / "a.parquet", os.urandom(4096))
    root = tmp_path / "c"
    started = time.monotonic()
    done = _one_shot(source, root, 300.0, {"NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S": "0.5"})
    assert done.returncode == 0, done.stderr
    # the 0.5 s wait, not the 300 s fill (generous for a process start on a loaded host)
    assert time.monotonic() - started < 120
    assert entry_files(root) == []
    assert "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S" in done.stderr


_S3_SCRIPT = """
import sys
import fsspec
url, endpoint = sys.argv[1], sys.argv[2]
with fsspec.open(url, s3={"client_kwargs": {"endpoint_url": endpoint}}) as f:
    assert len(f.read()) == 3 << 20
"""


def test_one_shot_script_over_s3_warms_the_cache(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    """The fill runs on s3fs at exit, before the interpreter shuts its executors down."""
    from ._helpers import put_object

    data = os.urandom(3 << 20)
    put_object(s3_endpoint, s3_bucket, "t.parquet", data)
    root = tmp_path / "c"
    env = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(root),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "read_through",
        "NEXUS_LAKEHOUSE_CACHE_READ": "disabled",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
    }
    url = f"nexus::s3://{s3_bucket}/t.parquet"
    done = _run(_S3_SCRIPT, url, s3_endpoint, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    (entry,) = entry_files(root)
    assert entry.read_bytes() == data
    assert read_stats(root)["events"]["fill_failed"] == 0


# Python 3.12+ refuses to start threads once interpreter shutdown begins, which
# is when a one-shot script's read_through fill publishes. The hook below,
# registered after nexus-cache's own exit hook and so run before it, refuses
# them the same way on every version.
_NO_THREADS_AT_EXIT_SCRIPT = """
import sys, threading, time
from nexus_cache.lakehouse import _fill, default_cache

real = _fill._write_chunk
def slow(fd, data):
    time.sleep(0.2)
    real(fd, data)
_fill._write_chunk = slow

def refuse(self):
    raise RuntimeError("can't create new thread at interpreter shutdown")
threading._register_atexit(lambda: setattr(threading.Thread, "start", refuse))
assert len(default_cache().read(sys.argv[1])) == (2 << 20) + 1
"""


def test_fill_published_when_no_thread_can_start_is_made_durable_at_once(
    tmp_path: Path,
) -> None:
    data = os.urandom((2 << 20) + 1)  # three steps: the digest thread is refused too
    source = write_old_file(tmp_path / "a.parquet", data)
    root = tmp_path / "c"
    env = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(root),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "read_through",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
        "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S": "300",
    }
    started = time.monotonic()
    done = _run(_NO_THREADS_AT_EXIT_SCRIPT, str(source), env=env)
    assert done.returncode == 0, done.stderr
    # no fsync job left queued for a worker that never started: not the 300 s
    # exit wait (generous for a process start on a loaded host)
    assert time.monotonic() - started < 120, done.stderr
    (entry,) = entry_files(root)
    assert entry.read_bytes() == data
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600  # durable, not left 0700
    assert read_stats(root)["events"]["fill_failed"] == 0


# A cache made for one read and collected before exit (pandas' storage_options,
# a helper function's local): its fsync, slowed down as on a busy disk, is
# still pending when the script ends.
_COLLECTED_CACHE_SCRIPT = """
import gc, sys, time
from nexus_cache.lakehouse import LakehouseCache, _durable

real = _durable._sync
def slow(fd, record, discard):
    time.sleep(1.0)
    real(fd, record, discard)
_durable._sync = slow
cache = LakehouseCache.from_env()
assert len(cache.read(sys.argv[1])) == 4096
del cache
gc.collect()
"""


def test_exit_waits_for_the_fsyncs_of_a_collected_cache(tmp_path: Path) -> None:
    source = write_old_file(tmp_path / "a.parquet", os.urandom(4096))
    root = tmp_path / "c"
    env = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(root),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
    }
    done = _run(_COLLECTED_CACHE_SCRIPT, str(source), env=env)
    assert done.returncode == 0, done.stderr
    (entry,) = entry_files(root)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600, "exit did not wait for the fsync"


# A read in an atexit handler, once no thread can start (Python 3.12+ from then
# on; the handler refuses them the same way on every version).
_READ_IN_ATEXIT_SCRIPT = """
import atexit, sys, threading
from nexus_cache.lakehouse import default_cache

cache = default_cache()
def refuse(self):
    raise RuntimeError("can't create new thread at interpreter shutdown")
def last():
    threading.Thread.start = refuse
    assert len(cache.read(sys.argv[1])) == 4096
    print(*[e.reason for e in cache.events.events("fill_skipped")])
atexit.register(last)
"""


def test_read_through_read_in_an_atexit_handler_skips_its_fill_quietly(tmp_path: Path) -> None:
    source = write_old_file(tmp_path / "a.parquet", os.urandom(4096))
    env = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "c"),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "read_through",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
    }
    done = _run(_READ_IN_ATEXIT_SCRIPT, str(source), env=env)
    assert done.returncode == 0, done.stderr
    # the fill nothing could run is a skip, not a failed after-read hook
    assert done.stdout.split() == ["shutdown"], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# A warm S3 read in an atexit handler: the interpreter's executors (the probe
# pool among them) take no work any more by then, on every Python version.
_WARM_READ_IN_ATEXIT_SCRIPT = """
import atexit, sys
import s3fs
from nexus_cache.lakehouse import default_cache

url, endpoint = sys.argv[1], sys.argv[2]
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
cache = default_cache()
for _ in range(2):  # a fill, then a hit whose identity request went to the probe pool
    assert len(cache.read(url, fs=fs)) == 3000
def last():
    with cache.open(url, fs=fs) as f:
        assert len(f.read()) == 3000
        print(f.diagnostics.cache_status.value)
atexit.register(last)
"""


def test_warm_s3_read_in_an_atexit_handler(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    from ._helpers import put_object

    put_object(s3_endpoint, s3_bucket, "t.parquet", os.urandom(3000))
    env = {
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "c"),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
    }
    url = f"s3://{s3_bucket}/t.parquet"
    done = _run(_WARM_READ_IN_ATEXIT_SCRIPT, url, s3_endpoint, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    # was: RuntimeError: cannot schedule new futures after shutdown
    assert done.stdout.split() == ["hit"], done.stderr
