"""Filtered table scans through a real server, the Python client and the CLI's --filter."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.server._helpers import Server, close_all, run_cli, server_env, start_server
from tests.tables._compare import assert_same_rows

from nexus_cache.client import Client
from nexus_cache.service import Count, GraphQuery, Scan


@pytest.fixture(scope="module")
def hive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tables") / "edges"
    for year in (2024, 2025):
        for kind in ("follow", "like"):
            part = root / f"year={year}" / f"kind={kind}"
            part.mkdir(parents=True)
            n = 50
            base = year * 10 + len(kind)
            pq.write_table(
                pa.table(
                    {
                        "src": pa.array([(base + i) % 17 for i in range(n)], pa.int64()),
                        "dst": pa.array([(base * 3 + i) % 13 for i in range(n)], pa.int64()),
                        "w": pa.array([i / n for i in range(n)]),
                    }
                ),
                part / "part-0.parquet",
            )
    past = time.time() - 60
    for path in root.rglob("*.parquet"):
        os.utime(path, (past, past))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    root = tmp_path_factory.mktemp("served")
    env = server_env(root)
    server = start_server(env, "--metrics-port", "0")
    try:
        yield server, env
    finally:
        close_all([server])


def _want(root: Path, flt: list, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def test_the_client_runs_a_filtered_scan_and_a_filtered_graph(
    served: tuple[Server, dict[str, str]], hive: Path
) -> None:
    server, _ = served
    flt = [("year", "=", 2025), ("kind", "in", ["like"]), ("w", "<", 0.5)]
    with Client(server.url) as client:
        result = client.execute(Scan(str(hive), ["src", "dst", "year"], filter=flt))
        graph = client.execute(
            GraphQuery(Scan(str(hive), ["src", "dst"], filter=flt), "src", "dst", "degree")
        )
    assert_same_rows(result.table, _want(hive, flt, ["src", "dst", "year"]))
    assert result.diagnostics.table["pruned_by_partition"] == 3
    assert result.diagnostics.table["rows_after_filter"] == result.table.num_rows
    edges = _want(hive, flt, ["src", "dst"])
    assert graph.diagnostics.source_cache["status"] == "hit"  # same projected columns
    out_degree = {v: 0 for v in set(edges["src"].to_pylist()) | set(edges["dst"].to_pylist())}
    for v in edges["src"].to_pylist():
        out_degree[v] += 1
    got = graph.table.to_pydict()
    assert set(got["vertex"]) == set(out_degree)


def test_the_cli_filter_and_as_of_options(
    served: tuple[Server, dict[str, str]], hive: Path, tmp_path: Path
) -> None:
    server, _ = served
    args = [
        "scan",
        str(hive),
        "--columns",
        "src,kind",
        "--filter",
        "year>=2025",
        "--filter",
        "kind in follow",
        "--limit",
        "1000",
        "--json",
    ]
    want = _want(hive, [("year", ">=", 2025), ("kind", "in", ["follow"])], ["src", "kind"])
    for extra in (["--server", server.url], []):
        env = server_env(tmp_path / "local") if not extra else served[1]
        done = run_cli(env, *args, *extra)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["rows"] == want.num_rows
        assert doc["diagnostics"]["table"]["filter"] == [
            [["kind", "in", ["follow"]], ["year", ">=", 2025]]
        ]
        assert sorted(r["src"] for r in doc["head"]) == sorted(want["src"].to_pylist())
    graph = run_cli(
        served[1],
        "graph",
        "degree",
        str(hive),
        "--src",
        "src",
        "--dst",
        "dst",
        "--filter",
        "w<0.2",
        "--server",
        server.url,
        "--json",
    )
    assert graph.returncode == 0, graph.stderr
    assert json.loads(graph.stdout)["diagnostics"]["table"]["filter"] == [[["w", "<", 0.2]]]
    bad = run_cli(served[1], "scan", str(hive), "--filter", "nope=1")
    assert bad.returncode != 0
    assert "nope" in bad.stderr
    refused = run_cli(served[1], "scan", str(hive), "--as-of", "3")
    assert refused.returncode != 0
    assert "as_of" in refused.stderr


def test_filtered_counts_through_the_client_and_the_cli(
    served: tuple[Server, dict[str, str]], hive: Path, tmp_path: Path
) -> None:
    server, env = served
    dataset = ds.dataset(str(hive), format="parquet", partitioning="hive")
    flt = [("year", "=", 2025), ("w", "<", 0.3)]
    want = dataset.count_rows(filter=pq.filters_to_expression(flt))
    with Client(server.url) as client:
        first = client.execute(Count(str(hive), filter=flt))
        other = client.execute(Count(str(hive), filter=[("year", "=", 2025), ("w", ">=", 0.3)]))
        by_year = client.execute(Count(str(hive), filter=[("year", "=", 2024)]))
    assert first.table["rows"].to_pylist() == [want]
    assert first.diagnostics.table["pruned_by_partition"] == 2
    assert other.diagnostics.source_cache["status"] == "hit"  # the same columns and files
    other_filter = pq.filters_to_expression([("year", "=", 2025), ("w", ">=", 0.3)])
    assert other.table["rows"].to_pylist() == [dataset.count_rows(filter=other_filter)]
    assert by_year.diagnostics.source_cache["status"] == "bypass"  # footers of kept files
    assert by_year.table["rows"].to_pylist() == [100]
    filters = ["--filter", "year=2025", "--filter", "w<0.3", "--json"]
    places = ((["--server", server.url], env), ([], server_env(tmp_path / "local")))
    for command in (["scan", str(hive), "--count"], ["count", str(hive)]):
        for extra, where in places:
            done = run_cli(where, *command, *filters, *extra)
            assert done.returncode == 0, done.stderr
            doc = json.loads(done.stdout)
            assert doc["columns"] == ["rows"]
            assert doc["head"] == [{"rows": want}]
            assert doc["diagnostics"]["query"]["type"] == "count"
    bad = run_cli(env, "scan", str(hive), "--count", "--columns", "src")
    assert bad.returncode == 2
    assert "--columns" in bad.stderr
