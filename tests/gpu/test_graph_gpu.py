"""nexus_cache.graph on CuPy: the host NetworkX agreement suites, plus GPU-only paths.

Runs the checks of tests/graph/_checks.py with ``xp = cupy`` (same random
graphs, same tolerances), and compares the GPU kernels (bottom-up BFS,
sorted-slice search) with the host results on larger graphs. Edge cases:
an empty edge table through the resident graph cache on both CUDA domain
kinds (a CuPy pool, an RMM pool; the checks of tests/device/_graph_checks.py),
empty pair lists (no zero-sized kernel launch), float32 weights near their
limit, and PageRank's convergence rules on a 335,722-vertex R-MAT graph. Run
on the GPU machine; skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.graph import GraphOptions, bfs, build_graph, jaccard, pagerank, similarity
from nexus_cache.service import tables_match

pytestmark = pytest.mark.gpu


def _load(relative: str, name: str) -> ModuleType:
    # tests/gpu is not a package: load the shared checks by path.
    path = Path(__file__).resolve().parent.parent / relative
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _load("graph/_checks.py", "nexus_graph_checks")
cache_checks = _load("device/_graph_checks.py", "nexus_device_graph_checks")


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
@pytest.mark.parametrize("direction", ["total", "out", "in"])
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(duplicates="max"),
        GraphOptions(duplicates="keep", orientation="transposed", vertex_dtype="int64"),
        GraphOptions(directed=False, duplicates="max"),
        GraphOptions(directed=False, duplicates="keep"),
    ],
    ids=["directed", "transposed-multi-64", "undirected", "undirected-multi"],
)
def test_degree_matches_networkx(
    cp: Any, seed: int, direction: str, options: GraphOptions
) -> None:
    checks.check_degree(cp, seed, options, direction)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(directed=False, duplicates="max"),
        GraphOptions(directed=False, drop_self_loops=True, vertex_dtype="int64"),
    ],
    ids=["max", "no-loops-int64"],
)
def test_triangles_match_networkx(cp: Any, seed: int, options: GraphOptions) -> None:
    checks.check_triangles(cp, seed, options)
    checks.check_triangles(cp, seed, options, n=60, m=900)


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


# -- edge cases: empty graphs on both CUDA domain kinds, extreme weights, convergence --


@pytest.fixture(params=["cupy", "rmm"])
def caches(request: pytest.FixtureRequest, cp: Any) -> Iterator[Any]:
    """Resident caches on device 0 whose domains are of the kind under test."""
    from nexus_cache.backends.cuda import CudaBackend
    from nexus_cache.device import DeviceProfile, DeviceResidentCaches

    if request.param == "rmm":
        pytest.importorskip("rmm")
    backend = CudaBackend(allocator=request.param)
    with DeviceResidentCaches([DeviceProfile(0, 256 << 20)], backend=backend) as c:
        yield c
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("on_device", [True, False], ids=["cupy-edges", "arrow-edges"])
def test_an_empty_edge_table_runs_through_the_graph_cache(
    cp: Any, caches: Any, on_device: bool
) -> None:
    edges: Any = cache_checks.empty_edges()  # a cached miss copies host edges to the device
    if on_device:
        edges = {"src": cp.zeros(0, cp.int64), "dst": cp.zeros(0, cp.int64)}
    cache_checks.check_empty_edge_table(caches, edges, ("gpu-empty", on_device))


def test_a_graph_of_vertices_without_arcs_on_the_gpu(cp: Any, caches: Any) -> None:
    loops = {"src": cp.asarray([5, 9]), "dst": cp.asarray([5, 9])}
    cache_checks.check_vertices_without_arcs(caches, loops, ("gpu-loops",))


@pytest.mark.parametrize("metric", ["jaccard", "sorensen", "overlap", "cosine"])
def test_no_pairs_give_an_empty_similarity_on_the_gpu(cp: Any, metric: str) -> None:
    graph = build_graph({"src": cp.asarray([1, 2]), "dst": cp.asarray([2, 3])})
    empty = build_graph({"src": cp.zeros(0, cp.int64), "dst": cp.zeros(0, cp.int64)})
    for g, pairs in [(graph, ([], [])), (graph, (cp.zeros(0, cp.int64),) * 2), (empty, None)]:
        table = similarity(g, metric, pairs).to_arrow()
        assert table.num_rows == 0
        assert table.schema.field(metric).type == pa.float64()


def test_float32_weights_near_their_limit_keep_the_rank_mass_on_the_gpu(cp: Any) -> None:
    edges = {
        "src": cp.asarray([0, 0, 0, 1, 2, 3]),
        "dst": cp.asarray([1, 2, 3, 0, 0, 0]),
        "w": cp.asarray([2e38, 2e38, 1, 1, 1, 1], dtype=cp.float32),
    }
    on_gpu = pagerank(build_graph(edges, weight="w"), tol=1e-8, max_iter=1000)
    host_edges = {k: cp.asnumpy(v) for k, v in edges.items()}
    on_host = pagerank(build_graph(host_edges, weight="w"), tol=1e-8, max_iter=1000)
    got = cp.asnumpy(on_gpu["pagerank"]).astype(np.float64)
    assert got.sum() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(got, np.asarray(on_host["pagerank"], np.float64), atol=1e-5)


@pytest.fixture(scope="module")
def rmat_gpu(cp: Any) -> tuple[Any, np.ndarray]:
    from nexus_cache.service.datagen import rmat_edges

    table = rmat_edges(19)  # 335,722 vertices, 8.4 M edges
    edges = {name: cp.asarray(table.column(name).to_numpy()) for name in ("src", "dst")}
    graph = build_graph(edges, options=GraphOptions(orientation="transposed"))
    reference = pagerank(graph, tol=1e-13, max_iter=1000, dtype="float64")
    assert reference.info["converged"] is True
    return graph, cp.asnumpy(reference["pagerank"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pagerank_converges_by_default_on_the_gpu(rmat_gpu: tuple, dtype: str) -> None:
    graph, reference = rmat_gpu
    result = pagerank(graph, dtype=dtype)
    got = result["pagerank"].get().astype(np.float64)
    assert result.info["converged"] is True
    assert result.info["error"] < 1e-6
    assert np.abs(got - reference).sum() < 2e-6
    assert np.max(np.abs(got - reference) / reference) < 1e-3


def test_the_networkx_rule_stops_early_on_the_gpu(rmat_gpu: tuple) -> None:
    graph, reference = rmat_gpu
    result = pagerank(graph, convergence="networkx", dtype="float64")
    got = result["pagerank"].get()
    assert result.info["iterations"] <= 3
    assert np.max(np.abs(got - reference) / reference) > 0.5  # what the rule costs
