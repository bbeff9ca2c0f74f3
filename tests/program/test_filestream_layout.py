"""File-stream backend: entry names, fan-out, access stamps written beside the
read path, and entries an earlier version wrote."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest

from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program._integrity import (
    FANOUT,
    SIDECAR_SUFFIX,
    entry_location,
    entry_name,
    entry_relpath,
)
from nexus_cache.program.filestream import _stamps

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def entry_path(cache, key):
    sub, name = entry_location(key)
    return cache.path / "entries" / sub / name


# -- names and fan-out ---------------------------------------------------------


def test_a_32_byte_key_is_its_own_name_and_other_keys_are_hashed_apart():
    digest = hashlib.sha256(b"inputs").digest()
    assert entry_name(digest) == digest.hex()
    assert entry_name(b"inputs") == hashlib.sha256(b"nexus-cache entry name\0inputs").hexdigest()
    # The 32-byte key that is the plain SHA-256 of another key is another entry.
    assert entry_name(hashlib.sha256(b"inputs").digest()) != entry_name(b"inputs")
    assert len({entry_name(k) for k in (b"", b"a", b"a" * 31, b"a" * 33)}) == 4


def test_string_and_bytes_keys_share_an_entry(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c")
    c["k" * 32] = b"v"
    assert c[b"k" * 32] == b"v"
    assert entry_path(c, b"k" * 32).exists()


def test_structured_keys_still_spread_over_the_fanout(tmp_path):
    # Keys that are their own names need not be uniform: ASCII keys would all
    # share their first hex digits; the subdir comes from a CRC of the name.
    keys = [b"kernel-%026d" % i for i in range(2000)]
    assert len({k.hex()[:2] for k in keys}) == 1
    subdirs = {entry_location(k)[0] for k in keys}
    assert len(subdirs) > 200
    assert subdirs <= set(FANOUT)
    c = FileStreamProgramCache(tmp_path / "c")
    for k in keys[:50]:
        c[k] = k
    assert all(c[k] == k for k in keys[:50])
    for k in keys[:50]:
        sub, name = entry_location(k)
        assert entry_relpath(name) == f"{sub}/{name}"
        assert (c.path / "entries" / sub / name).is_file()


# -- access stamps -------------------------------------------------------------


def test_a_stamp_never_moves_an_atime_back_nor_lands_on_another_file(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c")
    c[b"k"] = b"v"
    p = str(entry_path(c, b"k"))
    st = os.lstat(p)
    os.utime(p, ns=(st.st_mtime_ns + 5_000_000_000, st.st_mtime_ns))
    assert _stamps.stamp_now(p, st.st_ino, st.st_mtime_ns, st.st_mtime_ns + 1) is None
    assert os.lstat(p).st_atime_ns == st.st_mtime_ns + 5_000_000_000
    assert _stamps.stamp_now(p, st.st_ino + 1, st.st_mtime_ns, time.time_ns()) is None
    assert _stamps.stamp_now(p, st.st_ino, st.st_mtime_ns + 1, time.time_ns()) is None
    assert _stamps.stamp_now(p + "-gone", st.st_ino, st.st_mtime_ns, time.time_ns()) is None
    now = time.time_ns()
    assert _stamps.stamp_now(p, st.st_ino, st.st_mtime_ns, now + 10**10) is not None
    after = os.lstat(p)
    assert (after.st_atime_ns, after.st_mtime_ns) == (now + 10**10, st.st_mtime_ns)


_READ_AND_EXIT = """
import sys
from nexus_cache.program import FileStreamProgramCache
c = FileStreamProgramCache(sys.argv[1])
assert c[sys.argv[2].encode()] == b"payload"
"""


def test_a_one_shot_process_writes_its_stamps_at_exit(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c")
    c[b"k"] = b"payload"
    p = entry_path(c, b"k")
    before = os.lstat(p)
    assert before.st_atime_ns < before.st_mtime_ns  # never read
    subprocess.run(
        [sys.executable, "-c", _READ_AND_EXIT, str(c.path), "k"],
        env=_ENV,
        check=True,
        timeout=60,
    )
    after = os.lstat(p)
    assert after.st_atime_ns > after.st_mtime_ns  # its read is on disk
    assert after.st_mtime_ns == before.st_mtime_ns


_FORKED_READS = """
import os, sys, time
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program.filestream import _stamps
_stamps.DELAY_S = 3600  # nothing written by the thread while we look
c = FileStreamProgramCache(sys.argv[1])
assert c[b"parent"] == b"p"
queued = len(_stamps.QUEUE.pending)
pid = os.fork()
if pid == 0:
    inherited = len(_stamps.QUEUE.pending)
    assert c[b"child"] == b"c"
    own = len(_stamps.QUEUE.pending)
    alive = _stamps.QUEUE.thread is not None and _stamps.QUEUE.thread.is_alive()
    print("child", inherited, own, alive, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", queued, len(_stamps.QUEUE.pending), flush=True)
"""


def test_a_forked_child_starts_with_an_empty_stamp_queue_and_its_own_thread(tmp_path):
    c = FileStreamProgramCache(tmp_path / "c")
    c[b"parent"] = b"p"
    c[b"child"] = b"c"
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_READS, str(c.path)],
        env=_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["child"] == "0 1 True"  # nothing of the parent's; its own read queued
    assert lines["parent"] == "1 1"  # the parent's queue untouched by the child


def test_stamps_are_written_on_the_reading_thread_once_the_exit_hook_ran(tmp_path, monkeypatch):
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    c[b"k"] = b"v"
    p = entry_path(c, b"k")
    monkeypatch.setattr(_stamps.QUEUE, "stop", True)  # as our atexit hook leaves it
    monkeypatch.setattr(_stamps.QUEUE, "scheduled", False)
    before = time.time_ns()
    assert c[b"k"] == b"v"
    assert os.lstat(p).st_atime_ns >= before  # written at once, not queued
    assert len(_stamps.QUEUE.pending) == 0


def test_stamps_are_written_on_the_reading_thread_where_no_thread_can_start(tmp_path, monkeypatch):
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    c[b"k"] = b"v"
    p = entry_path(c, b"k")
    _stamps.flush()
    monkeypatch.setattr(_stamps.QUEUE, "thread", None)
    monkeypatch.setattr(_stamps.QUEUE, "scheduled", False)

    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(_stamps.threading.Thread, "start", refuse)
    before = time.time_ns()
    assert c[b"k"] == b"v"
    assert os.lstat(p).st_atime_ns >= before
    assert not _stamps.QUEUE.scheduled


# -- entries an earlier version wrote -----------------------------------------


def _plant_old_entry(cache, key, data, *, sidecar=False):
    """An entry as versions before XXH3 records wrote it: named by the plain
    SHA-256 of the key, in the subdir of its first two digits, CRC-32 record."""
    import struct
    import zlib

    h = hashlib.sha256(key).hexdigest()
    d = cache.path / "entries" / h[:2]
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / h
    p.write_bytes(data)
    p.chmod(0o600)
    record = struct.pack("<4sIQ16s", b"nxc2", zlib.crc32(data), len(data), bytes.fromhex(h[:32]))
    if sidecar:
        ino = os.lstat(p).st_ino
        side = struct.pack(
            "<4sQIQ16s", b"nxc2", ino, zlib.crc32(data), len(data), bytes.fromhex(h[:32])
        )
        (d / (h + SIDECAR_SUFFIX)).write_bytes(side)
    else:
        os.setxattr(p, "user.nexus.v1", record)
    return p


@pytest.mark.parametrize("sidecar", [False, True])
def test_verify_lists_and_removes_entries_an_earlier_version_wrote(tmp_path, sidecar):
    c = FileStreamProgramCache(tmp_path / "c", max_size_bytes="1M")
    c[b"current"] = b"x" * 100
    # Same place as today's layout would put it, older record: still outdated.
    for i in range(5000):
        key = b"old-%d" % i
        h = hashlib.sha256(key).hexdigest()
        if entry_relpath(h) == f"{h[:2]}/{h}":
            break
    else:
        pytest.fail("no old name whose subdir agrees with today's layout")
    old = [_plant_old_entry(c, key, b"o" * 50, sidecar=sidecar)]
    old.append(_plant_old_entry(c, b"other-old", b"p" * 70, sidecar=sidecar))
    assert c.get(b"old-%d" % i) is None  # never served
    report = c.verify()
    assert sorted(report.outdated) == sorted(p.name for p in old)
    assert report.corrupt == []
    assert report.ok == 1
    assert not any(p.exists() for p in old)
    assert not any(os.path.exists(str(p) + SIDECAR_SUFFIX) for p in old)
    assert c[b"current"] == b"x" * 100
    assert c.stats().corrupt == 0
    assert c.verify().outdated == []


def test_verify_cli_reports_outdated_entries_and_exits_zero(tmp_path, capsys):
    from nexus_cache.cli.main import main

    c = FileStreamProgramCache(tmp_path / "c")
    c[b"current"] = b"x"
    old = _plant_old_entry(c, b"old", b"o" * 10)
    assert main(["program-cache", "verify", "--path", str(c.path)]) == 0
    out = capsys.readouterr().out
    assert "written by an earlier version" in out
    assert "1 outdated (removed)" in out
    assert not old.exists()


def test_one_batch_of_stamps_keeps_the_order_of_the_reads(tmp_path, monkeypatch):
    # The queue stamps with the time it writes, not the time of each read:
    # within one batch the entries still come out in the order they were read.
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    keys = [b"k%d" % i for i in range(20)]
    for k in keys:
        c[k] = k
    _stamps.flush()
    monkeypatch.setattr(_stamps.QUEUE, "scheduled", True)  # no thread: flushed below
    order = keys[7:] + keys[:7]
    before = time.time_ns()
    for k in order:
        assert c[k] == k
    _stamps.flush()
    atimes = [os.lstat(entry_path(c, k)).st_atime_ns for k in order]
    assert atimes == sorted(atimes)
    assert len(set(atimes)) == len(atimes)
    assert atimes[0] >= before - len(order)


def test_a_hot_loop_over_one_entry_queues_one_stamp(tmp_path, monkeypatch):
    # With no memo (or an entry too big for it) every hit reads the disk; a
    # stamp still queued covers the reads after it, as the 1 s window would.
    c = FileStreamProgramCache(tmp_path / "c", memory_bytes=0)
    c[b"k"] = b"v"
    _stamps.flush()
    monkeypatch.setattr(_stamps, "DELAY_S", 3600)
    for _ in range(500):
        assert c[b"k"] == b"v"
    assert list(_stamps.QUEUE.pending) == [str(entry_path(c, b"k"))]
    # A rewrite is another inode: its first read queues its own stamp.
    c[b"k"] = b"w"
    assert c[b"k"] == b"w"
    ino = os.lstat(entry_path(c, b"k")).st_ino
    assert _stamps.QUEUE.pending[str(entry_path(c, b"k"))].st_ino == ino
    _stamps.flush()
    st = os.lstat(entry_path(c, b"k"))
    assert st.st_atime_ns > st.st_mtime_ns
