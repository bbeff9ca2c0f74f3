"""Graph queries at their edges: empty tables, mixed id types across objects,
an object without a column, repeated edges, PageRank's convergence facts, and
the ``graph`` command's flags."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import networkx as nx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError, GraphInputError
from nexus_cache.service import GraphQuery, Scan

from ._helpers import MIB, make_lake, make_service, use_host_cli

ALL = [
    ("pagerank", {}),
    ("bfs", {"source": 7}),
    ("jaccard", {}),
    ("sorensen", {}),
    ("overlap", {}),
    ("cosine", {}),
    ("degree", {}),
    ("triangles", {}),
]


def _directed(algorithm: str) -> bool:
    """Directed, unless the algorithm takes undirected graphs only."""
    from nexus_cache.graph import ALGORITHMS as SPECS

    return not SPECS[algorithm].undirected_only


def _write(path: Path, table: pa.Table) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    past = time.time() - 60  # older than the identity check's minimum age
    os.utime(path, (past, past))
    return str(path)


def _ids(values: list[int], type_: pa.DataType | None = None) -> pa.Array:
    return pa.array(values, type_ or pa.int64())


@pytest.mark.parametrize("cap", [64 * MIB, 0], ids=["graph-cache", "no-cache"])
@pytest.mark.parametrize(("algorithm", "params"), ALL, ids=[a for a, _ in ALL])
def test_an_empty_edge_table_gives_an_empty_result(
    tmp_path: Path, cap: int, algorithm: str, params: dict
) -> None:
    empty = _write(tmp_path / "empty.parquet", pa.table({"s": _ids([]), "d": _ids([])}))
    with make_service(tmp_path, cache_cap_bytes=cap) as service:
        query = GraphQuery(
            Scan(empty), "s", "d", algorithm, directed=_directed(algorithm), params=params
        )
        if algorithm == "bfs":  # no vertex is in an empty graph: as for any missing source
            with pytest.raises(GraphInputError, match=r"\[7\] are not in the graph"):
                service.execute(query)
            return
        for _ in range(2):  # the miss, then the hit
            result = service.execute(query)
            assert result.table.num_rows == 0
        expected = "hit" if cap else "bypass"
        assert result.diagnostics.graph_cache["status"] == expected
    if algorithm == "pagerank":
        assert result.diagnostics.algorithm["converged"] is True


def test_int64_and_uint64_id_columns_combine_as_in_a_scan(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    _write(mixed / "a.parquet", pa.table({"s": _ids([1, 2]), "d": _ids([2, 3])}))
    big = 2**62 + 1
    _write(
        mixed / "b.parquet",
        pa.table({"s": _ids([3, big], pa.uint64()), "d": _ids([1, 1], pa.uint64())}),
    )
    one = _write(
        tmp_path / "one.parquet", pa.table({"s": _ids([1, 2, 3, big]), "d": _ids([2, 3, 1, 1])})
    )
    with make_service(tmp_path) as service:
        for algorithm, params in ALL:
            query = GraphQuery(
                Scan(str(mixed)),
                "s",
                "d",
                algorithm,
                directed=_directed(algorithm),
                params={**params, "source": 1} if algorithm == "bfs" else params,
            )
            got = service.execute(query).table
            want = service.execute(
                GraphQuery(
                    Scan(one), "s", "d", algorithm, directed=query.directed, params=query.params
                )
            ).table
            assert got.equals(want), algorithm
            assert big in got.column(0).to_pylist()
            assert got.schema.field(0).type == pa.int64()


def test_uint64_ids_beyond_int64_and_a_missing_column_name_the_object(tmp_path: Path) -> None:
    huge = tmp_path / "huge"
    _write(huge / "a.parquet", pa.table({"s": _ids([1]), "d": _ids([2])}))
    _write(
        huge / "b.parquet",
        pa.table({"s": _ids([2**63], pa.uint64()), "d": _ids([1], pa.uint64())}),
    )
    partial = tmp_path / "partial"
    _write(partial / "a.parquet", pa.table({"s": _ids([1]), "d": _ids([2])}))
    _write(partial / "b.parquet", pa.table({"s": _ids([2])}))
    with make_service(tmp_path) as service:
        with pytest.raises(
            GraphInputError, match=r"column 's' of edge object '.*b\.parquet'.*2\*\*63"
        ):
            service.execute(GraphQuery(Scan(str(huge)), "s", "d", "pagerank"))
        with pytest.raises(GraphInputError, match=r"edge object '.*b\.parquet' has no column 'd'"):
            service.execute(GraphQuery(Scan(str(partial)), "s", "d", "pagerank"))


def test_repeated_edges_count_the_same_with_or_without_a_weight_column(tmp_path: Path) -> None:
    src = [0, 0, 0, 1, 2, 2, 3]
    dst = [1, 1, 2, 2, 0, 3, 0]  # 0 -> 1 twice
    edges = _write(
        tmp_path / "e.parquet",
        pa.table({"s": _ids(src), "d": _ids(dst), "one": pa.array([1.0] * 7)}),
    )
    params = {"tol": 1e-12}
    with make_service(tmp_path) as service:
        plain = service.execute(GraphQuery(Scan(edges), "s", "d", "pagerank", params=params)).table
        ones = service.execute(
            GraphQuery(Scan(edges), "s", "d", "pagerank", weight="one", params=params)
        ).table
    assert plain.equals(ones)
    expected = nx.pagerank(nx.MultiDiGraph(list(zip(src, dst, strict=True))), tol=1e-14)
    for vertex, rank in zip(
        plain["vertex"].to_pylist(), plain["pagerank"].to_pylist(), strict=True
    ):
        assert rank == pytest.approx(expected[vertex], abs=1e-10)


def test_pagerank_reports_its_convergence(tmp_path: Path) -> None:
    edges = _write(
        tmp_path / "e.parquet", pa.table({"s": _ids([0, 1, 2, 2]), "d": _ids([1, 2, 0, 3])})
    )
    with make_service(tmp_path) as service:
        done = service.execute(GraphQuery(Scan(edges), "s", "d", "pagerank"))
        stopped = service.execute(
            GraphQuery(Scan(edges), "s", "d", "pagerank", params={"max_iter": 2})
        )
        rule = service.execute(
            GraphQuery(Scan(edges), "s", "d", "pagerank", params={"convergence": "networkx"})
        )
        bfs = service.execute(GraphQuery(Scan(edges), "s", "d", "bfs", params={"source": 0}))
    facts = done.diagnostics.algorithm
    assert facts["converged"] is True
    assert facts["error"] < facts["threshold"] == 1e-6
    assert 1 <= facts["iterations"] <= 100
    assert done.diagnostics.to_dict()["algorithm"] == facts
    assert stopped.diagnostics.algorithm["converged"] is False
    assert stopped.diagnostics.algorithm["iterations"] == 2
    assert rule.diagnostics.algorithm["threshold"] == pytest.approx(4e-6)
    assert set(bfs.diagnostics.algorithm) == {"levels"}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    use_host_cli(monkeypatch)
    _write(
        tmp_path / "e.parquet",
        pa.table({"s": _ids([0, 1, 2, 2]), "d": _ids([1, 2, 0, 3]), "w": pa.array([1.0] * 4)}),
    )
    return tmp_path


def _graph(env: Path, *args: str) -> list[str]:
    return ["graph", args[0], str(env / "e.parquet"), "--src", "s", "--dst", "d", *args[1:]]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("bfs",), "--source is required for bfs"),
        (("pagerank", "--alpha", "1.5"), "--alpha=1.5 is not accepted for pagerank"),
        (("pagerank", "--tol", "0"), "--tol=0.0 is not accepted"),
        (("pagerank", "--max-iter", "0"), "--max-iter=0 is not accepted"),
        (("bfs", "--source", "0", "--depth-limit", "-1"), "--depth-limit=-1 is not accepted"),
        (("jaccard", "--alpha", "0.5"), "--alpha does not apply to jaccard"),
        (("jaccard", "--weight", "w"), "--weight does not apply to jaccard"),
        (("cosine", "--weight", "w"), "--weight does not apply to cosine"),
        (("bfs", "--source", "0", "--weight", "w"), "--weight does not apply to bfs"),
        (("pagerank", "--src", "d"), "--src and --dst are both 'd'"),
    ],
)
def test_graph_command_errors_name_flags(
    env: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], expected: str
) -> None:
    assert main(_graph(env, *argv)) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1
    assert "GraphQuery." not in err
    assert "params" not in err


def test_graph_command_reports_pagerank_convergence(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_graph(env, "pagerank", "--weight", "w")) == 0
    out, err = capsys.readouterr()
    assert "pagerank converged in" in out
    assert err == ""
    assert main(_graph(env, "pagerank", "--max-iter", "2")) == 0
    out, err = capsys.readouterr()
    assert "pagerank did not converge in 2 iterations" in out
    assert err.startswith("nexus-cache: warning: pagerank did not converge")
    assert "--max-iter" in err
    assert main(_graph(env, "pagerank", "--convergence", "networkx", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    facts = report["diagnostics"]["algorithm"]
    assert facts["converged"] is True
    assert facts["threshold"] == pytest.approx(4e-6)
    assert report["diagnostics"]["query"]["params"]["convergence"] == "networkx"


def test_the_convergence_rules_are_spelled_alike_everywhere() -> None:
    from nexus_cache.cli.main import build_parser
    from nexus_cache.graph import CONVERGENCE_RULES, get_spec, ranking

    graph_parser = build_parser()._subparsers._group_actions[0].choices["graph"]  # type: ignore[union-attr]
    flag = next(a for a in graph_parser._actions if "--convergence" in a.option_strings)
    assert tuple(flag.choices) == ranking.CONVERGENCE_RULES == CONVERGENCE_RULES
    assert get_spec("pagerank").defaults()["convergence"] == CONVERGENCE_RULES[0]


def _degrees(graph: nx.Graph, direction: str) -> dict[int, int]:
    if not graph.is_directed() or direction == "total":
        return dict(graph.degree())
    return dict(graph.out_degree() if direction == "out" else graph.in_degree())


def test_degree_through_the_service_matches_networkx_and_reuses_the_parked_graph(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    edges = pq.read_table(lake.edges)
    pairs = list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    with make_service(tmp_path) as service:
        for directed in (True, False):
            reference = (nx.DiGraph if directed else nx.Graph)(pairs)
            # BFS builds the graph degree runs on (as stored, neighbour sets)
            first = GraphQuery(
                Scan(lake.edges),
                "src",
                "dst",
                "bfs",
                directed=directed,
                params={"source": lake.bfs_source},
            )
            assert service.execute(first).diagnostics.graph_cache["status"] == "miss"
            for direction in ("total", "out", "in"):
                query = GraphQuery(
                    Scan(lake.edges),
                    "src",
                    "dst",
                    "degree",
                    directed=directed,
                    params={"direction": direction},
                )
                result = service.execute(query)
                assert result.diagnostics.graph_cache["status"] == "hit"
                table = result.table.to_pydict()
                assert table.keys() == {"vertex", "degree"}
                got = dict(zip(table["vertex"], table["degree"], strict=True))
                assert got == _degrees(reference, direction), (directed, direction)


def test_the_graph_command_runs_degree_with_its_own_flag(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_graph(env, "degree", "--direction", "in", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["diagnostics"]["query"]["params"] == {"direction": "in"}
    assert report["diagnostics"]["query"]["directed"] is True
    rows = {r["vertex"]: r["degree"] for r in report["head"]}
    assert rows == {0: 1, 1: 1, 2: 1, 3: 1}  # edges 0->1, 1->2, 2->0, 2->3
    assert main(_graph(env, "degree", "--alpha", "0.5")) == 2
    assert "--alpha does not apply to degree" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(_graph(env, "degree", "--direction", "both"))
    assert exit_.value.code == 2
    assert "--direction: invalid choice: 'both'" in capsys.readouterr().err


def test_triangles_through_the_service_and_the_command_match_networkx(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = make_lake(tmp_path)
    edges = pq.read_table(lake.edges)
    reference = nx.Graph(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    reference.remove_edges_from(list(nx.selfloop_edges(reference)))
    expected = nx.triangles(reference)
    assert sum(expected.values()) > 0
    query = GraphQuery(Scan(lake.edges), "src", "dst", "triangles", directed=False)
    with make_service(tmp_path) as service:
        # the similarities' graph (undirected, as stored, neighbour sets) serves it
        jaccard = GraphQuery(Scan(lake.edges), "src", "dst", "jaccard", directed=False)
        assert service.execute(jaccard).diagnostics.graph_cache["status"] == "miss"
        result = service.execute(query)
    assert result.diagnostics.graph_cache["status"] == "hit"
    table = result.table.to_pydict()
    assert dict(zip(table["vertex"], table["triangles"], strict=True)) == expected
    with pytest.raises(ConfigError, match="directed=True is not accepted for triangles"):
        GraphQuery(Scan(lake.edges), "src", "dst", "triangles", directed=True)
    # the command line: undirected by default, --directed refused naming the flag
    assert main(_graph(env, "triangles", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["diagnostics"]["query"]["directed"] is False
    assert {r["vertex"]: r["triangles"] for r in report["head"]} == {0: 1, 1: 1, 2: 1, 3: 0}
    assert main(_graph(env, "triangles", "--directed")) == 2
    assert "--directed does not apply to triangles" in capsys.readouterr().err


def test_a_graph_query_takes_its_algorithm_s_direction_from_the_registry() -> None:
    from nexus_cache.graph import ALGORITHMS as SPECS
    from nexus_cache.service import as_query

    assert {n for n, spec in SPECS.items() if not spec.directed} >= {"jaccard", "triangles"}
    for name, spec in SPECS.items():
        params = spec.sample_params(0)
        told = GraphQuery(Scan("/e"), "s", "d", name, directed=spec.directed, params=params)
        left_out = GraphQuery(Scan("/e"), "s", "d", name, params=params)
        assert left_out.directed is spec.directed, name
        # resolved at construction: one JSON form and one key, however it was given
        assert left_out == told
        assert hash(left_out) == hash(told)
        data = told.to_dict()
        assert left_out.to_dict() == data
        del data["directed"]
        assert as_query(data) == told
        assert as_query({**data, "directed": None}) == told
    with pytest.raises(ConfigError, match=r"GraphQuery.directed='yes' is not accepted"):
        GraphQuery(Scan("/e"), "s", "d", "jaccard", directed="yes")  # type: ignore[arg-type]


# arcs without self loops (NetworkX leaves a loop's vertex out of its common
# neighbours, the graph layer does not), on which directed and undirected
# Jaccard differ
_ARCS = [(0, 1), (0, 2), (1, 2), (2, 3), (3, 1), (4, 0), (4, 2), (5, 4), (3, 0)]


def _jaccard(table: pa.Table) -> dict[tuple[int, int], float]:
    rows = table.to_pydict()
    return {
        (u, v): s for u, v, s in zip(rows["first"], rows["second"], rows["jaccard"], strict=True)
    }


def test_triangles_and_jaccard_without_directed_match_networkx_undirected(
    tmp_path: Path,
) -> None:
    src, dst = zip(*_ARCS, strict=True)
    edges = _write(
        tmp_path / "arcs.parquet", pa.table({"s": _ids(list(src)), "d": _ids(list(dst))})
    )
    undirected = nx.Graph(_ARCS)
    with make_service(tmp_path) as service:
        triangles = service.execute(GraphQuery(Scan(edges), "s", "d", "triangles")).table
        jaccard = service.execute(GraphQuery(Scan(edges), "s", "d", "jaccard")).table
        directed = service.execute(GraphQuery(Scan(edges), "s", "d", "jaccard", directed=True))
    rows = triangles.to_pydict()
    assert dict(zip(rows["vertex"], rows["triangles"], strict=True)) == nx.triangles(undirected)
    got = _jaccard(jaccard)
    assert {frozenset(pair) for pair in got} == {frozenset(e) for e in undirected.edges}
    want = {(u, v): s for u, v, s in nx.jaccard_coefficient(undirected, list(got))}
    assert got == pytest.approx(want)
    assert _jaccard(directed.table) != pytest.approx(want)  # the default is not directed


@pytest.mark.parametrize("algorithm", ["jaccard", "triangles", "pagerank"])
def test_the_command_line_and_a_json_query_agree_on_the_default_direction(
    env: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    from nexus_cache.graph import ALGORITHMS as SPECS
    from nexus_cache.service import QueryService, ServiceConfig, as_query

    assert main(_graph(env, algorithm, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    text = json.dumps(
        {
            "type": "graph",
            "edges": {"type": "scan", "source": str(env / "e.parquet"), "columns": ["s", "d"]},
            "src": "s",
            "dst": "d",
            "algorithm": algorithm,
        }
    )
    query = as_query(text)
    assert query.to_dict() == report["diagnostics"]["query"]
    assert report["diagnostics"]["query"]["directed"] is SPECS[algorithm].directed
    with QueryService(ServiceConfig.from_env()) as service:
        result = service.execute(query)
    assert result.diagnostics.result_fingerprint == report["diagnostics"]["result_fingerprint"]


def test_a_kept_graph_error_leaves_the_parked_graph_free_to_tear_down(tmp_path: Path) -> None:
    # A BFS from a vertex that is not in the graph fails inside the algorithm, on
    # the parked graph. The caller keeps the error: its traceback must not keep
    # the graph's arrays alive, or the graph's teardown is unsafe and the device
    # refuses every later query.
    lake = make_lake(tmp_path)
    edges = Scan(lake.edges, columns=("src", "dst"))
    with make_service(tmp_path) as service:
        bfs = GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source})
        assert service.execute(bfs).diagnostics.graph_cache["status"] == "miss"
        with pytest.raises(GraphInputError, match="not vertices of the graph") as kept:
            service.execute(GraphQuery(edges, "src", "dst", "bfs", params={"source": -7}))
        (shut,) = service.shutdown(5.0)
    assert shut.graph is not None
    assert (shut.graph.destroyed, shut.graph.quarantined) == (1, 0)
    assert shut.complete, shut
    assert kept.value.__traceback__ is not None
