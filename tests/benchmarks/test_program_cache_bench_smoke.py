"""Smoke test of benchmarks/program_cache.py: a tiny run prints every row, ours/peer,
and removes its temporary directory."""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_tiny_run_prints_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location(
        "nexus_program_bench", _BENCHMARKS / "program_cache.py"
    )
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert bench.main(["--skip-scale", "--reps", "20", "--store-reps", "3"]) == 0
    out = capsys.readouterr().out
    if "cuda.core unavailable" in out:
        pytest.skip("cuda.core (the peer) is not installed; the script says so and stops")
    for name in (
        "hit 16KiB, repeated",
        "hit 16KiB, first read by this object",
        "hit 16KiB, first read, last read 1 h ago",
        "first read, fresh process, vs syscall floor",
        "compile hit: cached_compile(program)",
        "compile hit: program.compile(cache=ours)",
        "key: make_program_cache_key, repeated",
        "durable store 16KiB (fsync)",
    ):
        row = re.search(
            rf"^{re.escape(name)}.*? +([\d.]+) +([\d.]+) +([\d.]+) ", out, re.MULTILINE
        )
        assert row, (name, out)
        ours, peer, ratio = map(float, row.groups())
        assert ratio == pytest.approx(ours / peer, rel=0.1, abs=0.01)  # ours / peer
    assert re.search(r"^(all targets met|some targets missed)", out, re.MULTILINE)
    assert not list(tmp_path.glob("nexus-bench-program-*"))
