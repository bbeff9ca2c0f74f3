"""PageRank's convergence rules on an R-MAT graph: the default converges, the
NetworkX rule (``n_vertices * tol``) stops early and matches NetworkX."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from nexus_cache.errors import ConfigError, GraphConvergenceError
from nexus_cache.graph import GraphOptions, build_graph, pagerank
from nexus_cache.service.datagen import rmat_edges

OPTIONS = GraphOptions(orientation="transposed", weight_dtype="float64")


@pytest.fixture(scope="module")
def rmat() -> tuple[dict[str, np.ndarray], object, np.ndarray]:
    table = rmat_edges(14)  # 12,555 vertices, 262,144 edges
    edges = {name: table.column(name).to_numpy() for name in ("src", "dst")}
    graph = build_graph(edges, options=OPTIONS)
    reference = pagerank(graph, tol=1e-14, max_iter=1000)
    assert reference.info["converged"] is True
    return edges, graph, np.asarray(reference["pagerank"])


def test_the_default_converges_on_the_total_l1_change(rmat: tuple) -> None:
    _, graph, reference = rmat
    result = pagerank(graph)
    got = np.asarray(result["pagerank"])
    assert result.info["converged"] is True
    assert result.info["threshold"] == 1e-6
    assert result.info["error"] < 1e-6
    # within the tolerance of the converged vector, vertex by vertex
    assert np.abs(got - reference).sum() < 1e-6
    assert np.max(np.abs(got - reference) / reference) < 1e-4


def test_float32_arithmetic_converges_too(rmat: tuple) -> None:
    _, graph, reference = rmat
    result = pagerank(graph, dtype="float32")
    assert result.info["converged"] is True
    assert np.abs(np.asarray(result["pagerank"], np.float64) - reference).sum() < 2e-6


def test_the_networkx_rule_stops_early_and_matches_networkx(rmat: tuple) -> None:
    edges, graph, reference = rmat
    result = pagerank(graph, convergence="networkx")
    got = np.asarray(result["pagerank"])
    assert result.info["threshold"] == pytest.approx(graph.n_vertices * 1e-6)
    assert result.info["iterations"] <= 5
    # what the rule costs: a few percent off the converged vector already here
    assert np.max(np.abs(got - reference) / reference) > 0.01
    # NetworkX stops at the same iteration with the same vector (repeated
    # edges count once each: a multigraph)
    multi = nx.MultiDiGraph()
    multi.add_edges_from(zip(edges["src"].tolist(), edges["dst"].tolist(), strict=True))
    expected = nx.pagerank(multi, tol=1e-6, weight=None)
    ids = graph.vertex_ids.tolist()
    want = np.array([expected[v] for v in ids])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_the_rule_is_validated_and_named_in_the_nonconvergence_error(rmat: tuple) -> None:
    _, graph, _ = rmat
    for bad in ("NetworkX", "l1", None, 1):
        with pytest.raises(ConfigError, match=r"convergence=.*'total', 'networkx'"):
            pagerank(graph, convergence=bad)  # type: ignore[arg-type]
    stopped = pagerank(graph, max_iter=2)
    assert (stopped.info["converged"], stopped.info["iterations"]) == (False, 2)
    with pytest.raises(GraphConvergenceError, match="needed < tol = 1e-06"):
        pagerank(graph, max_iter=2, fail_on_nonconvergence=True)
    with pytest.raises(GraphConvergenceError, match="needed < n_vertices \\* tol"):
        pagerank(graph, max_iter=1, convergence="networkx", fail_on_nonconvergence=True)
