"""The demo's filtered query: PageRank on a time window of the edges, after the
unfiltered PageRank over the same columns (a source hit, a graph miss)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main
from nexus_cache.service.demo import WINDOW, WINDOW_QUERY, run_demo


def test_the_demo_runs_pagerank_on_a_time_window_from_the_cached_source(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    report = run_demo(scale=5, backend="host", warm_runs=1, workdir=work)
    assert report.ok
    names = [q.name for q in report.queries]
    assert names.index(WINDOW_QUERY) == names.index("pagerank") + 1
    by_name = {q.name: q for q in report.queries}
    window = by_name[WINDOW_QUERY]
    plain = by_name["pagerank"]
    assert window.query["edges"]["columns"] == plain.query["edges"]["columns"]
    assert window.query["edges"]["filter"] == [[list(p) for p in WINDOW]]
    assert plain.query["edges"]["filter"] is None
    # cold: the columns the unfiltered PageRank decoded, a graph of its own
    assert window.cold["source_cache"] == "hit"
    assert window.cold["graph_cache"] == "miss"
    assert window.warm["graph_cache"] == "hit"
    assert window.warmed_by == ("pagerank",)
    # one rank per vertex of the window's edges
    edges = pq.read_table(work / "lake" / "edges.parquet")
    ts = edges["ts"].cast("int64").to_numpy() // 1000  # stored in milliseconds
    keep = (ts >= 1743465600) & (ts < 1751328000)  # 2025-04-01 .. 2025-07-01
    assert 0 < keep.sum() < edges.num_rows
    vertices = set(edges["src"].to_numpy()[keep]) | set(edges["dst"].to_numpy()[keep])
    assert window.rows == len(vertices)
    assert window.rows < plain.rows


def test_the_demo_notes_say_why_the_filtered_cold_run_is_a_source_hit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--scale", "5", "--backend", "host", "--workdir", str(tmp_path / "w")]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"filtered: {WINDOW_QUERY} is PageRank on the edges where ts >= 2025-04-01" in text
    assert "source-cache hit" in text
    assert "graph-cache miss" in text
