"""Smoke test of benchmarks/serve.py: a tiny host run prints every figure."""

from __future__ import annotations

import importlib.util
import re
import tempfile
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_tiny_host_run_prints_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("nexus_serve_bench", _BENCHMARKS / "serve.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name in ("NEXUS_DEVICE_BACKEND", "NEXUS_LAKEHOUSE_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)  # the run sets them; restored after
    args = ["--scan-gib", "0.01", "--repeats", "10", "--stream-repeats", "1"]
    args += ["--qps-seconds", "0.5", "--clients", "1", "--demo-scale", "5"]
    # Without --workdir the run's data and caches go in a temporary directory
    # that is removed at the end (it was left in /tmp, --scan-gib of Parquet each run).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert bench.main(args) == 0
    assert not list(tmp_path.glob("nexus-serve-bench-*"))
    out = capsys.readouterr().out
    assert "temporary workdir, removed" in out
    for figure in (
        r"one-row warm query, in-process: p50 [\d.]+ ms, p99 [\d.]+ ms",
        r"one-row warm query, server: +p50 [\d.]+ ms, p99 [\d.]+ ms",
        r"RATIO one-row p50 above in-process: -?[\d.]+ ms",
        r"floor: a bare pyarrow.flight round trip of a one-row table, p50 [\d.]+ ms; "
        r"the server's fixed cost above it .*: -?[\d.]+ ms",
        r"warm scan of [\d.]+ GiB \(source cache hit / hit\): in-process [\d.]+ s",
        r"RATIO streaming of the result over loopback \(first batch to last\): [\d.]+ s",
        r"ceiling: a bare pyarrow.flight server streams the same bytes in [\d.]+ s",
        r"QPS one-row warm query, 1 client processes: \d+",
        r"server exit status on SIGTERM: 0",
        r"demo mix at scale 5",
        r"  pagerank .* / ",
    ):
        assert re.search(figure, out), figure
