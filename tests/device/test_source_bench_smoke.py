"""Smoke test of benchmarks/source_cache_hit.py: a tiny run prints both rows per backend."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_tiny_run_prints_cold_and_warm_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(_BENCHMARKS))
    bench = importlib.import_module("source_cache_hit")
    bench.main(["--host-mib", "1", "--mib", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "host    host   cold publish" in out
    assert "host    host   warm hit" in out
