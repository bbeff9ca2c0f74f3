"""The query service and its demo on the CUDA backend.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
The same assertions as the host suite: cold and warm results equal, the
statuses of each query, retries, admission refusals, evidence, and a clean
shutdown that returns the caches' device memory.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import networkx as nx
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main
from nexus_cache.errors import AdmissionError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import (
    Count,
    GraphQuery,
    QueryService,
    Scan,
    ServiceConfig,
    tables_match,
    verify_evidence,
)
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def _lake(root: Path, scale: int = 12) -> tuple[str, str, int]:
    lake = root / "lake"
    lake.mkdir()
    edges = rmat_edges(scale)
    write_parquet(edges, lake / "edges.parquet")
    write_parquet(fact_table(50_000), lake / "facts.parquet")
    return str(lake / "edges.parquet"), str(lake / "facts.parquet"), int(edges["src"][0].as_py())


def _service(root: Path, **overrides: Any) -> QueryService:
    settings: dict[str, Any] = {
        "backend": "cuda",
        "cache_cap_bytes": 1 << 30,
        "evidence_dir": root / "evidence",
        "lakehouse": LakehouseCacheConfig(
            root=root / "cache", policy="fill_before_read", max_bytes="4GiB", local_min_age_s=0.0
        ),
    }
    settings.update(overrides)
    return QueryService(ServiceConfig(**settings))


def test_service_on_cuda_cold_equals_warm_with_expected_statuses(tmp_path: Path) -> None:
    edges, facts, source = _lake(tmp_path)
    edge_scan = Scan(edges, columns=("src", "dst"))
    mix = [
        Scan(facts),
        Count(facts),
        GraphQuery(edge_scan, "src", "dst", "pagerank"),
        GraphQuery(edge_scan, "src", "dst", "bfs", params={"source": source}),
        GraphQuery(edge_scan, "src", "dst", "jaccard", directed=False),
    ]
    with _service(tmp_path) as service:
        assert service.backend.name == "cuda"
        cold = [service.execute(q) for q in mix]
        warm = [service.execute(q) for q in mix]
        reports = service.device_cache_reports()
    for c, w in zip(cold, warm, strict=True):
        assert tables_match(c.table, w.table)
        assert w.diagnostics.lakehouse["status"] == "hit"
    assert cold[0].diagnostics.lakehouse["status"] == "miss"
    assert cold[1].diagnostics.source_cache["status"] == "bypass"
    assert cold[0].diagnostics.source_cache["status"] == "miss-led"
    assert cold[2].diagnostics.source_cache["status"] == "miss-led"
    for result in cold[2:]:
        assert result.diagnostics.graph_cache["status"] == "miss"
    for result in warm[2:]:
        assert result.diagnostics.source_cache["status"] == "hit"
        assert result.diagnostics.graph_cache["status"] == "hit"
    assert reports[0].ledger.grant_bytes == 0
    assert verify_evidence(tmp_path / "evidence").ok


@contextlib.contextmanager
def _no_default_pool() -> Iterator[list[int]]:
    """Record every allocation that reaches CuPy's default pool (outside any domain)."""
    import cupy

    gc.collect()
    pool = cupy.get_default_memory_pool()
    escaped: list[int] = []

    def guard(size: int) -> Any:
        escaped.append(size)
        return pool.malloc(size)

    cupy.cuda.set_allocator(guard)
    try:
        yield escaped
    finally:
        cupy.cuda.set_allocator(pool.malloc)


def test_attempts_allocate_only_in_domains(tmp_path: Path) -> None:
    edges, facts, source = _lake(tmp_path, scale=10)
    edge_scan = Scan(edges, columns=("src", "dst"))
    mix = [
        Scan(facts),
        GraphQuery(edge_scan, "src", "dst", "pagerank"),
        GraphQuery(edge_scan, "src", "dst", "bfs", params={"source": source}),
        GraphQuery(edge_scan, "src", "dst", "cosine", directed=False),
    ]
    with _service(tmp_path) as service:
        for query in mix:  # first run outside the guard: kernels compile, modules load
            service.execute(query)
        with _no_default_pool() as escaped:
            for query in mix:
                service.execute(query)
    assert escaped == [], f"allocations escaped to CuPy's default pool: {escaped}"


