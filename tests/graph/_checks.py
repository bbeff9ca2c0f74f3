"""Agreement checks of nexus_cache.graph against NetworkX, written once for any ``xp``.

tests/graph runs them on NumPy; tests/gpu/test_graph_gpu.py loads this file
and runs them on CuPy. Each check builds a random edge list (duplicates, self
loops, sparse or huge ids), the NetworkX graph that our edge preparation
should produce from it, and compares.
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx
import numpy as np

from nexus_cache.graph import (
    GraphOptions,
    bfs,
    build_graph,
    degree,
    pagerank,
    similarity,
    triangles,
)
from nexus_cache.graph.arrays import to_numpy

__all__ = [
    "RULES",
    "check_bfs",
    "check_build",
    "check_degree",
    "check_triangles",
    "check_pagerank",
    "check_similarity",
    "random_edges",
    "reference_graph",
]

RULES = {"sum": sum, "min": min, "max": max}


def random_edges(
    seed: int, *, n: int = 40, m: int = 120, ids: str = "huge", weighted: bool = True
) -> dict[str, np.ndarray]:
    """Random edges with repeats and self loops; ids dense, sparse or near 10**12."""
    rng = np.random.default_rng(seed)
    if ids == "dense":
        labels = np.arange(n, dtype=np.int64)
    elif ids == "negative":
        labels = rng.choice(np.arange(-(10**9), 10**9, 7919), n, replace=False).astype(np.int64)
    else:  # sparse ids far beyond int32: the sort-based renumbering path
        labels = 10**12 + rng.choice(10**7, n, replace=False).astype(np.int64)
    # A skewed endpoint choice gives high-degree hubs and repeated edges.
    p = rng.pareto(1.5, n) + 0.05
    p /= p.sum()
    src = labels[rng.choice(n, m, p=p)]
    dst = labels[rng.choice(n, m, p=p)]
    cols = {"src": src, "dst": dst}
    if weighted:
        cols["w"] = rng.integers(1, 9, m).astype(np.float64) / 4
    return cols


def reference_graph(edges: dict[str, np.ndarray], options: GraphOptions) -> nx.Graph:
    """The NetworkX graph our edge preparation must produce from ``edges``."""
    g: nx.Graph = nx.DiGraph() if options.directed else nx.Graph()
    g.add_nodes_from(int(v) for v in np.concatenate([edges["src"], edges["dst"]]))
    groups: dict[tuple[int, int], list[float]] = {}
    weights = edges.get("w", np.ones(len(edges["src"])))
    for u, v, w in zip(
        edges["src"].tolist(), edges["dst"].tolist(), weights.tolist(), strict=True
    ):
        if options.drop_self_loops and u == v:
            continue
        key = (u, v) if options.directed else (min(u, v), max(u, v))
        groups.setdefault(key, []).append(w)
    for (u, v), ws in groups.items():
        g.add_edge(u, v, weight=RULES[options.duplicates](ws))
    return g


def _build(xp: Any, edges: dict[str, np.ndarray], options: GraphOptions, weighted: bool) -> Any:
    return build_graph(
        {k: xp.asarray(v) for k, v in edges.items()},
        weight="w" if weighted else None,
        options=options,
    )


def check_build(xp: Any, seed: int, options: GraphOptions, *, ids: str = "huge") -> None:
    edges = random_edges(seed, ids=ids)
    graph = _build(xp, edges, options, True)
    ref = reference_graph(edges, options)
    assert graph.xp is xp
    assert graph.indices.dtype == np.dtype(options.vertex_dtype)
    assert graph.weights.dtype == np.dtype(options.weight_dtype)
    vertex_ids = to_numpy(graph.vertex_ids).tolist()
    assert vertex_ids == sorted(ref.nodes)
    indptr, indices = to_numpy(graph.indptr), to_numpy(graph.indices)
    weights = to_numpy(graph.weights)
    for i, u in enumerate(vertex_ids):
        row = indices[indptr[i] : indptr[i + 1]]
        assert list(row) == sorted(row), "columns are sorted within a row"
        if options.stores_in_edges:
            expected = {p: ref.edges[p, u]["weight"] for p in ref.predecessors(u)}
        else:
            expected = {s: ref.edges[u, s]["weight"] for s in ref.adj[u]}
        got = {
            vertex_ids[j]: float(w)
            for j, w in zip(row, weights[indptr[i] : indptr[i + 1]], strict=True)
        }
        assert got.keys() == expected.keys()
        for v, w in expected.items():
            assert math.isclose(got[v], w, rel_tol=1e-6), (u, v)


def _distances(result: Any) -> dict[int, int | None]:
    table = result.to_arrow().to_pydict()
    return dict(zip(table["vertex"], table["distance"], strict=True))


def check_bfs(
    xp: Any,
    seed: int,
    options: GraphOptions,
    *,
    direction: str = "auto",
    sources: int = 1,
    depth_limit: int | None = None,
    n: int = 60,
    m: int = 150,
) -> None:
    edges = random_edges(seed, n=n, m=m, weighted=False)
    graph = _build(xp, edges, options, False)
    ref = reference_graph(edges, options)
    rng = np.random.default_rng(seed + 1)
    starts = rng.choice(sorted(ref.nodes), sources, replace=False).tolist()
    result = bfs(graph, starts, depth_limit=depth_limit, include_edges=True, direction=direction)
    expected: dict[int, int | None] = dict.fromkeys(ref.nodes)
    for depth, layer in enumerate(nx.bfs_layers(ref, starts)):
        if depth_limit is not None and depth > depth_limit:
            break
        expected.update(dict.fromkeys(layer, depth))
    table = result.to_arrow().to_pydict()
    assert dict(zip(table["vertex"], table["distance"], strict=True)) == expected
    dist = dict(zip(table["vertex"], table["distance"], strict=True))
    for v, d, p in zip(table["vertex"], table["distance"], table["predecessor"], strict=True):
        if d is None or d == 0:
            assert p is None
        else:
            assert ref.has_edge(p, v), (v, p)
            assert dist[p] == d - 1, (v, p, d)
    tree = result.info["tree_edges"].to_arrow().to_pydict()
    reached = sum(d is not None and d > 0 for d in table["distance"])
    assert len(tree["source"]) == reached
    for s, t, d in zip(tree["source"], tree["destination"], tree["distance"], strict=True):
        assert ref.has_edge(s, t)
        assert dist[t] == d
        assert dist[s] == d - 1


def check_pagerank(
    xp: Any,
    seed: int,
    options: GraphOptions,
    *,
    weighted: bool,
    personalize: bool = False,
) -> None:
    edges = random_edges(seed, weighted=weighted)
    graph = _build(xp, edges, options, weighted)
    ref = reference_graph(edges, options)
    nodes = sorted(ref.nodes)
    rng = np.random.default_rng(seed + 2)
    kwargs: dict[str, Any] = {}
    nx_kwargs: dict[str, Any] = {}
    if personalize:
        chosen = rng.choice(nodes, 7, replace=False).tolist()
        values = rng.random(7).tolist()
        start = rng.random(len(nodes)).tolist()
        dangle = rng.random(7).tolist()
        kwargs = {
            "personalization": (chosen, values),
            "initial": (nodes, start),
            "dangling": (chosen[::-1], dangle),
        }
        nx_kwargs = {
            "personalization": dict(zip(chosen, values, strict=True)),
            "nstart": dict(zip(nodes, start, strict=True)),
            "dangling": dict(zip(chosen[::-1], dangle, strict=True)),
        }
    tight = np.dtype(options.weight_dtype) == np.float64
    tol = 1e-10 if tight else 1e-6
    result = pagerank(graph, alpha=0.85, tol=tol, max_iter=500, convergence="networkx", **kwargs)
    weight: str | None = "weight" if weighted else None
    if not weighted and options.duplicates == "sum":
        # every copy of an unweighted edge counts once: NetworkX's multigraph
        ref = nx.MultiDiGraph() if options.directed else nx.MultiGraph()
        ref.add_nodes_from(nodes)
        ref.add_edges_from(
            (u, v)
            for u, v in zip(edges["src"].tolist(), edges["dst"].tolist(), strict=True)
            if not (options.drop_self_loops and u == v)
        )
    expected = nx.pagerank(ref, alpha=0.85, tol=tol, max_iter=500, weight=weight, **nx_kwargs)
    table = result.to_arrow().to_pydict()
    assert result.info["converged"] is True
    assert 1 <= result.info["iterations"] <= 500
    got = dict(zip(table["vertex"], table["pagerank"], strict=True))
    atol = 1e-8 if tight else 2e-5
    for v in nodes:
        assert abs(got[v] - expected[v]) <= atol, (v, got[v], expected[v])


def _definition(metric: str, a: set[int], b: set[int]) -> float:
    c = len(a & b)
    if metric == "jaccard":
        d = len(a | b)
        return c / d if d else 0.0
    if metric == "sorensen":
        d = len(a) + len(b)
        return 2 * c / d if d else 0.0
    if metric == "overlap":
        d = min(len(a), len(b))
        return c / d if d else 0.0
    d = math.sqrt(len(a) * len(b))
    return c / d if d else 0.0


def check_similarity(
    xp: Any,
    seed: int,
    metric: str,
    *,
    directed: bool = False,
    all_edges: bool = False,
    max_temp_bytes: int = 1 << 20,
    n: int = 40,
    m: int = 160,
    drop_self_loops: bool = False,
) -> None:
    options = GraphOptions(directed=directed, drop_self_loops=drop_self_loops)
    edges = random_edges(seed, n=n, m=m, weighted=False)
    graph = _build(xp, edges, options, False)
    ref = reference_graph(edges, options)
    nodes = sorted(ref.nodes)
    if all_edges:
        result = similarity(graph, metric, max_temp_bytes=max_temp_bytes)
    else:
        rng = np.random.default_rng(seed + 3)
        first = rng.choice(nodes, 100).tolist()
        second = rng.choice(nodes, 100).tolist()
        result = similarity(graph, metric, (first, second), max_temp_bytes=max_temp_bytes)
    table = result.to_arrow().to_pydict()
    pairs = list(zip(table["first"], table["second"], strict=True))
    if all_edges:
        expected_pairs = {(u, v) for u, v in ref.edges if u != v}
        if not directed:
            expected_pairs = {(min(u, v), max(u, v)) for u, v in expected_pairs}
        assert set(pairs) == expected_pairs
        assert len(pairs) == len(expected_pairs)
    else:
        assert pairs == list(zip(first, second, strict=True))
    for (u, v), got in zip(pairs, table[metric], strict=True):
        want = _definition(metric, set(ref.adj[u]), set(ref.adj[v]))
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (u, v, got, want)
    # NetworkX leaves u and v out of their common neighbours, which only
    # differs from the set definition when there are self loops.
    if metric == "jaccard" and not directed and nx.number_of_selfloops(ref) == 0:
        for (u, v, want), got in zip(
            nx.jaccard_coefficient(ref, pairs), table[metric], strict=True
        ):
            assert math.isclose(got, want, rel_tol=1e-12), (u, v)


def reference_multigraph(edges: dict[str, np.ndarray], options: GraphOptions) -> nx.Graph:
    """The NetworkX multigraph of ``edges`` (``duplicates="keep"``: every copy stays)."""
    g: nx.Graph = nx.MultiDiGraph() if options.directed else nx.MultiGraph()
    g.add_nodes_from(int(v) for v in np.concatenate([edges["src"], edges["dst"]]))
    for u, v in zip(edges["src"].tolist(), edges["dst"].tolist(), strict=True):
        if not (options.drop_self_loops and u == v):
            g.add_edge(u, v)
    return g


def check_degree(xp: Any, seed: int, options: GraphOptions, direction: str) -> None:
    """``degree`` agrees with NetworkX's ``degree`` / ``in_degree`` / ``out_degree``."""
    edges = random_edges(seed, weighted=False)
    graph = _build(xp, edges, options, False)
    if options.duplicates == "keep":
        ref = reference_multigraph(edges, options)
    else:
        ref = reference_graph(edges, options)
    result = degree(graph, direction=direction)
    assert result["degree"].dtype == np.int64
    table = result.to_arrow().to_pydict()
    got = dict(zip(table["vertex"], table["degree"], strict=True))
    if not options.directed or direction == "total":
        expected = dict(ref.degree())
    elif direction == "out":
        expected = dict(ref.out_degree())
    else:
        expected = dict(ref.in_degree())
    assert got == expected


def check_triangles(
    xp: Any, seed: int, options: GraphOptions, *, n: int = 40, m: int = 120, **kw: Any
) -> None:
    """``triangles`` agrees with ``networkx.triangles`` (self loops ignored)."""
    edges = random_edges(seed, n=n, m=m, weighted=False)
    graph = _build(xp, edges, options, False)
    ref = reference_graph(edges, options)
    table = triangles(graph, **kw).to_arrow().to_pydict()
    got = dict(zip(table["vertex"], table["triangles"], strict=True))
    ref.remove_edges_from(list(nx.selfloop_edges(ref)))
    assert got == nx.triangles(ref)
