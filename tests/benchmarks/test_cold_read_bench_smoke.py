"""Smoke test of benchmarks/cold_read.py on the host backend: a tiny run prints
every path, the stage breakdown and the ratios."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_QUICK = ["--backend", "host", "--size-mib", "1", "--group-rows", "20000", "--repeats", "1"]


def _run(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    bench = importlib.import_module("cold_read")
    assert bench.main([*_QUICK, *args]) == 0


def test_quick_host_run_prints_every_path_and_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(monkeypatch, "--workdir", str(tmp_path))
    out = capsys.readouterr().out
    for label in ("numbers and strings", "dictionary-heavy"):
        for path in (
            "ours (row-group pool",
            "user's path",
            "pyarrow decode alone",
            "ours, no lakehouse root",
        ):
            assert re.search(rf"^  {re.escape(path)}.* \d+\.\d\d$", out, re.MULTILINE), path
        assert re.search(
            rf"^RATIO {label}: ours / pyarrow decode alone = \d+\.\d\d", out, re.MULTILINE
        )
        assert re.search(rf"^RESULT {label}: ours \d+\.\d\d GB/s", out, re.MULTILINE)
        # without a root the local file is mapped and decoded by the pool too
        assert re.search(
            rf"^RATIO {label}: ours without a root / pyarrow decode alone = \d+\.\d\d "
            r"\(CI target <= 1\.10; \d+ decoder threads, lakehouse bypass remote\)",
            out,
            re.MULTILINE,
        )
    assert "decoder threads, host decode" in out
    # the GPU engine's row needs CUDA: skipped with a note on the host backend
    assert out.count("ours, GPU decode (engine=gpu, nvCOMP): skipped (the host backend") == 2


def test_the_dictionary_heavy_file_alone_with_another_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(monkeypatch, "--skip-mixed", "--codec", "zstd", "--workdir", str(tmp_path))
    out = capsys.readouterr().out
    assert "RESULT dictionary-heavy" in out
    assert "numbers and strings" not in out
    assert (tmp_path / "dict-zstd.parquet").exists()
