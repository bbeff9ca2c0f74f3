"""Graph edge cases on the GPU: an empty edge table through the resident graph
cache on both CUDA domain kinds (a CuPy pool, an RMM pool), empty pair lists
(no zero-sized kernel launch), float32 weights near their limit, and
PageRank's convergence rules on a 300k-vertex R-MAT graph.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.errors import GraphInputError
from nexus_cache.graph import GraphOptions, build_graph, pagerank, similarity

pytestmark = pytest.mark.gpu

EMPTY_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("pagerank", {}),
    ("jaccard", {}),
    ("sorensen", {"pairs": ([], [])}),
    ("overlap", {}),
    ("cosine", {"pairs": ([], [])}),
]


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


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
    from nexus_cache.device import GraphRunStatus, plan_graph_run, run_graph

    host = pa.table({"src": pa.array([], pa.int64()), "dst": pa.array([], pa.int64())})
    edges: Any = host
    if on_device:
        edges = {"src": cp.zeros(0, cp.int64), "dst": cp.zeros(0, cp.int64)}
    cache = caches.graph_cache(0)
    domain = caches.factory(0).domain
    statuses = []
    for algorithm, params in EMPTY_RUNS:
        # one construction contract: every algorithm shares one parked graph
        plan = plan_graph_run(
            algorithm, source=("gpu-empty", on_device), options=GraphOptions(directed=False)
        )
        uncached = run_graph(None, plan, host, **params).result.to_arrow()
        assert uncached.num_rows == 0
        for _ in range(2):
            run = cache.run(plan, edges, **params)
            statuses.append(run.status)
            assert run.drift_bytes == 0
            assert run.result.to_arrow().equals(uncached), algorithm
    assert statuses == [GraphRunStatus.MISS] + [GraphRunStatus.HIT] * (2 * len(EMPTY_RUNS) - 1)
    with pytest.raises(GraphInputError, match="not in the graph"):
        cache.run(plan_graph_run("bfs", source=("gpu-empty", on_device)), edges, sources=[1])
    snap = caches.ledger(0).snapshot()
    assert snap.cache_reserved_bytes == snap.cache_pinned_in_use_bytes == 0
    # only the parked graphs' index arrays stay, and they are what is charged
    assert domain.used_bytes() == snap.cache_evictable_resident_bytes


def test_a_graph_of_vertices_without_arcs_on_the_gpu(cp: Any, caches: Any) -> None:
    from nexus_cache.device import GraphRunStatus, plan_graph_run

    loops = {"src": cp.asarray([5, 9]), "dst": cp.asarray([5, 9])}
    plan = plan_graph_run("bfs", source=("gpu-loops",), options=GraphOptions(drop_self_loops=True))
    cache = caches.graph_cache(0)
    for status in (GraphRunStatus.MISS, GraphRunStatus.HIT):
        run = cache.run(plan, loops, sources=[5])
        assert run.status is status
        table = run.result.to_arrow().to_pydict()
        assert (table["vertex"], table["distance"]) == ([5, 9], [0, None])


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
