"""Smoke test of benchmarks/graph.py: a tiny host run prints every ratio line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load() -> ModuleType:
    # Loaded from its file under a unique name: "graph" is tests/graph here.
    spec = importlib.util.spec_from_file_location("nexus_graph_bench", _BENCHMARKS / "graph.py")
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_host_run_prints_every_ratio_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load()
    args = ["--backend", "host", "--scale", "9", "--repeats", "1", "--bfs-roots", "2"]
    # a --workdir that does not exist yet is made (it crashed in mkdtemp)
    workdir = tmp_path / "not" / "yet"
    assert bench.main([*args, "--workdir", str(workdir), "--peer-scales", "8"]) == 0
    assert workdir.is_dir()
    assert not any(workdir.iterdir())  # the Parquet file's temporary directory is gone
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


def test_peers_only_without_host_backend_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # It printed nothing and exited 0: the side by side runs only with --backend host.
    with pytest.raises(SystemExit) as exc:
        _load().main(["--peers-only", "--peer-scales", "8"])
    assert exc.value.code == 2
    assert "--peers-only runs the host side by side: add --backend host" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_default_cuda_backend_without_cupy_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # It died with a ModuleNotFoundError traceback from inside the run.
    with pytest.raises(SystemExit) as exc:
        _load().main(["--scale", "8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "needs CuPy" in err
    assert "use --backend host" in err
