"""degree and triangles through a real server, and their parameter errors as
Flight errors and one-line CLI errors (docs/server.md, docs/service.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import networkx as nx
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import ConfigError

from ._helpers import Server, close_all, run_cli, server_env, start_server

# directed arcs: a repeat, a self loop, a 2-cycle, a triangle, mixed-sign and huge ids
ARCS = [(0, 1), (0, 1), (1, 2), (2, 0), (2, 3), (3, 3), (3, -7), (-7, 2), (2**62, 0), (1, 0)]


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("graph") / "edges.parquet"
    src, dst = zip(*ARCS, strict=True)
    pq.write_table(
        pa.table({"s": pa.array(src, pa.int64()), "d": pa.array(dst, pa.int64())}), path
    )
    past = time.time() - 60  # older than local_min_age_s: a provable identity
    os.utime(path, (past, past))
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    env = server_env(tmp_path_factory.mktemp("served"))
    server = start_server(env)
    try:
        yield server, env
    finally:
        close_all([server])


def _query(edges: str, algorithm: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "graph",
        "edges": {"type": "scan", "source": edges, "columns": ["s", "d"]},
        "src": "s",
        "dst": "d",
        "algorithm": algorithm,
        **fields,
    }


def _column(table: pa.Table, name: str) -> dict[int, Any]:
    return dict(zip(table["vertex"].to_pylist(), table[name].to_pylist(), strict=True))


def test_degree_and_triangles_through_the_server_match_networkx(
    served: tuple[Server, dict[str, str]], edges: str
) -> None:
    server, _ = served
    directed, undirected = nx.DiGraph(ARCS), nx.Graph(ARCS)
    expected = {
        "total": dict(directed.degree),
        "in": dict(directed.in_degree),
        "out": dict(directed.out_degree),
    }
    with Client(server.url) as client:
        statuses = []
        for direction, want in expected.items():
            query = _query(edges, "degree", params={"direction": direction})
            result = client.execute(json.dumps(query))
            assert _column(result.table, "degree") == want, direction
            statuses.append(result.diagnostics.graph_cache["status"])
        # one parked graph serves every direction; the results still differ
        assert statuses[1:] == ["hit", "hit"]
        result = client.execute(json.dumps(_query(edges, "degree", directed=False)))
        assert _column(result.table, "degree") == dict(undirected.degree)
        result = client.execute(json.dumps(_query(edges, "triangles", directed=False)))
        undirected.remove_edges_from(list(nx.selfloop_edges(undirected)))
        assert _column(result.table, "triangles") == nx.triangles(undirected)
        # the parked undirected graph of the degree query served the triangles
        assert result.diagnostics.graph_cache["status"] == "hit"


def test_a_json_query_without_directed_takes_the_algorithm_s_default(
    served: tuple[Server, dict[str, str]], edges: str
) -> None:
    """triangles and jaccard are undirected unless told, through the server as in the
    command line (which sends the query it resolved)."""
    server, env = served
    undirected = nx.Graph(ARCS)
    undirected.remove_edges_from(list(nx.selfloop_edges(undirected)))
    with Client(server.url) as client:
        result = client.execute(json.dumps(_query(edges, "triangles")))
        assert _column(result.table, "triangles") == nx.triangles(undirected)
        assert result.diagnostics.query["directed"] is False
        told = client.execute(json.dumps(_query(edges, "jaccard", directed=False)))
        left_out = client.execute(json.dumps(_query(edges, "jaccard")))
    assert left_out.diagnostics.query == told.diagnostics.query
    assert left_out.diagnostics.result_fingerprint == told.diagnostics.result_fingerprint
    args = ["graph", "jaccard", edges, "--src", "s", "--dst", "d", "--server", server.url]
    done = run_cli(env, *args, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["diagnostics"]
    assert report["query"] == told.diagnostics.query
    assert report["result_fingerprint"] == told.diagnostics.result_fingerprint


@pytest.mark.parametrize(
    ("algorithm", "fields", "message"),
    [
        ("degree", {"params": {"direction": "Out"}}, "GraphQuery.params['direction']='Out'"),
        ("degree", {"params": {"direction": None}}, "use one of: total, out, in"),
        ("degree", {"params": {"alpha": 0.5}}, "GraphQuery.params['alpha'] does not apply"),
        (
            "triangles",
            {"directed": True},
            "GraphQuery.directed=True is not accepted for triangles",
        ),
        ("triangles", {"directed": False, "params": {"direction": "in"}}, "does not apply"),
        ("pagerank", {"params": {"alpha": float("nan")}}, "GraphQuery.params['alpha']=nan"),
        ("pagerank", {"params": {"max_iter": "10"}}, "GraphQuery.params['max_iter']='10'"),
        # JSON carries integers beyond any float
        ("pagerank", {"params": {"tol": 10**400}}, "GraphQuery.params['tol']=1000"),
        ("bfs", {"params": {"source": 1.5}}, "GraphQuery.params['source']=1.5"),
        ("degree", {"weight": "s"}, "GraphQuery.weight='s' is not accepted for degree"),
        ("degree", {"type": []}, "query type=[] is not accepted"),
    ],
)
def test_bad_graph_parameters_are_flight_errors_naming_the_field(
    served: tuple[Server, dict[str, str]],
    edges: str,
    algorithm: str,
    fields: dict[str, Any],
    message: str,
) -> None:
    server, _ = served
    raw = json.dumps(_query(edges, algorithm, **fields)).encode()
    client = flight.connect(server.url)
    try:
        with pytest.raises(flight.FlightServerError) as info:
            client.do_get(flight.Ticket(raw)).read_all()
    finally:
        client.close()
    assert message in str(info.value)
    assert json.loads(info.value.extra_info)["error"] == ConfigError.__name__


def test_graph_command_errors_through_the_server_are_one_line_exit_2(
    served: tuple[Server, dict[str, str]], edges: str
) -> None:
    server, env = served
    base = ["graph", "--server", server.url, "--src", "s", "--dst", "d"]
    for args, message in [
        (["triangles", edges, "--directed"], "--directed does not apply to triangles"),
        (["degree", edges, "--max-iter", "3"], "--max-iter does not apply to degree"),
        (["bfs", edges, "--source", "0", "--direction", "in"], "--direction does not apply"),
    ]:
        done = run_cli(env, *base[:1], *args, *base[1:])
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert message in done.stderr


def test_a_huge_depth_limit_through_the_server_is_no_limit(
    served: tuple[Server, dict[str, str]], edges: str
) -> None:
    server, env = served
    args = ["graph", "bfs", edges, "--src", "s", "--dst", "d", "--source", "0", "--json"]
    done = run_cli(env, *args, "--depth-limit", str(10**23), "--server", server.url)
    assert done.returncode == 0, done.stderr
    head = json.loads(done.stdout)["head"]
    want = nx.single_source_shortest_path_length(nx.DiGraph(ARCS), 0)
    assert {r["vertex"]: r["distance"] for r in head if r["distance"] is not None} == want
