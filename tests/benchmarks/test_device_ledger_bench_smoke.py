"""Smoke test of benchmarks/device_ledger.py: a tiny run prints every pair, ours/peer."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_tiny_run_prints_every_pair_with_its_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "nexus_ledger_bench", _BENCHMARKS / "device_ledger.py"
    )
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--pairs", "200", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for pair in ("pin/release", "checkout/release", "reserve/reconcile"):
        for threads in (1, 8):
            row = re.search(
                rf"^{re.escape(pair)} +host +{threads} +([\d.]+) +([\d.]+) +([\d.]+)",
                out,
                re.MULTILINE,
            )
            assert row, (pair, threads, out)
            ours, peer, ratio = map(float, row.groups())
            assert ratio == pytest.approx(ours / peer, abs=0.02)  # ours / peer
