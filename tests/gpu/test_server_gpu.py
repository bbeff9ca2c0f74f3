"""``nexus-cache serve`` on the CUDA backend, end to end.

Run on the GPU machine (CuPy, one GPU or more); skipped elsewhere by
tests/conftest.py. The host suite's assertions with the server's caches in
device memory: repeated CLI queries from separate processes hit, results
equal the in-process service's, single flight across client processes, a
client killed mid-stream leaves no grant, the reports show CUDA caches, and
SIGTERM drains them and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nexus_cache.client import Client
from nexus_cache.service import GraphQuery, QueryService, Scan, ServiceConfig, tables_match
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet
from server._helpers import (
    close_all,
    run_cli,
    run_python,
    server_env,
    start_server,
    wait_until,
)

pytestmark = pytest.mark.gpu

_SCAN_CLIENT = """
import sys
from nexus_cache.client import Client
result = Client(sys.argv[1]).execute({"type": "scan", "source": sys.argv[2]})
print(result.diagnostics.source_cache["status"], result.table.num_rows)
"""

_SLOW_READER = """
import sys, time
import pyarrow.flight as flight
reader = flight.connect(sys.argv[1]).do_get(flight.Ticket(sys.argv[2].encode()))
reader.read_chunk()
print("reading", flush=True)
time.sleep(600)
"""


def test_server_on_the_gpu_end_to_end(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    edges = rmat_edges(12)
    write_parquet(edges, lake / "edges.parquet", row_groups=4)
    write_parquet(fact_table(100_000), lake / "facts.parquet", row_groups=4)
    write_parquet(fact_table(50_000), lake / "shared.parquet", row_groups=4)
    n = 8_000_000
    pq.write_table(
        pa.table({"a": np.arange(n, dtype=np.int64), "b": np.arange(n, dtype=np.float64)}),
        lake / "big.parquet",
        compression="none",
    )
    past = time.time() - 60
    for path in lake.iterdir():
        os.utime(path, (past, past))
    env = server_env(tmp_path, backend="cuda")
    server = start_server(env, "--metrics-port", "0", timeout=300)
    try:
        with Client(server.url) as client:
            health = client.health()
            assert health["status"] == "ready"
            assert health["backend"] == "cuda"
            assert health["warm_up_s"] >= 0

        # repeated CLI queries from separate processes hit the server's GPU caches
        args = ["scan", str(lake / "facts.parquet"), "--limit", "2", "--server", server.url]
        cold = json.loads(run_cli(env, *args, "--json").stdout)
        warm = json.loads(run_cli(env, *args, "--json").stdout)
        assert cold["diagnostics"]["source_cache"]["status"] == "miss-led"
        assert warm["diagnostics"]["source_cache"]["status"] == "hit"
        assert (
            warm["diagnostics"]["result_fingerprint"] == cold["diagnostics"]["result_fingerprint"]
        )

        # graph queries: miss then hit, the same answers as the service in process
        edge_scan = Scan(str(lake / "edges.parquet"), columns=("src", "dst"))
        queries = [
            GraphQuery(edge_scan, "src", "dst", "pagerank"),
            GraphQuery(
                edge_scan, "src", "dst", "bfs", params={"source": int(edges["src"][0].as_py())}
            ),
            GraphQuery(edge_scan, "src", "dst", "jaccard", directed=False),
        ]
        with Client(server.url) as client:
            remote = []
            for query in queries:
                first = client.execute(query)
                second = client.execute(query)
                assert first.diagnostics.graph_cache["status"] == "miss"
                assert second.diagnostics.graph_cache["status"] == "hit"
                assert tables_match(first.table, second.table)
                remote.append(first.table)
        config = ServiceConfig.from_env(environ=server_env(tmp_path / "local", backend="cuda"))
        with QueryService(config) as service:
            for query, table in zip(queries, remote, strict=True):
                assert tables_match(service.execute(query).table, table)

        # six cold client processes: one decode
        clients = [
            run_python(env, _SCAN_CLIENT, server.url, str(lake / "shared.parquet"))
            for _ in range(6)
        ]
        statuses = []
        for process in clients:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err
            statuses.append(out.split()[0])
        assert statuses.count("miss-led") == 1, statuses

        # a client killed mid-stream leaves no grant behind
        ticket = json.dumps({"type": "scan", "source": str(lake / "big.parquet")})
        reader = run_python(env, _SLOW_READER, server.url, ticket)
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "reading"
        reader.kill()
        reader.communicate(timeout=60)
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=60)
            (row, *_) = client.reports()
            assert row["grant_count"] == 0
            assert row["backend"] == "cuda"
            assert row["graph_entries"] >= 1
            assert row["cache_evictable_resident_bytes"] > 0

        report = run_cli(env, "device", "report", "--server", server.url, "--json")
        assert report.returncode == 0, report.stderr
        assert json.loads(report.stdout)[0]["backend"] == "cuda"

        assert server.stop() == 0
        log = server.log()
        assert "graph cache, then source cache drained, domain owner released" in log
        assert "big.parquet" in log
    finally:
        close_all([server])
