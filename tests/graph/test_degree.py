"""``degree`` on the host backend agrees with NetworkX on random graphs."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.graph import GraphOptions, build_graph, degree

from ._checks import check_degree

OPTIONS = [
    GraphOptions(duplicates="max"),
    GraphOptions(duplicates="max", orientation="transposed"),
    GraphOptions(directed=False, duplicates="max"),
    GraphOptions(duplicates="keep"),
    GraphOptions(directed=False, duplicates="keep"),
    GraphOptions(drop_self_loops=True, duplicates="min", vertex_dtype="int64"),
]
IDS = ["directed", "transposed", "undirected", "multi", "undirected-multi", "no-loops-int64"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("direction", ["total", "out", "in"])
def test_degree_matches_networkx(seed: int, options: GraphOptions, direction: str) -> None:
    check_degree(np, seed, options, direction)


def test_an_undirected_self_loop_counts_twice_and_an_empty_graph_has_no_rows() -> None:
    edges = {"src": np.array([1, 1, 2]), "dst": np.array([1, 2, 3])}
    graph = build_graph(edges, options=GraphOptions(directed=False))
    table = degree(graph).to_arrow().to_pydict()
    assert table == {"vertex": [1, 2, 3], "degree": [3, 2, 1]}
    empty = build_graph({"src": np.array([], np.int64), "dst": np.array([], np.int64)})
    for direction in ("total", "out", "in"):
        assert degree(empty, direction=direction).num_rows == 0


def test_an_unknown_direction_is_refused_naming_the_choices() -> None:
    graph = build_graph({"src": np.array([0]), "dst": np.array([1])})
    with pytest.raises(ConfigError, match=r"direction='both'.*'total', 'out', 'in'"):
        degree(graph, direction="both")