def test_pagerank_on_cuda_agrees_with_networkx(tmp_path: Path) -> None:
    edges, _, _ = _lake(tmp_path, scale=9)
    with _service(tmp_path) as service:
        result = service.execute(
            GraphQuery(Scan(edges), "src", "dst", "pagerank", params={"tol": 1e-9})
        )
    table = pq.read_table(edges)
    # the service counts a repeated edge as often as it appears (MultiDiGraph)
    graph = nx.MultiDiGraph()
    graph.add_edges_from(zip(table["src"].to_pylist(), table["dst"].to_pylist(), strict=True))
    expected = nx.pagerank(graph, tol=1e-12, max_iter=1000)
    got = dict(
        zip(result.table["vertex"].to_pylist(), result.table["pagerank"].to_pylist(), strict=True)
    )
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6


def test_admission_refusal_on_cuda_names_the_numbers(tmp_path: Path) -> None:
    _, facts, _ = _lake(tmp_path, scale=6)
    service = _service(tmp_path, min_grant_bytes="100TiB")
    with service, pytest.raises(AdmissionError, match="can never be admitted"):
        service.execute(Scan(facts))


def test_shutdown_releases_the_cache_domain(tmp_path: Path) -> None:
    edges, _, _ = _lake(tmp_path, scale=10)
    service = _service(tmp_path)
    service.execute(GraphQuery(Scan(edges), "src", "dst", "pagerank"))
    results = service.shutdown()
    assert all(r.complete for r in results)
    assert service.shutdown() is results
    assert service.caches.factory(0).released


def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "cuda", "--scale", "14", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["backend"] == "cuda"
    assert report["warmup_s"] > 0  # timed apart from the cold column
    assert [q["name"] for q in report["queries"]] == [
        "scan",
        "count",
        "pagerank",
        "pagerank-q2",  # PageRank on a time window of the edges: a filtered table read
        "bfs",
        "jaccard",
    ]
    for query in report["queries"]:
        assert query["equal"] is True
        assert query["warm"]["lakehouse"] == "hit"


def test_two_gpus_pinned_queries_agree_and_shutdown_returns_both_devices(tmp_path: Path) -> None:
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")

    def used(device: int) -> int:
        with cp.cuda.Device(device):
            free, total = cp.cuda.runtime.memGetInfo()
        return int(total - free)

    edges, facts, source = _lake(tmp_path)
    scan = Scan(edges, columns=("src", "dst"))
    queries = [
        Scan(facts, columns=("order_id", "amount")),
        GraphQuery(scan, "src", "dst", "pagerank"),
        GraphQuery(scan, "src", "dst", "bfs", params={"source": source}),
    ]
    # single-GPU results on each device; this also creates each device's
    # library handles (cuSPARSE, ...) before the memory baseline is taken
    singles = {}
    for device in (0, 1):
        with _service(tmp_path / f"one{device}", devices=[device]) as single:
            singles[device] = [single.execute(q).table for q in queries]
    expected = singles[0]
    for got, table in zip(singles[1], expected, strict=True):
        assert tables_match(got, table)
    gc.collect()
    before = [used(0), used(1)]
    service = _service(tmp_path / "two", devices=[0, 1])
    results: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def run(device: int) -> None:
        try:
            for _ in range(2):  # cold, then warm
                results[device].extend(service.execute(q, device=device) for q in queries)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    for device in (0, 1):
        assert [r.diagnostics.device_id for r in results[device]] == [device] * 6
        for result, table in zip(results[device], expected * 2, strict=True):
            assert tables_match(result.table, table)
    shutdown = service.shutdown(timeout=30)
    assert [d.device_id for d in shutdown] == [0, 1]
    assert all(d.complete for d in shutdown)
    results.clear()
    gc.collect()
    assert [used(0), used(1)] == before
