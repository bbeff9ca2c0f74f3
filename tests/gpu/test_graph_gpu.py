"""nexus_cache.graph on CuPy: the host NetworkX agreement suites, plus GPU-only paths.

Runs the checks of tests/graph/_checks.py with ``xp = cupy`` (same random
graphs, same tolerances), and compares the GPU kernels (bottom-up BFS,
sorted-slice search) with the host results on larger graphs. Run on the GPU
machine; skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from nexus_cache.graph import GraphOptions, bfs, build_graph, jaccard, pagerank
from nexus_cache.service import tables_match

pytestmark = pytest.mark.gpu


def _load_checks() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "graph" / "_checks.py"
    spec = importlib.util.spec_from_file_location("nexus_graph_checks", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load_checks()


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


SEEDS = range(4)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(),
        GraphOptions(directed=False, duplicates="max"),
        GraphOptions(drop_self_loops=True, duplicates="min", orientation="transposed"),
        GraphOptions(directed=False, vertex_dtype="int64", weight_dtype="float64"),
    ],
    ids=["directed", "undirected-max", "transposed-min", "undirected-64"],
)
@pytest.mark.parametrize("ids", ["huge", "dense"])
def test_csr_matches_networkx(cp: Any, seed: int, options: GraphOptions, ids: str) -> None:
    checks.check_build(cp, seed, options, ids=ids)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("direction", ["auto", "push", "pull"])
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(),
        GraphOptions(directed=False),
        GraphOptions(orientation="transposed", vertex_dtype="int64"),
    ],
    ids=["directed", "undirected", "transposed64"],
)
def test_bfs_matches_networkx(cp: Any, seed: int, direction: str, options: GraphOptions) -> None:
    checks.check_bfs(cp, seed, options, direction=direction, sources=1 + seed % 3)
    checks.check_bfs(cp, seed, options, direction=direction, depth_limit=1, n=200, m=3000)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("directed", [False, True])
def test_pagerank_matches_networkx(cp: Any, seed: int, weighted: bool, directed: bool) -> None:
    checks.check_pagerank(cp, seed, GraphOptions(directed=directed), weighted=weighted)
    options = GraphOptions(directed=directed, weight_dtype="float64")
    checks.check_pagerank(cp, seed, options, weighted=weighted, personalize=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("metric", ["jaccard", "sorensen", "overlap", "cosine"])
def test_similarity_matches_definition(cp: Any, seed: int, metric: str) -> None:
    checks.check_similarity(cp, seed, metric, all_edges=True, drop_self_loops=seed % 2 == 1)
    checks.check_similarity(cp, seed, metric, directed=True)
    checks.check_similarity(cp, seed, metric, all_edges=True, max_temp_bytes=1, n=300, m=6000)


def _rmat_like(seed: int, scale: int, edges: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 1 << scale
    # Skewed endpoints (hubs), as R-MAT gives, without the generator.
    src = (rng.pareto(1.2, edges) * 50).astype(np.int64) % n
    dst = rng.integers(0, n, edges)
    return {"src": src, "dst": dst}


@pytest.mark.parametrize("seed", range(3))
def test_gpu_bfs_equals_host_on_a_large_graph(cp: Any, seed: int) -> None:
    edges = _rmat_like(seed, 16, 1 << 20)
    options = GraphOptions(directed=False)
    host = build_graph(edges, options=options)
    device = build_graph({k: cp.asarray(v) for k, v in edges.items()}, options=options)
    for got, want in zip(device.arrays(), host.arrays(), strict=True):
        assert np.array_equal(got.get(), want)
    source = int(edges["src"][0])
    want = bfs(host, [source]).to_arrow()
    for direction in ("auto", "pull"):
        got = bfs(device, [source], direction=direction).to_arrow()
        assert got.column("distance").equals(want.column("distance"))
    # Predecessors may differ; each must be a neighbour one level closer.
    table = bfs(device, [source]).to_arrow().to_pydict()
    dist = dict(zip(table["vertex"], table["distance"], strict=True))
    ids = host.vertex_ids
    rows = zip(table["vertex"], table["distance"], table["predecessor"], strict=True)
    for v, d, p in list(rows)[:2000]:
        if d:
            i = int(np.searchsorted(ids, v))
            row = ids[host.indices[host.indptr[i] : host.indptr[i + 1]]]
            assert p in set(row.tolist())
            assert dist[p] == d - 1


def test_gpu_pagerank_and_jaccard_equal_host(cp: Any) -> None:
    edges = _rmat_like(7, 14, 1 << 17)
    options = GraphOptions(directed=True, weight_dtype="float64")
    host = build_graph(edges, options=options)
    device = build_graph({k: cp.asarray(v) for k, v in edges.items()}, options=options)
    want = pagerank(host, tol=1e-10).to_arrow().column("pagerank").to_numpy()
    got = pagerank(device, tol=1e-10).to_arrow().column("pagerank").to_numpy()
    np.testing.assert_allclose(got, want, atol=1e-9)
    undirected = GraphOptions(directed=False)
    host_u = build_graph(edges, options=undirected)
    device_u = build_graph({k: cp.asarray(v) for k, v in edges.items()}, options=undirected)
    want_j = jaccard(host_u).to_arrow()
    got_j = jaccard(device_u, max_temp_bytes="1M").to_arrow()
    assert got_j.column("first").equals(want_j.column("first"))
    np.testing.assert_allclose(
        got_j.column("jaccard").to_numpy(), want_j.column("jaccard").to_numpy(), rtol=1e-12
    )


def _cuda_caches(cap: int = 2 << 30) -> Any:
    from nexus_cache.device import DeviceProfile, DeviceResidentCaches

    return DeviceResidentCaches([DeviceProfile(0, cap)], backend="cuda")


@pytest.mark.parametrize(
    ("algorithm", "params"),
    [("bfs", {"sources": [3]}), ("pagerank", {}), ("jaccard", {}), ("cosine", {})],
)
def test_cache_hit_after_miss_on_the_gpu(cp: Any, algorithm: str, params: dict) -> None:
    from nexus_cache.device import GraphRunStatus, plan_graph_run

    edges = {k: cp.asarray(v) for k, v in _rmat_like(11, 12, 1 << 16).items()}
    edges["src"][0] = 3  # a known BFS source
    plan = plan_graph_run(algorithm, source=("gpu-test", 11), options=GraphOptions(directed=False))
    with _cuda_caches() as caches:
        cache = caches.graph_cache(0)
        domain = caches.factory(0).domain
        miss = cache.run(plan, edges, **params)
        hit = cache.run(plan, edges, **params)
        assert (miss.status, hit.status) == (GraphRunStatus.MISS, GraphRunStatus.HIT)
        # GPU reductions do not fix their summation order: floats agree within tolerance.
        assert tables_match(hit.result.to_arrow(), miss.result.to_arrow())
        assert hit.drift_bytes == 0
        snap = caches.ledger(0).snapshot()
        assert snap.cache_reserved_bytes == snap.cache_pinned_in_use_bytes == 0
        # Only the parked graph stays live in the cache pool, and it is what is charged.
        assert domain.used_bytes() == snap.cache_evictable_resident_bytes > 0
        # ... while the results are alive: they live in the attempt's memory.
        assert hit.result.num_rows > 0


def test_cache_drift_on_the_gpu_destroys_the_graph(
    cp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from nexus_cache.device import GraphRunStatus, plan_graph_run

    ranking = importlib.import_module("nexus_cache.graph.ranking")
    edges = {k: cp.asarray(v) for k, v in _rmat_like(12, 12, 1 << 16).items()}
    plan = plan_graph_run("pagerank", source=("gpu-test", 12))
    leaked: list[Any] = []

    def leaky(graph: Any, **params: Any) -> Any:
        leaked.append(cp.empty(1 << 20, cp.uint8))  # allocated inside the cache domain's scope
        return pagerank(graph, **params)

    with _cuda_caches() as caches:
        cache = caches.graph_cache(0)
        assert cache.run(plan, edges).status is GraphRunStatus.MISS
        monkeypatch.setattr(ranking, "pagerank", leaky)
        run = cache.run(plan, edges)
        assert run.status is GraphRunStatus.HIT
        assert run.drift_bytes >= 1 << 20
        assert cache.stats().entries == 0
        assert caches.ledger(0).snapshot().cache_charged_bytes == 0
        leaked.clear()
