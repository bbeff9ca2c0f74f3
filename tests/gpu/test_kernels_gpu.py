"""The graph kernels from the program cache on the GPU, and the service's warm-up there.

Run on the GPU machine; skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nexus_cache.frames.fused_filter import FUSED_KERNELS
from nexus_cache.graph import GraphOptions, bfs, build_graph, jaccard, kernel_loads
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import QueryService, ServiceConfig
from nexus_cache.service.datagen import rmat_edges

pytestmark = pytest.mark.gpu

programs = importlib.import_module("nexus_cache._kernel_loader")


@pytest.fixture
def program_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "programs"
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(root))
    # forget the kernels this process loaded before: the next launch loads again
    monkeypatch.setattr(programs, "_functions", {})
    return root


def _results(cp: Any, vertex_dtype: str) -> tuple[Any, ...]:
    """BFS forced bottom-up (the pull kernel) and Jaccard of every edge (the
    intersection kernel), on the GPU, as host arrays."""
    edges = rmat_edges(12)
    columns = {
        "src": cp.asarray(edges["src"].to_numpy()),
        "dst": cp.asarray(edges["dst"].to_numpy()),
    }
    graph = build_graph(columns, options=GraphOptions(directed=False, vertex_dtype=vertex_dtype))
    source = int(edges["src"][0].as_py())
    tree = bfs(graph, source, direction="pull").to_arrow()
    scores = jaccard(graph).to_arrow()
    return (
        tree["distance"].to_numpy(zero_copy_only=False),
        tree["predecessor"].to_numpy(zero_copy_only=False),
        scores["jaccard"].to_numpy(),
    )


def _host_results(vertex_dtype: str) -> tuple[Any, ...]:
    edges = rmat_edges(12)
    graph = build_graph(edges, options=GraphOptions(directed=False, vertex_dtype=vertex_dtype))
    tree = bfs(graph, int(edges["src"][0].as_py()), direction="pull").to_arrow()
    return (
        tree["distance"].to_numpy(zero_copy_only=False),
        tree["predecessor"].to_numpy(zero_copy_only=False),
        jaccard(graph).to_arrow()["jaccard"].to_numpy(),
    )


@pytest.mark.parametrize("vertex_dtype", ["int32", "int64"])
def test_program_cache_kernels_give_the_cupy_compiled_results(
    program_dir: Path, monkeypatch: pytest.MonkeyPatch, vertex_dtype: str
) -> None:
    cp = pytest.importorskip("cupy")
    start = len(kernel_loads())
    ours = _results(cp, vertex_dtype)
    loaded = kernel_loads()[start:]
    assert {k.origin for k in loaded} == {"compiled"}
    assert {k.kernel.split("(")[0] for k in loaded} == {"bfs_pull", "pair_intersections"}
    # the same kernels from disk
    monkeypatch.setattr(programs, "_functions", {})
    start = len(kernel_loads())
    again = _results(cp, vertex_dtype)
    assert {k.origin for k in kernel_loads()[start:]} == {"program-cache"}
    # and compiled by CuPy, as before the program cache was used
    monkeypatch.setattr(programs, "_functions", {})

    def refused(*args: object) -> None:
        raise RuntimeError("no program cache in this test")

    monkeypatch.setattr(programs, "compile_cubin", refused)
    start = len(kernel_loads())
    before = _results(cp, vertex_dtype)
    fallback = kernel_loads()[start:]
    assert {k.origin for k in fallback} == {"cupy"}
    assert all("no program cache in this test" in (k.detail or "") for k in fallback)
    host = _host_results(vertex_dtype)
    for got in (ours, again, before):
        for a, b in zip(got[:2], host[:2], strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(got[2], host[2], rtol=0, atol=1e-12)


def test_kernels_are_built_for_the_device_s_architecture(program_dir: Path) -> None:
    cp = pytest.importorskip("cupy")
    start = len(kernel_loads())
    _results(cp, "int32")
    expected = f"sm_{cp.cuda.Device().compute_capability}"
    assert {k.arch for k in kernel_loads()[start:]} == {expected}


def _service(root: Path) -> QueryService:
    return QueryService(
        ServiceConfig(
            backend="cuda",
            cache_cap_bytes=1 << 30,
            evidence_dir=root / "evidence",
            lakehouse=LakehouseCacheConfig(
                root=root / "cache", policy="fill_before_read", max_bytes="1GiB"
            ),
        )
    )


def test_warm_up_leaves_no_byte_charged_or_allocated(tmp_path: Path, program_dir: Path) -> None:
    with _service(tmp_path) as service:
        report = service.warm_up_report()
        gc.collect()
        for device in report.devices:
            names = {k.kernel.split("(")[0] for k in device.kernels}
            assert names == {"bfs_pull", "pair_intersections", *FUSED_KERNELS}
            # 2 graph kernels x 2 offset x 2 vertex dtypes, and the fused filter's three
            assert len(device.kernels) == 8 + len(FUSED_KERNELS)
        for row in (r.to_dict() for r in service.device_cache_reports()):
            assert row["grant_count"] == 0
            assert row["cache_charged_bytes"] == 0
            assert row["source_entries"] == 0
            assert row["graph_entries"] == 0
            assert row["domain_used_bytes"] == 0
        for device_id in service.caches.device_ids:
            assert service._work[device_id].used_bytes() == 0
        assert service.admission_log.lines == []
        # a second warm-up in the same process loads nothing again
        assert all(d.kernels == () for d in service.warm_up_report().devices)


def test_a_fresh_process_after_warm_up_reads_the_program_cache(tmp_path: Path) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {
        **os.environ,
        "PYTHONPATH": src,
        "NEXUS_PROGRAM_CACHE_DIR": str(tmp_path / "programs"),
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "cache"),
    }
    origins = []
    for _ in range(2):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nexus_cache.cli.main",
                "warmup",
                "--backend",
                "cuda",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["program_cache"] == str(tmp_path / "programs")
        origins.append({k["origin"] for d in doc["devices"] for k in d["kernels"]})
    assert origins == [{"compiled"}, {"program-cache"}]
    listed = subprocess.run(
        [sys.executable, "-m", "nexus_cache.cli.main", "program-cache", "ls", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    programs_listed = {e["program"] for e in json.loads(listed.stdout)}
    # the graph kernels, the filtered scans' row compaction and the fused filter's kernels
    assert programs_listed == {
        "nexus_bfs_pull",
        "nexus_pair_intersections",
        "nexus_compact_rows",
        "nexus_fused_filter_count",
        "nexus_fused_offsets",
        "nexus_fused_gather",
    }


_WARMUP_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "warmup.py"


@pytest.mark.slow
def test_the_first_pagerank_and_bfs_after_warm_up_compile_no_kernel(tmp_path: Path) -> None:
    """A fresh process (empty CuPy kernel cache and program cache) warms up, then
    runs its first PageRank and BFS through the service (the graph cache's path,
    the result handed out of the cache's memory): no kernel file is compiled.

    benchmarks/warmup.py's run 2 is that process; it lists the kernel files each
    first query added to the two caches. Scale 18 is past the warm-up's own
    scale-16 graph, so a size-dependent launch shape would show here too."""
    done = subprocess.run(
        [
            sys.executable,
            str(_WARMUP_BENCH),
            "--backend",
            "cuda",
            "--scale",
            "18",
            "--runs",
            "2",
            "--json",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert run["backend"] == "cuda"
    compiled = {q: (run[f"{q}_compiled"], run[f"{q}_kernels"]) for q in ("pagerank", "bfs")}
    assert compiled == {"pagerank": (0, []), "bfs": (0, [])}
