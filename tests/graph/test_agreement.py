"""nexus_cache.graph on the host backend agrees with NetworkX (many random graphs)."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_cache.graph import GraphOptions

from ._checks import check_bfs, check_build, check_pagerank, check_similarity

SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(),
        GraphOptions(directed=False, duplicates="max"),
        GraphOptions(drop_self_loops=True, duplicates="min", orientation="transposed"),
        GraphOptions(directed=False, drop_self_loops=True, vertex_dtype="int64"),
        GraphOptions(weight_dtype="float64", orientation="transposed", directed=False),
    ],
    ids=["directed", "undirected-max", "transposed-min", "undirected-int64", "undirected-t"],
)
@pytest.mark.parametrize("ids", ["huge", "dense", "negative"])
def test_csr_matches_networkx(seed: int, options: GraphOptions, ids: str) -> None:
    check_build(np, seed, options, ids=ids)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("direction", ["auto", "push", "pull"])
@pytest.mark.parametrize(
    "options",
    [GraphOptions(), GraphOptions(directed=False), GraphOptions(orientation="transposed")],
    ids=["directed", "undirected", "transposed"],
)
def test_bfs_matches_networkx(seed: int, direction: str, options: GraphOptions) -> None:
    check_bfs(np, seed, options, direction=direction, sources=1 + seed % 3)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("depth_limit", [0, 1, 2])
def test_bfs_depth_limit(seed: int, depth_limit: int) -> None:
    check_bfs(np, seed, GraphOptions(directed=False), depth_limit=depth_limit, sources=2)


@pytest.mark.parametrize("seed", range(3))
def test_bfs_auto_switches_on_a_dense_graph(seed: int) -> None:
    # Dense enough that the frontier's arcs outgrow the unexplored ones: both steps run.
    check_bfs(np, seed, GraphOptions(directed=False), n=200, m=3000)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        GraphOptions(weight_dtype="float64"),
        GraphOptions(directed=False, weight_dtype="float64"),
        GraphOptions(orientation="transposed"),
    ],
    ids=["directed64", "undirected64", "transposed32"],
)
def test_pagerank_matches_networkx(seed: int, weighted: bool, options: GraphOptions) -> None:
    check_pagerank(np, seed, options, weighted=weighted)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("directed", [False, True])
def test_pagerank_personalized_matches_networkx(seed: int, directed: bool) -> None:
    options = GraphOptions(directed=directed, weight_dtype="float64")
    check_pagerank(np, seed, options, weighted=True, personalize=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("metric", ["jaccard", "sorensen", "overlap", "cosine"])
@pytest.mark.parametrize("all_edges", [False, True])
def test_similarity_matches_definition(seed: int, metric: str, all_edges: bool) -> None:
    # Odd seeds drop self loops, so Jaccard is also compared with NetworkX.
    check_similarity(np, seed, metric, all_edges=all_edges, drop_self_loops=seed % 2 == 1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("metric", ["jaccard", "cosine"])
def test_similarity_directed_uses_out_neighbours(seed: int, metric: str) -> None:
    check_similarity(np, seed, metric, directed=True, all_edges=seed % 2 == 0)


@pytest.mark.parametrize("metric", ["jaccard", "overlap"])
def test_similarity_in_many_chunks_with_a_hub(metric: str) -> None:
    # 1 byte of budget means the smallest chunk (1024 elements): the hubs'
    # neighbour lists (thousands of arcs) are split across chunks.
    check_similarity(np, 5, metric, all_edges=True, max_temp_bytes=1, n=300, m=6000)
