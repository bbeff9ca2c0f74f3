"""Smoke test of benchmarks/cluster.py: a tiny run prints every result line."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("distributed")

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_tiny_run_prints_every_result_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    spec = importlib.util.spec_from_file_location(
        "nexus_cluster_bench", _BENCHMARKS / "cluster.py"
    )
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--workers", "1", "--sources", "2", "--rows", "2000", "--scale", "8"]
    args += ["--rounds", "1", "--reads", "20", "--workdir", str(tmp_path)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"^RESULT one process: +[\d.]+ queries/s", out, re.MULTILINE)
    assert re.search(r"^RESULT 1 worker : +[\d.]+ queries/s .* routing hit rate 100%", out, re.M)
    names = ["FileStream \\(no memo\\)", "FileStream \\(memo, default\\)"]
    if shutil.which("redis-server"):
        names += ["Redis \\(loopback\\)", "tiered \\(hit in memory\\)"]
    for name in names:
        assert re.search(rf"^RESULT program-cache hit, {name} *: +[\d.]+ us", out, re.M), name
