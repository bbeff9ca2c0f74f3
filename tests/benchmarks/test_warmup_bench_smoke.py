"""Smoke test of benchmarks/warmup.py: four fresh processes on the host backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "warmup.py"


def test_host_run_times_four_fresh_processes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(_SCRIPT), "--backend", "host", "--scale", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    runs = doc["runs"]
    assert [r["label"] for r in runs] == [
        "fresh machine, no warm-up",
        "fresh machine, warm-up",
        "second process, warm-up",
        "second process, no warm-up",
    ]
    assert ["warmup_s" in r for r in runs] == [False, True, True, False]
    for run in runs:
        assert run["backend"] == "host"
        assert all(run[f"{q}_s"] > 0 for q in ("pagerank", "bfs", "jaccard"))
    assert set(doc["ratios"]) == {
        "first pagerank through a warmed service vs second-process cold",
        "first bfs through a warmed service vs second-process cold",
    }
