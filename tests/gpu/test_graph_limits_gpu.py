"""Graph parameters at their limits on the GPU: a depth limit beyond int64 is
no limit (the host engine's test is tests/qa/test_graph_algorithm_limits.py)."""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np
import pytest

from nexus_cache.graph import GraphOptions, bfs, build_graph

pytestmark = pytest.mark.gpu

PATH = [(1, 2), (2, 3), (3, 4), (4, 1), (7, 8)]


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("depth_limit", [2**63 - 1, 2**63, 10**23])
@pytest.mark.parametrize("direction", ["auto", "push", "pull"])
def test_a_depth_limit_beyond_any_level_is_no_limit_on_the_gpu(
    cp: Any, depth_limit: int, direction: Any
) -> None:
    edges = np.array(PATH, dtype=np.int64)
    columns = {"src": cp.asarray(edges[:, 0]), "dst": cp.asarray(edges[:, 1])}
    graph = build_graph(columns, options=GraphOptions(directed=False))
    assert graph.xp is cp
    result = bfs(graph, 1, depth_limit=depth_limit, direction=direction)
    table = result.to_arrow().to_pydict()
    got = {v: d for v, d in zip(table["vertex"], table["distance"], strict=True) if d is not None}
    assert got == nx.single_source_shortest_path_length(nx.Graph(PATH), 1)
    assert result.info["levels"] == bfs(graph, 1, direction=direction).info["levels"]
