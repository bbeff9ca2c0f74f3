"""Smoke test of benchmarks/cli_remote.py: a short host run prints both wall
times and their ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cli_remote.py"


def test_short_host_run_prints_both_walls_and_the_ratio(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(_SCRIPT), "--runs", "2", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for figure in (
        r"one-row warm scan, nexus-cache scan --server: median \d+ ms, min \d+ ms",
        r"one-row warm scan, bare pyarrow do_get: median \d+ ms, min \d+ ms",
        r"RATIO ours / bare \(medians\): [\d.]+ \((within|ABOVE) the 1.5x target\)",
        r"server exit status on SIGTERM: 0",
    ):
        assert re.search(figure, done.stdout), (figure, done.stdout)


def test_without_workdir_leaves_nothing_in_the_temp_dir(tmp_path: Path) -> None:
    # The default workdir (the file and the server's lakehouse cache) was left in /tmp.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(_SCRIPT), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "temporary workdir, removed" in done.stdout
    assert not list(tmp_path.glob("nexus-cli-remote-bench-*"))
