"""Smoke test of benchmarks/graph.py: a tiny host run prints every ratio line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_host_run_prints_every_ratio_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Loaded from its file under a unique name: "graph" is tests/graph here.
    spec = importlib.util.spec_from_file_location("nexus_graph_bench", _BENCHMARKS / "graph.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--backend", "host", "--scale", "9", "--repeats", "1", "--bfs-roots", "2"]
    assert bench.main([*args, "--workdir", str(tmp_path), "--peer-scales", "8"]) == 0
    out = capsys.readouterr().out
    assert "read Parquet onto the device" in out
    for figure in (
        "CSR build, first call",
        "CSR build, warm",
        "PageRank per iteration",
        r"BFS TEPS \(2 roots\)",
        r"Jaccard \(\d+ sampled edges\)",
        *(f"cache {a}, end to end" for a in ("bfs", "pagerank", "jaccard", "cosine")),
    ):
        assert re.search(rf"^RATIO {figure}: ours .* = \d", out, re.MULTILINE), figure
    # The side by side: a peer that is not installed is skipped, ours always runs.
    for figure in ("PageRank", "BFS from one root", "Jaccard, every edge", "Cosine, every edge"):
        assert re.search(rf"^RATIO scale 8 {figure}.*: ours \d", out, re.MULTILINE), figure
    for peer in ("networkit", "igraph"):
        installed = importlib.util.find_spec(peer) is not None
        assert (f"# {peer} is not installed: skipped" in out) is not installed
