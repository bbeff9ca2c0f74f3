"""Graph grants are sized from the edge count in the Parquet footers, so an
uncached graph query fits its first grant and runs once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import GraphQuery, QueryService, Scan, ServiceConfig
from nexus_cache.service.datagen import rmat_edges, write_parquet

DEMO_SCALE = 12  # the demo's default


@pytest.fixture(scope="module")
def demo_edges(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    path = tmp_path_factory.mktemp("lake") / "edges.parquet"
    edges = rmat_edges(DEMO_SCALE)
    write_parquet(edges, path)  # as the demo writes them
    return str(path), int(edges["src"][0].as_py())


def _queries(edges: str, source: int) -> list[GraphQuery]:
    scan = Scan(edges)
    return [
        GraphQuery(scan, "src", "dst", "pagerank"),
        GraphQuery(scan, "src", "dst", "bfs", params={"source": source}),
        GraphQuery(scan, "src", "dst", "jaccard", directed=False),
    ]


@pytest.mark.parametrize("variant", ["default-config", "uncached", "cached"])
def test_a_graph_query_on_the_demo_edges_runs_one_attempt(
    demo_edges: tuple[str, int], tmp_path: Path, variant: str
) -> None:
    edges, source = demo_edges
    overrides: dict[str, Any] = {"backend": "host"}
    if variant == "uncached":  # no graph cache: the attempt builds the graph itself
        overrides["cache_cap_bytes"] = 0
    if variant == "cached":
        overrides["lakehouse"] = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0)
    # nothing else set: the default grant_expansion, min_grant_bytes and cache cap
    with QueryService(ServiceConfig.from_env({}, **overrides)) as service:
        for query in _queries(edges, source):
            result = service.execute(query)
            attempts = result.diagnostics.attempts
            assert [a.outcome for a in attempts] == ["ok"], query.algorithm
            (attempt,) = attempts
            assert attempt.used_bytes <= attempt.grant_bytes
            graph = result.diagnostics.graph_cache
            if variant == "cached":  # the build was charged to the graph cache
                assert graph["status"] == "miss", graph
            if variant == "uncached":  # an estimate of what it used, not the whole device
                assert graph["status"] == "bypass", graph
                assert attempt.grant_bytes <= 2 * attempt.used_bytes
