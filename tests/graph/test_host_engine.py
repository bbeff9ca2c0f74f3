"""The compiled host engine (Numba): same results as the NumPy code, bounded memory."""

from __future__ import annotations

import math
import sys
import tracemalloc
from types import SimpleNamespace
from typing import Any

import networkx as nx
import numpy as np
import pytest

from nexus_cache.errors import BackendUnavailableError, ConfigError, GraphInputError
from nexus_cache.graph import METRICS, GraphOptions, bfs, build_graph, similarity
from nexus_cache.graph import _host_engine as engine
from nexus_cache.graph._host_engine import ENV_HOST_ENGINE

from .conftest import HAVE_NUMBA
from .test_inputs import _push_pull_graph

needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="needs numba (host extra)")
ENGINES = [pytest.param("numba", marks=needs_numba), "numpy"]


@pytest.fixture(autouse=True)
def host_engine() -> str:
    """These tests choose their engines themselves (no run per engine)."""
    return "auto"


def _kernels() -> Any:
    from nexus_cache.graph import _host_kernels

    return _host_kernels


def _hub_graph(seed: int, options: GraphOptions) -> Any:
    """Two hubs (one of 3000 arcs), self loops, repeats, a vertex left isolated."""
    rng = np.random.default_rng(seed)
    n = 400
    p = rng.pareto(1.2, n) + 0.02
    src = rng.choice(n, 4000, p=p / p.sum())
    dst = rng.choice(n, 4000, p=p / p.sum())
    hub = np.full(3000, 7)
    leaves = rng.integers(0, n, 3000)
    loops = np.array([3, 3, 11, 500])  # 500 has only a loop: isolated once loops drop
    cols = {
        "src": np.concatenate([src, hub, leaves[:50], loops]),
        "dst": np.concatenate([dst, leaves, np.full(50, 9), loops]),
    }
    return build_graph(cols, options=options)


def _scores(graph: Any, metric: str, pairs: Any, engine_name: str, **kw: Any) -> np.ndarray:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_HOST_ENGINE, engine_name)
        return np.asarray(similarity(graph, metric, pairs, **kw)[metric])


OPTIONS = [
    GraphOptions(directed=False),
    GraphOptions(directed=False, drop_self_loops=True),
    GraphOptions(directed=False, duplicates="keep"),
    GraphOptions(),
    GraphOptions(orientation="transposed", duplicates="keep"),
]
OPTION_IDS = ["undirected", "undirected-noloops", "multigraph", "directed", "transposed"]


@needs_numba
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_engines_give_equal_scores(metric: str, options: GraphOptions) -> None:
    graph = _hub_graph(1, options)
    ids = graph.vertex_ids
    rng = np.random.default_rng(2)
    # Adjacent and not, (u, u), the hub against everything and against itself.
    first = np.concatenate([rng.choice(ids, 3000), np.full(400, 7), ids[:50]])
    second = np.concatenate([rng.choice(ids, 3000), rng.choice(ids, 400), ids[:50]])
    for pairs in (None, (first, second)):
        numpy_scores = _scores(graph, metric, pairs, "numpy", max_temp_bytes="64K")
        numba_scores = _scores(graph, metric, pairs, "numba")
        np.testing.assert_array_equal(numba_scores, numpy_scores)


@needs_numba
def test_pairs_on_a_hub_use_both_the_marker_and_the_search() -> None:
    # The hub (3000 arcs) is the longer end of many pairs (marked once) and,
    # in a second call, of a single pair with a short list (searched).
    graph = _hub_graph(3, GraphOptions(directed=False))
    ref = nx.Graph()
    rows = np.repeat(np.arange(graph.n_vertices), np.diff(graph.indptr))
    ref.add_edges_from(zip(rows.tolist(), graph.indices.tolist(), strict=True))
    hub = int(np.argmax(np.diff(graph.indptr)))
    for others in (np.arange(graph.n_vertices), np.array([int(np.argmin(np.diff(graph.indptr)))])):
        first = np.full(others.size, hub)
        ids = graph.vertex_ids
        got = similarity(graph, "jaccard", (ids[first], ids[others]))["jaccard"]
        for v, score in zip(others.tolist(), np.asarray(got).tolist(), strict=True):
            a, b = set(ref.adj[hub]), set(ref.adj[v])
            assert math.isclose(score, len(a & b) / len(a | b)), v


