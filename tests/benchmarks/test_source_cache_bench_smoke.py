"""Smoke test of benchmarks/source_cache.py on the host backend: a tiny run
prints every figure and the three target ratios."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_host_run_prints_every_figure_and_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    bench = importlib.import_module("source_cache")
    args = ["--quick", "--backend", "host", "--size-mib", "2", "--workdir", str(tmp_path)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out

    assert "lakehouse read: hit" in out  # cold runs read the filled lakehouse entry
    for figure in (
        "cold end to end",
        "host decode",
        "H2D stage",
        "warm hit",
        "ceiling: pinned H2D copy",
        "ceiling: D2D copy",
    ):
        assert re.search(rf"^RESULT .*{re.escape(figure)}.* GB/s$", out, re.MULTILINE), figure
    for ratio in (
        "warm hit / D2D ceiling",
        "cold H2D stage / pinned H2D ceiling",
        "cold / warm end to end",
    ):
        pattern = rf"^RATIO {re.escape(ratio)} = \d+\.\d\d \(target >= [\d.]+\) -> (met|NOT met)$"
        assert re.search(pattern, out, re.MULTILINE), ratio
    # the generated source (at least the asked size) and the lakehouse root stay in the workdir
    source = tmp_path / "source-2mib.parquet"
    assert source.stat().st_size >= 2 << 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake", "source-2mib.parquet"]
