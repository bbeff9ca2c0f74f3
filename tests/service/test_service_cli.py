"""The commands: demo (small scale, --json), scan, graph, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main

from ._helpers import make_lake


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "fill_before_read")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1GiB")
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", str(1 << 30))
    return tmp_path


def test_demo_json_at_small_scale(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scale", "8", "--backend", "host", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["backend"] == "host"
    assert report["edges"] == 16 << 8
    names = [q["name"] for q in report["queries"]]
    assert names == ["scan", "count", "pagerank", "bfs", "jaccard"]
    by_name = {q["name"]: q for q in report["queries"]}
    for query in report["queries"]:
        assert query["equal"] is True
        assert query["cold_s"] > 0
        assert query["warm_s"] > 0
        assert query["warm"]["lakehouse"] == "hit"
        assert query["warm"]["attempts"] == 1
    assert by_name["scan"]["cold"]["lakehouse"] == "miss"
    assert by_name["pagerank"]["cold"]["lakehouse"] == "miss"
    assert by_name["scan"]["cold"]["source_cache"] == "miss-led"
    assert by_name["pagerank"]["cold"]["source_cache"] == "miss-led"
    for name in ("scan", "pagerank", "bfs", "jaccard"):
        assert by_name[name]["warm"]["source_cache"] == "hit"
        assert by_name[name]["warm"]["lakehouse_read"] is False
    for name in ("pagerank", "bfs", "jaccard"):
        assert by_name[name]["cold"]["graph_cache"] == "miss"
        assert by_name[name]["warm"]["graph_cache"] == "hit"
    assert by_name["count"]["cold"]["source_cache"] == "bypass"
    assert by_name["count"]["warm"]["source_cache"] == "bypass"
    assert by_name["scan"]["cold"]["graph_cache"] == "not_applicable"
    assert by_name["count"]["rows"] == 1
    assert by_name["scan"]["rows"] == 16 << 8
    (device,) = report["device_cache_reports"]
    assert device["backend"] == "host"
    assert device["caches_installed"] is True
    assert device["grant_bytes"] == 0  # every grant was released


def test_demo_table_and_kept_workdir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    argv = ["demo", "--scale", "6", "--backend", "host", "--workdir", str(work)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "every warm result equals its cold result" in out
    for word in ("query", "cold", "warm", "speedup", "lakehouse", "pagerank", "jaccard", "device"):
        assert word in out
    assert "miss→hit" in out
    assert main(["evidence", "verify", str(work / "evidence")]) == 0
    assert (work / "lake" / "edges.parquet").is_file()
    assert pq.ParquetFile(work / "lake" / "edges.parquet").num_row_groups > 1


def test_scan_prints_rows_and_writes_parquet(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = make_lake(env)
    assert main(["scan", lake.facts, "--columns", "order_id,region", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "order_id" in out
    assert "region" in out
    assert "amount" not in out
    assert "4000 rows" in out
    assert "lakehouse miss" in out
    target = env / "out.parquet"
    assert main(["scan", lake.facts, "--out", str(target), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == 4000
    assert data["diagnostics"]["lakehouse"]["status"] == "hit"
    assert pq.read_table(target).num_rows == 4000


def test_graph_command(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = make_lake(env)
    argv = ["graph", "bfs", lake.edges, "--src", "src", "--dst", "dst"]
    assert main([*argv, "--source", str(lake.bfs_source), "--json", "--limit", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["columns"] == ["vertex", "distance", "predecessor"]
    assert data["diagnostics"]["query"]["directed"] is True
    assert {row["distance"] for row in data["head"]} >= {0} or data["head"]
    out = env / "jaccard.parquet"
    argv = ["graph", "jaccard", lake.edges, "--src", "src", "--dst", "dst", "--out", str(out)]
    assert main(argv) == 0
    assert pq.read_table(out).column_names == ["first", "second", "jaccard"]
    assert "written to" in capsys.readouterr().out


def test_command_errors_are_one_line(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = make_lake(env)
    capsys.readouterr()
    assert main(["graph", "bfs", lake.edges, "--src", "src", "--dst", "dst"]) == 2
    assert "required for bfs" in capsys.readouterr().err
    argv = ["graph", "pagerank", lake.edges, "--src", "src", "--dst", "dst", "--source", "1"]
    assert main(argv) == 2
    assert "--source does not apply to pagerank" in capsys.readouterr().err
    assert main(["scan", lake.facts, "--columns", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nope" in err
    assert main(["scan", str(env / "missing.parquet")]) != 0
    assert "does not exist" in capsys.readouterr().err
    assert main(["demo", "--scale", "0"]) == 2
    assert "--scale" in capsys.readouterr().err


def test_device_option_pins_the_query(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = make_lake(env)
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", "2")
    capsys.readouterr()
    assert main(["scan", lake.facts, "--device", "1", "--json", "--limit", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["diagnostics"]["device_id"] == 1
    assert main(["scan", lake.facts, "--device", "7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "device=7" in err
