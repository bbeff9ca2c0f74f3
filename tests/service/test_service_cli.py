"""The commands: demo (small scale, --json), scan, graph, and their errors."""

from __future__ import annotations

import json
import re
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
    assert names == ["scan", "count", "pagerank", "pagerank-q2", "bfs", "jaccard"]
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
    for name in ("scan", "pagerank", "pagerank-q2", "bfs", "jaccard"):
        assert by_name[name]["warm"]["source_cache"] == "hit"
        assert by_name[name]["warm"]["lakehouse_read"] is False
    for name in ("pagerank", "pagerank-q2", "bfs", "jaccard"):
        assert by_name[name]["cold"]["graph_cache"] == "miss"
        assert by_name[name]["warm"]["graph_cache"] == "hit"
    # the filtered PageRank reads the columns the unfiltered one decoded
    assert by_name["pagerank-q2"]["cold"]["source_cache"] == "hit"
    assert by_name["count"]["cold"]["source_cache"] == "bypass"
    assert by_name["count"]["warm"]["source_cache"] == "bypass"
    assert by_name["scan"]["cold"]["graph_cache"] == "not_applicable"
    assert by_name["count"]["rows"] == 1
    assert by_name["scan"]["rows"] == 16 << 8
    (device,) = report["device_cache_reports"]
    assert device["backend"] == "host"
    assert device["caches_installed"] is True
    assert device["grant_bytes"] == 0  # every grant was released


def test_demo_leaves_nothing_in_the_temporary_directory(tmp_path: Path) -> None:
    # The lakehouse wrote its read summary at interpreter exit under the removed
    # temporary root, recreating /tmp/nexus-demo-*/cache/stats on every run.
    import os
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path), "NEXUS_DEVICE_BACKEND": "host"}
    run = subprocess.run(
        [sys.executable, "-m", "nexus_cache.cli.main", "demo", "--scale", "3", "--json"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode()
    assert json.loads(run.stdout)["ok"] is True
    assert list(tmp_path.iterdir()) == []


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


def test_demo_warms_up_before_the_cold_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.service import QueryService
    from nexus_cache.service.demo import run_demo

    events: list[str] = []
    warm_up, execute = QueryService.warm_up, QueryService.execute

    def recorded_warm_up(self: QueryService) -> float:
        events.append("warm-up")
        warm_up(self)
        # a compile this long must not show in the cold column (an hour: no cold
        # query comes near it, on a loaded host either)
        return 3600.0

    def recorded_execute(self: QueryService, *args: object, **kwargs: object) -> object:
        events.append("query")
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(QueryService, "warm_up", recorded_warm_up)
    monkeypatch.setattr(QueryService, "execute", recorded_execute)
    report = run_demo(scale=5, backend="host", warm_runs=1, workdir=tmp_path / "work")
    assert events[0] == "warm-up"
    assert events.count("warm-up") == 1
    assert report.warmup_s == 3600.0
    assert report.to_dict()["warmup_s"] == 3600.0
    assert all(q.cold_s < 3600.0 for q in report.queries)


def test_demo_prints_the_warm_up_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--scale", "5", "--backend", "host", "--workdir", str(tmp_path / "w")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [x for x in lines if x.startswith("compile/warm-up: ")]
    assert "not part of the cold times" in line
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warmup_s"] > 0


def test_warmup_command_prints_time_and_steps(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["warmup"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"warm-up: \d+\.\d\d s on 1 device \(host backend\), \d+ steps; "
        r"the host backend compiles nothing\n",
        out,
    )


def test_warmup_command_json(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(env / "programs"))
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", "2")
    assert main(["warmup", "--backend", "host", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "host"
    assert doc["seconds"] > 0
    assert doc["program_cache"] == str(env / "programs")
    assert [d["device_id"] for d in doc["devices"]] == [0, 1]
    for device in doc["devices"]:
        assert device["kernels"] == []
        assert "bfs (undirected)" in device["steps"]
        assert "decode" in device["steps"]
    assert not (env / "programs").exists()  # the host backend compiles nothing


def test_warmup_command_errors_are_one_line(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["warmup", "--backend", "tpu"])
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert main(["warmup", "--backend", "cuda"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("nexus-cache: error: ")
        assert len(err.strip().splitlines()) == 1


def test_warmup_table_lists_each_kernel_and_where_it_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from nexus_cache.cli._output import emit
    from nexus_cache.cli.warmup import _table
    from nexus_cache.graph import KernelLoad
    from nexus_cache.service import DeviceWarmUp, WarmUpReport

    loads = (
        KernelLoad("bfs_pull(int32, int32)", 0, "sm_90", "program-cache", 0.0004),
        KernelLoad("pair_intersections(int32, int64)", 0, "sm_90", "compiled", 0.091),
        KernelLoad("bfs_pull(int64, int64)", 1, None, "cupy", 0.35, "ModuleNotFoundError: x"),
    )
    report = WarmUpReport(
        "cuda",
        2.5,
        (
            DeviceWarmUp(0, 1.5, ("decode",), loads[:2]),
            DeviceWarmUp(1, 1.0, ("decode",), loads[2:]),
        ),
    )
    emit(None, _table(report, "/cache/programs"), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    rows = lines[lines.index("") + 3 : -2]  # below the title, the header and its rule
    assert [r.split()[:3] for r in rows] == [
        ["0", "bfs_pull(int32,", "int32)"],
        ["0", "pair_intersections(int32,", "int64)"],
        ["1", "bfs_pull(int64,", "int64)"],
    ]
    assert "sm_90    program cache (no compile)" in rows[0]
    assert "sm_90    compiled, stored in the program cache" in rows[1]
    assert "-        compiled by CuPy (ModuleNotFoundError: x)" in rows[2]
    assert lines[-1] == (
        "warm-up: 2.50 s on 2 devices (cuda backend), 2 steps; 3 kernels newly loaded: "
        "1 from the program cache, 1 compiled, 1 compiled by CuPy; "
        "program cache: /cache/programs"
    )