@pytest.mark.parametrize("name", ENGINES)
def test_pairs_with_unknown_ids_are_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_HOST_ENGINE, name)
    graph = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])})
    with pytest.raises(GraphInputError, match=r"\[99\] are not vertices"):
        similarity(graph, "cosine", ([1, 99], [2, 3]))
    with pytest.raises(GraphInputError, match="equal numbers"):
        similarity(graph, "cosine", ([1, 2], [2]))


@pytest.mark.parametrize("name", ENGINES)
def test_a_vertex_with_itself_and_isolated_vertices(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_HOST_ENGINE, name)
    edges = {"src": np.array([1, 1, 2, 5]), "dst": np.array([2, 3, 3, 5])}
    graph = build_graph(edges, options=GraphOptions(directed=False, drop_self_loops=True))
    got = similarity(graph, "jaccard", ([1, 5, 5, 2], [1, 5, 1, 1])).to_arrow()
    # N(1) = {2, 3}; 5 is isolated (its loop dropped): scores of 0 there.
    assert got.column("jaccard").to_pylist() == [1.0, 0.0, 0.0, 1 / 3]


@needs_numba
def test_edge_counts_fall_back_to_pairs_when_the_triangles_do_not_fit() -> None:
    graph = _hub_graph(4, GraphOptions(directed=False))
    rows = graph.rows()
    loops, upper = rows[rows == graph.indices], rows < graph.indices
    first, second = rows[upper], graph.indices[upper]
    calls: dict[str, int] = {"triangle_counts": 0, "pair_counts": 0}
    real = _kernels()

    def counted(name: str) -> Any:
        def call(*args: Any) -> Any:
            calls[name] += 1
            return getattr(real, name)(*args)

        return call

    spy = SimpleNamespace(
        orient=real.orient,
        oriented_work=real.oriented_work,
        triangle_counts=counted("triangle_counts"),
        pair_counts=counted("pair_counts"),
    )
    expected = engine.pair_common_neighbours(real, graph, first, second)
    roomy = engine.edge_common_neighbours(spy, graph, first, second, loops, 1 << 30)
    assert calls == {"triangle_counts": calls["triangle_counts"], "pair_counts": 0}
    assert calls["triangle_counts"] >= 1
    tight = engine.edge_common_neighbours(spy, graph, first, second, loops, 1024)
    assert calls["pair_counts"] >= 1
    np.testing.assert_array_equal(roomy, expected)
    np.testing.assert_array_equal(tight, expected)


def _peak_bytes(fn: Any) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return tracemalloc.get_traced_memory()[1] - base, out
    finally:
        tracemalloc.stop()


