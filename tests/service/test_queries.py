"""Queries as objects and as JSON; validation names the field."""

from __future__ import annotations

import json

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.service import Count, GraphQuery, Scan, as_query


def test_json_round_trip() -> None:
    queries = [
        Scan("s3://b/t/", columns=("a", "b"), batch_rows=10),
        Count("/data/facts.parquet"),
        GraphQuery(Scan("/e.parquet"), "s", "d", "pagerank", params={"alpha": 0.9}),
        GraphQuery(Scan("/e.parquet"), "s", "d", "bfs", params={"source": 3}),
        GraphQuery(
            Scan("/e.parquet"),
            "s",
            "d",
            "pagerank",
            weight="w",
            params={"convergence": "networkx"},
        ),
        GraphQuery(Scan("/e.parquet"), "s", "d", "cosine", directed=False),
    ]
    for query in queries:
        again = as_query(json.dumps(query.to_dict()))
        assert again == query
        assert hash(again) == hash(query)


def test_defaults_fill_in() -> None:
    graph = GraphQuery(Scan("/e"), "s", "d", "PageRank")
    assert graph.algorithm == "pagerank"
    assert dict(graph.params) == {
        "alpha": 0.85,
        "tol": 1e-6,
        "max_iter": 100,
        "convergence": "total",
    }
    with pytest.raises(TypeError):
        graph.params["alpha"] = 0.5  # type: ignore[index]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Scan(""), "Scan.source"),
        (lambda: Scan("/x", columns="a"), "list of names"),
        (lambda: Scan("/x", columns=("a", "a")), "distinct"),
        (lambda: Scan("/x", batch_rows=0), "batch_rows"),
        (lambda: GraphQuery(Scan("/e"), "s", "d", "louvain"), "pagerank, bfs"),
        (lambda: GraphQuery(Scan("/e"), "s", "d", "bfs"), "required for bfs"),
        (lambda: GraphQuery(Scan("/e"), "s", "s", "pagerank"), "two columns"),
        (lambda: GraphQuery(Scan("/e"), "s", "d", "pagerank", params={"alpha": 1.5}), r"\(0, 1\)"),
        (
            lambda: GraphQuery(Scan("/e"), "s", "d", "jaccard", params={"alpha": 0.5}),
            "accepted: none",
        ),
        (lambda: GraphQuery(Count("/e"), "s", "d", "pagerank"), "use a Scan"),  # type: ignore[arg-type]
        (
            lambda: GraphQuery(Scan("/e"), "s", "d", "pagerank", params={"convergence": "l1"}),
            "use one of: total, networkx",
        ),
        (lambda: GraphQuery(Scan("/e"), "s", "d", "jaccard", weight="w"), "ignores edge weights"),
        (
            lambda: GraphQuery(Scan("/e"), "s", "d", "bfs", weight="w", params={"source": 1}),
            r"GraphQuery.weight='w' is not accepted for bfs",
        ),
    ],
)
def test_invalid_queries(build, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=match):
        build()


def test_malformed_json() -> None:
    with pytest.raises(ConfigError, match="malformed"):
        as_query("{")
    with pytest.raises(ConfigError, match="scan, count, graph"):
        as_query({"type": "join"})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['colour'\]"):
        as_query({"type": "count", "source": "/x", "colour": 1})


def test_deeply_nested_json_is_a_config_error() -> None:
    # json raises RecursionError (not JSONDecodeError) past its nesting limit
    nested = '{"type": "scan", "source": "/x", "columns": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for text in ("[" * 100_000, nested):
        with pytest.raises(ConfigError, match="nested too deeply"):
            as_query(text)
