"""Stop points: a caller's check runs between PageRank iterations and BFS levels
and stops the algorithm by raising; outside ``stop_check`` nothing changes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import networkx as nx
import pytest

from nexus_cache.graph import GraphOptions, bfs, build_graph, pagerank
from nexus_cache.graph.stopping import checkpoint, stop_check
from nexus_cache.service.datagen import ring_edges


class _Stop(Exception):
    pass


def _stop_after(calls: int) -> tuple[list[int], Callable[[], None]]:
    seen = [0]

    def check() -> None:
        seen[0] += 1
        if seen[0] >= calls:
            raise _Stop

    return seen, check


def _ring(n: int, directed: bool = True) -> Any:
    table = ring_edges(n)
    edges = {name: table.column(name).to_numpy() for name in ("src", "dst")}
    return build_graph(edges, options=GraphOptions(orientation="transposed", directed=directed))


def test_pagerank_stops_at_the_iteration_the_check_raises() -> None:
    graph = _ring(1000)
    seen, check = _stop_after(5)
    with stop_check(check), pytest.raises(_Stop):
        pagerank(graph, alpha=0.99999, tol=1e-300, max_iter=10**6)
    assert seen[0] == 5
    # outside the block the same call runs to max_iter
    result = pagerank(graph, alpha=0.99999, tol=1e-300, max_iter=50)
    assert result.info["iterations"] == 50


def test_bfs_stops_between_levels(host_engine: str) -> None:
    if host_engine != "numpy":
        pytest.skip("the compiled host BFS runs its levels inside one call")
    e = ring_edges(200)
    graph = build_graph(
        {"src": e.column("src").to_numpy(), "dst": e.column("dst").to_numpy()},
        options=GraphOptions(directed=True),
    )
    seen, check = _stop_after(3)
    with stop_check(check), pytest.raises(_Stop):
        bfs(graph, [0])
    assert seen[0] == 3
    table = bfs(graph, [0]).to_arrow().to_pydict()
    expected = nx.single_source_shortest_path_length(
        nx.DiGraph(zip(e["src"].to_pylist(), e["dst"].to_pylist(), strict=True)), 0
    )
    assert dict(zip(table["vertex"], table["distance"], strict=True)) == expected


def test_the_check_is_per_thread_and_restored_after_the_block() -> None:
    outer: list[int] = []
    inner: list[int] = []
    with stop_check(lambda: outer.append(1)):
        with stop_check(lambda: inner.append(1)):
            checkpoint()
            thread = threading.Thread(target=checkpoint)  # no check in a new thread
            thread.start()
            thread.join()
        checkpoint()
    checkpoint()  # none
    assert (len(outer), len(inner)) == (1, 1)