@needs_numba
@pytest.mark.parametrize("cores", [1, 2])
def test_triangle_temporaries_stay_within_max_temp_bytes(
    cores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_cores", lambda: cores)
    graph = _hub_graph(5, GraphOptions(directed=False))
    rows = graph.rows()
    loops, upper = rows[rows == graph.indices], rows < graph.indices
    first, second = rows[upper], graph.indices[upper]
    kernels = _kernels()
    engine.edge_common_neighbours(kernels, graph, first, second, loops, 1 << 30)  # compiled
    budget = engine._triangle_bytes(graph.n_vertices, int(first.size), cores)
    peak, counts = _peak_bytes(
        lambda: engine.edge_common_neighbours(kernels, graph, first, second, loops, budget)
    )
    # Everything the call allocates but its result (8 bytes a pair) is temporary.
    assert 0 < peak - counts.nbytes <= budget


@needs_numba
def test_pair_temporaries_are_o_of_pairs() -> None:
    graph = _hub_graph(6, GraphOptions(directed=False))
    rng = np.random.default_rng(6)
    first = rng.integers(0, graph.n_vertices, 20000).astype(graph.indices.dtype)
    second = rng.integers(0, graph.n_vertices, 20000).astype(graph.indices.dtype)
    kernels = _kernels()
    engine.pair_common_neighbours(kernels, graph, first, second)
    peak, counts = _peak_bytes(
        lambda: engine.pair_common_neighbours(kernels, graph, first, second)
    )
    cores = engine._cores()
    # As documented: 48 bytes a pair, the degrees (8 bytes a vertex) and one
    # byte a vertex per thread beside the result; 64 KiB for the threads' objects.
    allowed = 48 * first.size + graph.n_vertices * (8 + cores) + (64 << 10)
    assert peak - counts.nbytes <= allowed


@pytest.mark.parametrize(
    ("work", "parts"),
    [([5, 5, 5, 5], 2), ([1, 1000, 1001, 1002], 3), ([3], 4), ([0, 0, 0], 2), ([], 2)],
)
def test_pieces_cover_every_item_once(work: list[int], parts: int) -> None:
    cumulative = np.asarray(work, dtype=np.int64)
    pieces = engine._pieces(cumulative, parts)
    covered = [i for start, stop in pieces for i in range(start, stop)]
    assert covered == list(range(len(work)))
    assert len(pieces) <= parts
    assert all(stop > start for start, stop in pieces)


@needs_numba
@pytest.mark.parametrize("metric", ["jaccard", "overlap"])
def test_many_threads_give_the_same_scores(metric: str, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _hub_graph(7, GraphOptions(directed=False))
    ids = graph.vertex_ids
    pairs = (np.repeat(ids[:40], 40), np.tile(ids[:40], 40))
    monkeypatch.setattr(engine, "_cores", lambda: 1)
    one = [np.asarray(similarity(graph, metric, p)[metric]) for p in (None, pairs)]
    monkeypatch.setattr(engine, "_cores", lambda: 7)
    seven = [np.asarray(similarity(graph, metric, p)[metric]) for p in (None, pairs)]
    for a, b in zip(one, seven, strict=True):
        np.testing.assert_array_equal(a, b)


@needs_numba
@pytest.mark.parametrize("direction", ["auto", "push", "pull"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("depth_limit", [None, 1, 3])
def test_engines_give_equal_bfs_trees(
    direction: Any, options: GraphOptions, depth_limit: int | None
) -> None:
    graph = _hub_graph(8, options)
    sources = graph.vertex_ids[[0, 5, 5, 40]]
    results = {}
    for name in ("numpy", "numba"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ENV_HOST_ENGINE, name)
            result = bfs(graph, sources, depth_limit=depth_limit, direction=direction)
        results[name] = result.to_arrow()
        results[name + " levels"] = result.info["levels"]
    assert results["numba"].equals(results["numpy"])
    assert results["numba levels"] == results["numpy levels"]


@needs_numba
def test_kernel_bfs_switches_between_steps() -> None:
    e, graph = _push_pull_graph()
    steps = np.zeros(2, dtype=np.int64)
    sources = graph.dense([-20])
    dist, _, _ = engine.bfs(_kernels(), graph, sources, None, 0, 14, 24, steps)
    assert steps[0] >= 2  # top-down on the path and the tail
    assert steps[1] >= 1  # bottom-up in the dense core
    expected = nx.single_source_shortest_path_length(nx.Graph(e.tolist()), -20)
    got = dict(zip(graph.vertex_ids.tolist(), dist.tolist(), strict=True))
    assert got == expected


def test_engine_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])})
    monkeypatch.setenv(ENV_HOST_ENGINE, "fast")
    with pytest.raises(
        ConfigError, match=f"{ENV_HOST_ENGINE}='fast' is not accepted; use one of: auto"
    ):
        bfs(graph, [1])
    monkeypatch.setenv(ENV_HOST_ENGINE, "numba")
    monkeypatch.setitem(sys.modules, "numba", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "nexus_cache.graph._host_kernels", raising=False)
    monkeypatch.delattr(sys.modules["nexus_cache.graph"], "_host_kernels", raising=False)
    with pytest.raises(BackendUnavailableError, match=r"nexus-cache\[host\]"):
        similarity(graph, "jaccard")
    monkeypatch.setenv(ENV_HOST_ENGINE, "auto")  # auto falls back to NumPy
    assert similarity(graph, "jaccard").num_rows == 2
