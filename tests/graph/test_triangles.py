"""``triangles`` on the host backend agrees with NetworkX on random graphs."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_cache.errors import GraphInputError
from nexus_cache.graph import GraphOptions, build_graph, triangles

from ._checks import check_triangles

OPTIONS = [
    GraphOptions(directed=False, duplicates="max"),
    GraphOptions(directed=False),
    GraphOptions(directed=False, drop_self_loops=True, vertex_dtype="int64"),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("options", OPTIONS, ids=["max", "sum", "no-loops-int64"])
def test_triangles_match_networkx(seed: int, options: GraphOptions) -> None:
    check_triangles(np, seed, options)


@pytest.mark.parametrize("seed", range(3))
def test_triangles_match_networkx_on_denser_graphs_in_small_chunks(seed: int) -> None:
    # many triangles through hubs; a 1-byte budget makes every host path
    # take its smallest steps (the pair path, one-element chunks)
    options = GraphOptions(directed=False, duplicates="max")
    check_triangles(np, seed, options, n=60, m=900)
    check_triangles(np, seed, options, n=60, m=900, max_temp_bytes=1)


def test_a_self_loop_is_no_triangle_and_an_empty_graph_has_no_rows() -> None:
    # the triangle 1-2-3, a self loop on 1 and on 4, a pendant 3-4
    edges = {"src": np.array([1, 2, 3, 1, 3, 4]), "dst": np.array([2, 3, 1, 1, 4, 4])}
    graph = build_graph(edges, options=GraphOptions(directed=False))
    table = triangles(graph).to_arrow().to_pydict()
    assert table == {"vertex": [1, 2, 3, 4], "triangles": [1, 1, 1, 0]}
    options = GraphOptions(directed=False)
    empty = build_graph(
        {"src": np.array([], np.int64), "dst": np.array([], np.int64)}, options=options
    )
    assert triangles(empty).num_rows == 0


def test_directed_graphs_and_multigraphs_are_refused() -> None:
    edges = {"src": np.array([0, 1, 2]), "dst": np.array([1, 2, 0])}
    with pytest.raises(GraphInputError, match=r"undirected graph.*directed=False"):
        triangles(build_graph(edges))
    multi = build_graph(edges, options=GraphOptions(directed=False, duplicates="keep"))
    with pytest.raises(GraphInputError, match="not 'keep'"):
        triangles(multi)
