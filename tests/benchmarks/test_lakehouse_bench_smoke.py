"""Smoke test of benchmarks/lakehouse.py: a tiny --quick run prints every ratio line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_run_prints_every_ratio_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The script is loaded from its file (the name ``lakehouse`` is the test
    # package's); its pieces come from benchmarks/_lakehouse, which the spawned
    # readers of figure (4) import by name, so that directory goes on the path.
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    # The benchmark puts dummy AWS credentials in the environment for its moto
    # server and keeps them (its spawned readers inherit them); set here, they go
    # at teardown instead of sending every later test's S3 call out with them.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    spec = importlib.util.spec_from_file_location("lakehouse_bench", _BENCHMARKS / "lakehouse.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--quick", "--size-mib", "2", "--warm-repeats", "1", "--cold-repeats", "1"]
    args += ["--dataset-files", "3", "--dataset-mib", "1"]
    assert bench.main([*args, "--procs", "2", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out

    for remote in ("local", "s3"):
        for figure in (
            "(1) warm hit, bytes",
            "(1) warm hit, read_table",
            "(2) cold read_through",
            "(3) warm, bytes",
            "(3) warm, read_table",
            "(3) cold, bytes",
        ):
            pattern = rf"^RATIO {re.escape(figure)} \[{remote}\] .* = \d+\.\d\d"
            assert re.search(pattern, out, re.MULTILINE), f"no ratio line {figure} [{remote}]"
        for peer in ("simplecache", "filecache"):
            assert re.search(rf"^RATIO \(4\) \[{remote}\] ours vs {peer}: ", out, re.MULTILINE)
        # our own concurrency guarantee holds even in the smoke run
        ours = rf"^RESULT \(4\) \[{remote}\] ours: .*fills per round \[1\]; 2 correct, .* -> met$"
        assert re.search(ours, out, re.MULTILINE)
    # the single-object S3 targets allow one HEAD, measured in the same run
    assert re.search(r"^HEAD \[s3\] .*median \d", out, re.MULTILINE)
    assert re.search(r"^RATIO \(3\) warm, read_table \[s3\] .*\(one HEAD\)", out, re.MULTILINE)
    # the dataset figure: every engine against both peers, with its S3 requests
    for reader in ("pq.read_table", "pyarrow.dataset", "pandas", "duckdb glob"):
        for peer in ("simplecache", "filecache"):
            figure = re.escape(f"(5) warm dataset 3 files, {reader} [s3]")
            pattern = rf"^RATIO {figure} .* vs {peer}: .* = \d+\.\d\d"
            assert re.search(pattern, out, re.MULTILINE), f"no dataset line {reader} vs {peer}"
        side = re.escape(f"(5) [s3, 3 files] {reader} ours (nexus fs)")
        requests = rf"^REQUESTS {side}: \d+ LIST, \d+ HEAD, 0 GET$"
        assert re.search(requests, out, re.MULTILINE), f"no request count for {reader}"
    assert "page cache: " in out
    assert "Summary" in out
    # only the generated object is kept in the work directory
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["data-2mib.parquet", "dataset-3x1mib"]
