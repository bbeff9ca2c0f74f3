"""Graph parameters at their limits, as a user can give them: the graph API,
the command line and a JSON query (docs/graph.md, docs/service.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError
from nexus_cache.graph import GraphOptions, bfs, build_graph, pagerank
from nexus_cache.graph._host_engine import ENV_HOST_ENGINE
from nexus_cache.service import as_query

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
ENGINES = [
    pytest.param("numba", marks=pytest.mark.skipif(not HAVE_NUMBA, reason="needs numba")),
    "numpy",
]
# a depth no graph reaches, as JSON can carry it (Python ints are unbounded)
HUGE = [2**63 - 1, 2**63, 10**23]
PATH = [(1, 2), (2, 3), (3, 4), (4, 1), (7, 8)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("depth_limit", HUGE)
def test_a_depth_limit_beyond_any_level_is_no_limit(
    engine: str, depth_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_HOST_ENGINE, engine)
    edges = np.array(PATH, dtype=np.int64)
    graph = build_graph(
        {"src": edges[:, 0], "dst": edges[:, 1]}, options=GraphOptions(directed=False)
    )
    result = bfs(graph, 1, depth_limit=depth_limit)
    table = result.to_arrow().to_pydict()
    got = {v: d for v, d in zip(table["vertex"], table["distance"], strict=True) if d is not None}
    assert got == nx.single_source_shortest_path_length(nx.Graph(PATH), 1)
    assert result.info["levels"] == bfs(graph, 1).info["levels"]


@pytest.fixture
def edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", str(1 << 30))
    monkeypatch.delenv("NEXUS_LAKEHOUSE_CACHE_ROOT", raising=False)
    path = tmp_path / "edges.parquet"
    src, dst = zip(*PATH, strict=True)
    pq.write_table(
        pa.table({"src": pa.array(src, pa.int64()), "dst": pa.array(dst, pa.int64())}), path
    )
    return str(path)


def test_the_graph_command_takes_a_huge_depth_limit(
    edges: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["graph", "bfs", edges, "--src", "src", "--dst", "dst", "--source", "1"]
    assert main([*argv, "--depth-limit", str(10**23), "--json"]) == 0
    head = json.loads(capsys.readouterr().out)["head"]
    assert {row["vertex"]: row["distance"] for row in head} == {
        1: 0,
        2: 1,
        3: 2,
        4: 3,
        7: None,
        8: None,
    }


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "minus-huge"])
@pytest.mark.parametrize(("algorithm", "name"), [("pagerank", "alpha"), ("pagerank", "tol")])
def test_a_number_beyond_float_range_in_a_json_query_is_a_config_error(
    algorithm: str, name: str, value: int
) -> None:
    query = {
        "type": "graph",
        "edges": {"source": "edges.parquet"},
        "src": "s",
        "dst": "d",
        "algorithm": algorithm,
        "params": {name: value},
    }
    with pytest.raises(ConfigError, match=rf"GraphQuery.params\['{name}'\]=.* is not accepted"):
        as_query(json.dumps(query))


@pytest.mark.parametrize("kind", [[], {}, ["graph"], 1.5, None])
@pytest.mark.parametrize("where", ["query", "edges"])
def test_a_query_type_of_any_json_value_is_a_config_error(where: str, kind: object) -> None:
    query: dict[str, object] = {
        "type": "graph",
        "edges": {"type": "scan", "source": "edges.parquet"},
        "src": "s",
        "dst": "d",
        "algorithm": "degree",
    }
    target = query if where == "query" else query["edges"]
    assert isinstance(target, dict)
    target["type"] = kind
    with pytest.raises(ConfigError, match=r"type=.* is not accepted; use one of: scan"):
        as_query(json.dumps(query))


@pytest.mark.parametrize("name", ["alpha", "tol"])
def test_pagerank_refuses_an_int_beyond_float_range_as_a_config_error(name: str) -> None:
    edges = np.array(PATH, dtype=np.int64)
    graph = build_graph({"src": edges[:, 0], "dst": edges[:, 1]})
    with pytest.raises(ConfigError, match=f"pagerank {name}="):
        pagerank(graph, **{name: 10**400})
