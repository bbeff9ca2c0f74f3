"""``nexus-cache demo`` explains itself: what cold means, the terms, slow scales, progress,
and a --json report that names no deleted file."""

from __future__ import annotations

import io
import json
import tempfile

import pytest

import nexus_cache.service.demo as service_demo
from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError
from nexus_cache.service.demo import QUICK_DEMO_S, estimate_demo_seconds

SMALL = ["demo", "--scale", "5", "--backend", "host"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_demo_json_names_no_deleted_temporary_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workdir"] is None
    strings = _strings(report)
    assert not [s for s in strings if "nexus-demo-" in s or tempfile.gettempdir() in s]
    by_name = {q["name"]: q for q in report["queries"]}
    assert by_name["scan"]["query"]["source"] == "lake/facts.parquet"
    assert by_name["jaccard"]["query"]["edges"]["source"] == "lake/edges.parquet"


def test_demo_json_says_which_queries_warmed_each_cold_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SMALL, "--json"]) == 0
    by_name = {q["name"]: q for q in json.loads(capsys.readouterr().out)["queries"]}
    assert by_name["scan"]["warmed_by"] == []
    assert by_name["count"]["warmed_by"] == ["scan"]
    assert by_name["pagerank"]["warmed_by"] == []
    assert by_name["pagerank-q2"]["warmed_by"] == ["pagerank"]
    assert by_name["bfs"]["warmed_by"] == ["pagerank", "pagerank-q2"]
    assert by_name["jaccard"]["warmed_by"] == ["pagerank", "pagerank-q2", "bfs"]
    # what warmed_by claims, the statuses show: count's cold read hits the lakehouse
    assert by_name["count"]["cold"]["lakehouse"] == "hit"
    assert by_name["bfs"]["cold"]["source_cache"] == "hit"
    assert by_name["pagerank-q2"]["cold"]["source_cache"] == "hit"


def test_demo_table_explains_cold_speedup_and_terms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for phrase in (
        "cold start: count after scan; pagerank-q2 after pagerank; bfs after pagerank, "
        "pagerank-q2; jaccard after pagerank, pagerank-q2, bfs:",
        "scan, pagerank start on empty caches.",
        "warm: the median of 3 more",
        "speedup: cold / warm. Near or below 1x",
        "miss-led (decoded the Parquet",
        "miss-followed (",
        "graph cache: miss (built and kept the graph)",
    ):
        assert phrase in flat


def test_estimates_mark_the_large_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    assert estimate_demo_seconds(16, "cuda") < QUICK_DEMO_S
    assert estimate_demo_seconds(28, "cuda") > QUICK_DEMO_S
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "numpy")
    assert estimate_demo_seconds(12, "host") < QUICK_DEMO_S
    assert estimate_demo_seconds(17, "host") > QUICK_DEMO_S  # NumPy's Jaccard
    pytest.importorskip("numba")
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "auto")
    assert estimate_demo_seconds(18, "host") < QUICK_DEMO_S  # compiled loops
    assert estimate_demo_seconds(22, "host") > QUICK_DEMO_S


def test_an_estimate_for_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="'tpu' is not a device backend; accepted: cuda, host"):
        estimate_demo_seconds(16, "tpu")


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scale counts as one that takes more than a few minutes."""
    monkeypatch.setattr(service_demo, "QUICK_DEMO_S", 1e-9)


def test_a_slow_scale_off_a_terminal_warns_and_runs(
    slow: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SMALL, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is True
    assert "warning: --scale 5 (512 edges) on the host backend is estimated to take" in (
        captured.err
    )
    assert "running it (no terminal to ask)" in captured.err


@pytest.mark.parametrize(("answer", "runs"), [("n\n", False), ("\n", False), ("y\n", True)])
def test_a_slow_scale_on_a_terminal_asks(
    slow: None,
    answer: str,
    runs: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stdin, stderr = _Terminal(answer), _Terminal()
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("sys.stderr", stderr)
    assert main([*SMALL, "--json"]) == (0 if runs else 1)
    assert "is estimated to take about" in stderr.getvalue()
    assert "Run it? [y/N]" in stderr.getvalue()
    out = capsys.readouterr().out
    assert bool(out) is runs
    if not runs:
        assert "demo not run" in stderr.getvalue()


def test_yes_skips_the_question(
    slow: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin, stderr = _Terminal(""), _Terminal()
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("sys.stderr", stderr)
    assert main([*SMALL, "--json", "--yes"]) == 0
    assert "Run it?" not in stderr.getvalue()
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_progress_names_the_running_query_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stderr = _Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    assert main([*SMALL, "--json"]) == 0
    drawn = stderr.getvalue()
    assert "cold run: jaccard (query 6 of 6)" in drawn
    assert "warm runs: jaccard (query 6 of 6, run 3 of 3)" in drawn
    json.loads(capsys.readouterr().out)  # stdout stays one JSON document
    monkeypatch.undo()
    assert main([*SMALL, "--json"]) == 0
    assert capsys.readouterr().err == ""  # nothing drawn off a terminal
