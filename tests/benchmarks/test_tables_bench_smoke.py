"""Smoke test of benchmarks/tables.py: a tiny --quick run on the Hive dataset and the
Delta table prints every figure and every target ratio, and the engines agree."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_run_prints_every_figure_and_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    spec = importlib.util.spec_from_file_location("tables_bench", _BENCHMARKS / "tables.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tables_bench", bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    assert bench.main(["--quick", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out

    assert re.search(r"^data: 64 partitions x [\d,]+ rows, .* decoded \(--decoded-gib", out, re.M)
    assert "ours: the host backend; the peers: the CPU" in out
    assert "ours' result: a host Arrow table (execute)" in out
    peers = ["pyarrow.dataset", "duckdb"]
    for name in ("polars",):
        if f"SKIP [hive] {name}" not in out:
            peers.append(name)
    for kind in ("hive", "delta"):
        for part in ("cold", "warm", "many"):
            for engine in ("ours", *peers):
                pattern = rf"^RESULT \[{kind}\] {part} {re.escape(engine)}: [\d,.]+ ms$"
                assert re.search(pattern, out, re.M), f"no figure {kind} {part} {engine}"
        number = r"= \d+\.\d\d"
        for label, target in (("selective query, cold", "1.2"), ("16 filters, warm", "0.5")):
            pattern = (
                rf"^RATIO \[{kind}\] {label}: ours \(host result\) / fastest peer \([\w.]+\) "
                rf"{number} "
                rf"\(target <= {target}\) -> (met|NOT met)$"
            )
            assert re.search(pattern, out, re.M), f"no ratio {kind} {label}"
        assert re.search(rf"^RATIO \[{kind}\] selective query, warm: .* \(reported\)$", out, re.M)
        # ours read one partition of 64, and the 16 filters were served by the source cache
        diag = re.search(rf"^\[{kind}\] ours, diagnostics: (.*)$", out, re.M)
        assert diag is not None
        assert "'objects_read': 1," in diag.group(1)
        assert "'pruned_by_partition': 63," in diag.group(1)
        assert "'16 filters, last source_cache': 'hit'" in diag.group(1)
        rows = re.search(rf"^\[{kind}\] selective query: ([\d,]+) rows", out, re.M)
        assert rows is not None
        assert int(rows.group(1).replace(",", "")) > 0


def test_quick_run_with_device_results_keeps_ours_on_the_device_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--device-result`` (here on the host backend): ours is execute_on_device then
    release per query; the engines still agree on every row count, and each RATIO
    line names the mode."""
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    spec = importlib.util.spec_from_file_location("tables_bench", _BENCHMARKS / "tables.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tables_bench", bench)
    spec.loader.exec_module(bench)
    argv = ["--quick", "--tables", "hive", "--device-result", "--workdir", str(tmp_path)]
    assert bench.parse_args(argv).device_result
    assert not bench.parse_args(["--quick"]).device_result
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "ours' result: kept in device memory (execute_on_device, then release)" in out
    ratios = re.findall(r"^RATIO \[hive\] (.*)$", out, re.M)
    assert len(ratios) == 3
    assert all(": ours (device result) / fastest peer (" in line for line in ratios)
    diag = re.search(r"^\[hive\] ours, diagnostics: (.*)$", out, re.M)
    assert diag is not None
    assert "'16 filters, last source_cache': 'hit'" in diag.group(1)


def test_backend_is_host_by_default_cuda_on_request_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    spec = importlib.util.spec_from_file_location("tables_bench", _BENCHMARKS / "tables.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tables_bench", bench)
    spec.loader.exec_module(bench)
    assert bench.parse_args(["--quick"]).backend == "host"
    assert bench.parse_args(["--quick", "--backend", "cuda"]).backend == "cuda"
    with pytest.raises(SystemExit):
        bench.parse_args(["--backend", "tpu"])
