"""``--out`` never destroys the previous file: the result goes to a temp beside it, then
is renamed into place."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src"
_ENV = {**os.environ, "NEXUS_DEVICE_BACKEND": "host", "PYTHONPATH": str(SRC)}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")


def _old_file(path: Path) -> bytes:
    pq.write_table(pa.table({"old": [1, 2, 3]}), path)
    path.chmod(0o640)
    return path.read_bytes()


def _kill_mid_write(tmp_path: Path, seed: int, started: Callable[[Path], bool]) -> list[str]:
    """Run ``nexus-cache scan BIG --out tmp_path/result.parquet`` in a process of its
    own and SIGKILL it once ``started(out)`` says its write has begun; returns the
    command line (its source is ``argv[4]``)."""
    source = tmp_path / "big.parquet"
    # random values: Parquet cannot compress them, so the write takes a while
    numbers = pa.array(np.random.default_rng(seed).integers(0, 2**62, 4_000_000), pa.int64())
    pq.write_table(pa.table({"a": numbers, "b": numbers}), source, compression="none")
    out = tmp_path / "result.parquet"
    argv = [sys.executable, "-m", "nexus_cache.cli.main", "scan", str(source), "--out", str(out)]
    proc = subprocess.Popen(argv, env=_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if started(out):
                break
            time.sleep(0.0005)
        assert proc.poll() is None, "the command finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    return argv


def _temps(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_a_kill_mid_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "result.parquet"
    old = _old_file(out)

    # Kill as soon as the write has begun: a temp beside the file (the fix),
    # or the file itself changed (a write in place).
    def started(out: Path) -> bool:
        return bool(_temps(tmp_path)) or out.stat().st_size != len(old) or out.read_bytes() != old

    _kill_mid_write(tmp_path, 0, started)
    assert out.read_bytes() == old
    assert pq.read_table(out).column_names == ["old"]


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp(
    host: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), source)
    out = tmp_path / "result.parquet"
    old = _old_file(out)

    def fail_midway(table: pa.Table, where: object, **kwargs: object) -> None:
        where.write(b"PAR1 torn")  # type: ignore[attr-defined]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", fail_midway)
    assert main(["scan", str(source), "--out", str(out)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "result.parquet"]


def test_a_rewrite_keeps_the_file_mode_and_a_new_file_follows_the_umask(
    host: None, tmp_path: Path
) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), source)
    out = tmp_path / "result.parquet"
    _old_file(out)
    assert main(["scan", str(source), "--out", str(out)]) == 0
    assert pq.read_table(out).column_names == ["x"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    fresh = tmp_path / "fresh.parquet"
    previous = os.umask(0o027)
    try:
        assert main(["scan", str(source), "--out", str(fresh)]) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_out_symlink_is_followed(host: None, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), source)
    target = tmp_path / "target.parquet"
    _old_file(target)
    link = tmp_path / "link.parquet"
    link.symlink_to(target)
    assert main(["scan", str(source), "--out", str(link)]) == 0
    assert link.is_symlink()
    assert pq.read_table(target).column_names == ["x"]


def test_the_next_write_removes_the_temp_a_killed_write_left(tmp_path: Path) -> None:
    from nexus_cache._storage import host_tag

    argv = _kill_mid_write(tmp_path, 1, lambda out: bool(_temps(tmp_path)))
    out = tmp_path / "result.parquet"
    (left,) = _temps(tmp_path)
    assert not out.exists()
    # a concurrent write's temp (a live pid: ours) and a file we did not make stay
    live = tmp_path / f".result.parquet.{host_tag()}-{os.getpid()}-{'0' * 16}.tmp"
    live.write_bytes(b"in flight")
    mine = tmp_path / ".result.parquet.notes.tmp"
    mine.write_bytes(b"user's")
    small = tmp_path / "small.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), small)
    argv[4] = str(small)
    done = subprocess.run(argv, env=_ENV, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).column_names == ["x"]
    assert not left.exists()
    assert live.exists()
    assert mine.exists()
