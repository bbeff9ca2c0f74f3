"""--json output is strict JSON, and a reader that goes away is not an error."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli._output import emit
from nexus_cache.cli.main import main


def _strict_loads(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_emit_writes_non_finite_floats_as_null() -> None:
    out = io.StringIO()
    emit({"a": [1.5, float("nan")], "b": {"c": float("-inf")}}, None, as_json=True, file=out)
    assert _strict_loads(out.getvalue()) == {"a": [1.5, None], "b": {"c": None}}


def test_scan_json_with_nan_is_strict_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"x": [1.0, float("nan"), float("inf")]}), path)
    assert main(["scan", str(path), "--json"]) == 0
    data = _strict_loads(capsys.readouterr().out)
    assert data["head"] == [{"x": 1.0}, {"x": None}, {"x": None}]  # type: ignore[index]


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": list(range(100_000))}), path)
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "NEXUS_DEVICE_BACKEND": "host", "PYTHONPATH": str(src)}
    argv = [sys.executable, "-m", "nexus_cache.cli.main", "scan", str(path), "--json"]
    proc = subprocess.Popen(
        [*argv, "--limit", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()  # the reader goes away, as `| head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1
    assert err == b""
