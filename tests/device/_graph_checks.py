"""Resident-graph-cache checks written once for any backend.

tests/device runs them on the host backend; tests/gpu loads this file by
path and runs them on both CUDA domain kinds (a CuPy pool, an RMM pool).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from nexus_cache.device import GraphRunStatus, plan_graph_run, run_graph
from nexus_cache.errors import GraphInputError
from nexus_cache.graph import GraphOptions

__all__ = ["EMPTY_RUNS", "check_empty_edge_table", "check_vertices_without_arcs", "empty_edges"]

#: algorithm runs an empty graph must answer with an empty result
EMPTY_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("pagerank", {}),
    ("jaccard", {}),
    ("sorensen", {"pairs": ([], [])}),
    ("overlap", {}),
    ("cosine", {"pairs": ([], [])}),
]


def empty_edges() -> pa.Table:
    return pa.table({"src": pa.array([], pa.int64()), "dst": pa.array([], pa.int64())})


def check_empty_edge_table(caches: Any, edges: Any, source: Any) -> None:
    """``edges`` (no rows) runs through the graph cache as it runs uncached:
    a miss, then hits, each an empty result; BFS refuses its source."""
    cache = caches.graph_cache(0)
    statuses = []
    for algorithm, params in EMPTY_RUNS:
        # one construction contract: every algorithm shares one parked graph
        plan = plan_graph_run(algorithm, source=source, options=GraphOptions(directed=False))
        uncached = run_graph(None, plan, empty_edges(), **params).result.to_arrow()
        assert uncached.num_rows == 0
        for _ in range(2):
            run = cache.run(plan, edges, **params)
            statuses.append(run.status)
            assert run.drift_bytes == 0
            assert run.result.to_arrow().equals(uncached), algorithm
    assert statuses == [GraphRunStatus.MISS] + [GraphRunStatus.HIT] * (2 * len(EMPTY_RUNS) - 1)
    with pytest.raises(GraphInputError, match="not in the graph"):  # as uncached
        cache.run(plan_graph_run("bfs", source=source), edges, sources=[1])
    snap = caches.ledger(0).snapshot()
    assert snap.cache_reserved_bytes == snap.cache_pinned_in_use_bytes == 0
    # only the parked graphs stay in the cache domain, and they are what is charged
    assert caches.factory(0).domain.used_bytes() == snap.cache_evictable_resident_bytes


def check_vertices_without_arcs(caches: Any, loops: Any, source: Any) -> None:
    """A graph whose only edges are dropped self loops (5-5, 9-9) is parked and hit."""
    plan = plan_graph_run("bfs", source=source, options=GraphOptions(drop_self_loops=True))
    cache = caches.graph_cache(0)
    for status in (GraphRunStatus.MISS, GraphRunStatus.HIT):
        run = cache.run(plan, loops, sources=[5])
        assert run.status is status
        table = run.result.to_arrow().to_pydict()
        assert (table["vertex"], table["distance"]) == ([5, 9], [0, None])
