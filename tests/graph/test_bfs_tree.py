"""BFS returns one tree for one input: a vertex reached from several parents keeps the smallest."""

from __future__ import annotations

import pyarrow as pa
import pytest

from nexus_cache.graph import GraphOptions, bfs, build_graph


@pytest.mark.parametrize("direction", ["push", "pull", "auto"])
def test_predecessor_is_the_smallest_parent_on_the_previous_level(direction):
    # 10 -> {30, 20} -> 40: 40 is reached from both 20 and 30 on level 2.
    edges = pa.table({"src": [10, 10, 30, 20], "dst": [30, 20, 40, 40]})
    graph = build_graph(edges, options=GraphOptions(directed=False))
    table = bfs(graph, 10, direction=direction).to_arrow().sort_by("vertex")
    got = dict(zip(table["vertex"].to_pylist(), table["predecessor"].to_pylist(), strict=True))
    assert got == {10: None, 20: 10, 30: 10, 40: 20}
