"""``nexus-cache serve`` end to end: real server processes on loopback, real clients.

One server serves most tests (module scope); tests that need their own
settings (a token, TLS, a restart) start their own.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import ConfigError, ServerAuthError, ServerUnavailableError
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

from ._helpers import (
    Server,
    close_all,
    run_cli,
    run_python,
    server_env,
    start_server,
    wait_until,
)


def _aged(*paths: Path) -> None:
    # older than the lakehouse's local_min_age_s: the identity is provable
    past = time.time() - 60
    for path in paths:
        os.utime(path, (past, past))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(rmat_edges(9), root / "edges.parquet", row_groups=4)
    for name in ("facts", "shared", "restart", "token"):
        write_parquet(fact_table(5000), root / f"{name}.parquet", row_groups=4)
    # a result large enough that gRPC's buffers cannot hold it: the stream
    # is still running when its client is killed
    n = 6_000_000
    big = pa.table({"a": np.arange(n, dtype=np.int64), "b": np.arange(n, dtype=np.float64)})
    pq.write_table(big, root / "big.parquet", compression="none", row_group_size=1 << 20)
    _aged(*root.iterdir())
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


def _ticket(query: dict[str, object]) -> flight.Ticket:
    return flight.Ticket(json.dumps(query).encode())


def _scan(path: Path, **extra: object) -> dict[str, object]:
    return {"type": "scan", "source": str(path), **extra}


# -- repeated CLI queries, identical output --------------------------------------------------


def test_repeated_cli_queries_from_separate_processes_hit(
    served: tuple[Server, dict[str, str]], lake: Path, tmp_path: Path
) -> None:
    server, env = served
    args = ["scan", str(lake / "facts.parquet"), "--limit", "3", "--server", server.url]
    first = run_cli(env, *args, "--json")
    second = run_cli(env, *args, "--json")
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    cold, warm = json.loads(first.stdout), json.loads(second.stdout)
    assert cold["diagnostics"]["source_cache"]["status"] == "miss-led"
    assert warm["diagnostics"]["source_cache"]["status"] == "hit"
    assert warm["diagnostics"]["lakehouse"]["read_mode"] == "not_read"
    assert warm["head"] == cold["head"]
    # the in-process command, on caches of its own, prints the same document
    local_env = server_env(tmp_path)
    local = run_cli(local_env, *args[:-2], "--json")
    assert local.returncode == 0, local.stderr
    mine = json.loads(local.stdout)
    assert mine.keys() == cold.keys()
    assert mine["head"] == cold["head"]
    assert mine["diagnostics"].keys() == cold["diagnostics"].keys()
    for part in ("lakehouse", "source_cache", "graph_cache"):
        assert mine["diagnostics"][part]["status"] == cold["diagnostics"][part]["status"]
    assert mine["diagnostics"]["result_fingerprint"] == cold["diagnostics"]["result_fingerprint"]
    # and the same table; the footer differs only in statuses and time
    text_server = run_cli(env, *args).stdout.splitlines()
    text_local = run_cli(local_env, *args[:-2]).stdout.splitlines()
    assert text_server[:-1] == text_local[:-1]
    assert text_server[-1].split(";")[0] == text_local[-1].split(";")[0] == "5000 rows"
    assert "source cache hit" in text_server[-1]


def test_graph_and_device_report_through_the_server(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    args = ["graph", "bfs", str(lake / "edges.parquet"), "--src", "src", "--dst", "dst"]
    source = int(pq.read_table(lake / "edges.parquet")["src"][0].as_py())
    args += ["--source", str(source), "--server", server.url, "--json"]
    cold = json.loads(run_cli(env, *args).stdout)
    warm = json.loads(run_cli(env, *args).stdout)
    assert cold["diagnostics"]["graph_cache"]["status"] == "miss"
    assert warm["diagnostics"]["graph_cache"]["status"] == "hit"
    assert warm["diagnostics"]["result_fingerprint"] == cold["diagnostics"]["result_fingerprint"]
    report = run_cli(env, "device", "report", "--server", server.url, "--json")
    assert report.returncode == 0, report.stderr
    (row,) = json.loads(report.stdout)
    assert row["graph_entries"] >= 1  # the server's caches, not an empty local one
    assert row["grant_count"] == 0
    table = run_cli(env, "device", "report", "--server", server.url)
    assert table.stdout.splitlines()[1].split()[:2] == ["DEVICE", "BACKEND"]
    tsv = run_cli(env, "device", "report", "--server", server.url, "--format", "tsv")
    assert tsv.returncode == 0, tsv.stderr
    header, line = tsv.stdout.splitlines()
    assert dict(zip(header.split("\t"), line.split("\t"), strict=True))["graph_entries"] == str(
        row["graph_entries"]
    )


# -- a plain pyarrow.flight client -------------------------------------------------------------


def test_plain_flight_client_gets_the_result_and_its_diagnostics(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, _ = served
    client = flight.connect(server.url)
    try:
        query = _scan(lake / "facts.parquet", columns=["order_id", "amount"])
        table = client.do_get(_ticket(query)).read_all()
        expected = pq.read_table(lake / "facts.parquet", columns=["order_id", "amount"])
        assert table.equals(expected)  # metadata aside
        diagnostics = json.loads(table.schema.metadata[b"nexus.diagnostics"])
        assert diagnostics["rows"] == expected.num_rows
        assert diagnostics["attempts"][0]["outcome"] == "ok"
        # this server writes no evidence: nothing recorded the fingerprint, so it is
        # left to the reader (the Python client computes it from these rows)
        assert diagnostics["result_fingerprint"] is None
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command(json.dumps(query).encode())
        )
        plan = json.loads(info.app_metadata)
        assert info.total_bytes == (lake / "facts.parquet").stat().st_size
        assert plan["source"]["objects"][0]["status"] == "hit"  # planned, not run
        actions = {a.type for a in client.list_actions()}
        assert {"health", "reports", "source-events", "shutdown"} <= actions
        (health,) = client.do_action(flight.Action("health", b""))
        assert json.loads(health.body.to_pybytes())["status"] == "ready"
        (events,) = client.do_action(flight.Action("source-events", b""))
        assert json.loads(events.body.to_pybytes())[0]["device_id"] == 0
    finally:
        client.close()


def _flight_error(client: flight.FlightClient, raw: bytes) -> flight.FlightServerError:
    with pytest.raises(flight.FlightServerError) as info:
        client.do_get(flight.Ticket(raw)).read_all()
    return info.value


def test_bad_tickets_get_the_cli_message_and_the_server_keeps_serving(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    from nexus_cache.service import as_query

    server, env = served
    client = flight.connect(server.url)
    try:
        with pytest.raises(ConfigError) as local:
            as_query("{not json")
        error = _flight_error(client, b"{not json")
        assert str(error).startswith(str(local.value))
        assert json.loads(error.extra_info)["error"] == "ConfigError"
        graph = {"type": "graph", "edges": _scan(lake / "edges.parquet"), "src": "src"}
        error = _flight_error(
            client, json.dumps({**graph, "dst": "dst", "algorithm": "sssp"}).encode()
        )
        assert "GraphQuery.algorithm='sssp' is not accepted" in str(error)
        error = _flight_error(client, json.dumps(_scan(lake / "missing.parquet")).encode())
        assert json.loads(error.extra_info)["error"] == "FileNotFoundError"
        error = _flight_error(client, b" " * (64 << 10) + b"{}")
        assert "max_ticket_bytes" in str(error)
        pinned = {"query": _scan(lake / "facts.parquet"), "device": 7}
        error = _flight_error(client, json.dumps(pinned).encode())
        assert "device=7 is not a device this service serves" in str(error)
        # the same one-line message on the command line, exit 2
        cli = run_cli(env, "scan", str(lake / "missing.parquet"), "--server", server.url)
        assert cli.returncode == 2
        assert cli.stderr.strip().splitlines() == [
            f"nexus-cache: error: source {str(lake / 'missing.parquet')!r} does not exist; "
            "check the path"
        ]
        table = client.do_get(_ticket(_scan(lake / "facts.parquet"))).read_all()
        assert table.num_rows == 5000
    finally:
        client.close()


def test_client_api_returns_the_service_result_type(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    from nexus_cache.service import QueryResult, Scan

    server, _ = served
    with Client(server.url) as client:
        result = client.execute(Scan(str(lake / "facts.parquet")))
        assert isinstance(result, QueryResult)
        assert b"nexus.diagnostics" not in (result.table.schema.metadata or {})
        assert result.table.equals(pq.read_table(lake / "facts.parquet"))
        assert result.diagnostics.attempts[0].outcome == "ok"
        health = client.health()
        assert health["status"] == "ready"
        assert health["rss_bytes"] > 0
        assert health["arrow_allocated_bytes"] >= 0
        assert client.reports()[0]["grant_count"] == 0
        with pytest.raises(FileNotFoundError, match="does not exist"):
            client.execute(Scan(str(lake / "nothing.parquet")))


def test_the_log_line_splits_a_query_into_execute_and_stream(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    """The log line says how long the query executed and how long its result
    streamed, so a slow query shows which of the two to look at."""
    from nexus_cache.service import Scan

    server, _ = served
    number = r"(\d+\.\d)"
    with Client(server.url) as client:
        small = client.execute(Scan(str(lake / "facts.parquet")))
        big = client.execute(Scan(str(lake / "big.parquet"), columns=("a",)))  # 48 MB: streamed
    assert big.table.num_rows == 6_000_000
    one = server.wait_for(
        rf"query {small.diagnostics.query_id} .* ok {number} ms \(execute {number} ms\)$"
    )
    total, execute = float(one.group(1)), float(one.group(2))
    assert small.diagnostics.timings["total_s"] * 1e3 - 0.1 <= execute <= total
    streamed = server.wait_for(
        rf"query {big.diagnostics.query_id} .* ok {number} ms "
        rf"\(execute {number} ms, stream {number} ms\)$"
    )
    total, execute, stream = (float(g) for g in streamed.groups())
    assert big.diagnostics.timings["total_s"] * 1e3 - 0.1 <= execute
    assert stream > 0
    assert abs(execute + stream - total) <= 0.15  # each figure is rounded to 0.1 ms


def test_a_warm_query_reuses_the_memory_of_the_last_one(
    served: tuple[Server, dict[str, str]], tmp_path: Path
) -> None:
    """A warm query's buffers come from memory its predecessor freed, not from
    fresh pages: the server page-faults far less per query than its result has
    pages (with every large block in a mapping of its own, each warm query
    faulted in its whole result again, and graph queries ran a third slower)."""
    from nexus_cache.service import Scan

    server, _ = served
    stat = Path(f"/proc/{server.process.pid}/stat")
    if not stat.exists():
        pytest.skip("page faults are read from /proc")

    def faults() -> int:
        return int(stat.read_text().rsplit(")", 1)[1].split()[7])  # minflt

    source = tmp_path / "mid.parquet"
    n = 1 << 20
    pq.write_table(pa.table({"a": np.arange(n, dtype=np.int64)}), source)
    _aged(source)
    query = Scan(str(source))
    per_query = []
    with Client(server.url) as client:
        for _ in range(3):  # cold, then warm in the source cache
            client.execute(query)
        for _ in range(11):
            before = faults()
            result = client.execute(query)
            per_query.append(faults() - before)
    assert result.diagnostics.source_cache["status"] == "hit"
    pages = result.table.nbytes // os.sysconf("SC_PAGE_SIZE")  # 2048
    # the fewest: a query right after a trim (every 0.5 s) faults its pages again,
    # and on a loaded machine gRPC's send buffers for a slow reader are fresh
    # pages too (about a quarter of the result's, seen on two busy cores); with
    # every large block in a mapping of its own, every query faulted them all
    assert min(per_query) < pages // 10, per_query


def test_unreachable_server_is_one_line_naming_the_url(lake: Path, tmp_path: Path) -> None:
    env = server_env(tmp_path)
    url = "grpc://127.0.0.1:9"
    cli = run_cli(env, "scan", str(lake / "facts.parquet"), "--server", url)
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert line.startswith(f"nexus-cache: error: the nexus-cache server at {url} is unavailable")
    with pytest.raises(ServerUnavailableError, match=url):
        Client(url, timeout=5).health()


def test_a_host_name_that_does_not_resolve_is_named_as_such(lake: Path, tmp_path: Path) -> None:
    """A server URL whose host name resolves to nothing says so (fix the name), never
    that a server there is running (nothing was reached) nor to start one."""
    env = server_env(tmp_path)
    url = "grpc://no-such-host.invalid:8815"  # .invalid never resolves (RFC 2606)
    cli = run_cli(env, "scan", str(lake / "facts.parquet"), "--server", url)
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    expected = f"nexus-cache: error: the host of the nexus-cache server URL {url} does not resolve"
    assert line.startswith(expected), line
    assert "--server" in line, line
    assert "is running" not in line, line
    with pytest.raises(ServerUnavailableError, match="does not resolve"):
        Client(url, timeout=30).health()


def test_a_server_url_without_a_port_is_refused_naming_the_default(
    lake: Path, tmp_path: Path
) -> None:
    """gRPC would take port 80 or 443 for a URL without one, where no nexus-cache
    server listens: the client and the CLI refuse it and name the port to give."""
    for url in ("grpc://127.0.0.1", "grpc+tls://localhost/", "grpc://[::1]"):
        with pytest.raises(ConfigError, match="names no port") as refused:
            Client(url)
        assert "8815" in str(refused.value)
    cli = run_cli(
        server_env(tmp_path), "scan", str(lake / "facts.parquet"), "--server", "grpc://127.0.0.1"
    )
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert "names no port" in line, line
    assert "8815" in line, line
    Client("grpc://[::1]:8815").close()  # an address with its port is taken


# -- concurrency, single flight, cancellation --------------------------------------------------

_SCAN_CLIENT = """
import sys
from nexus_cache.client import Client
result = Client(sys.argv[1]).execute({"type": "scan", "source": sys.argv[2]})
print(result.diagnostics.source_cache["status"], result.table.num_rows)
"""


def test_concurrent_cold_clients_decode_once(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    source = str(lake / "shared.parquet")
    clients = [run_python(env, _SCAN_CLIENT, server.url, source) for _ in range(6)]
    statuses = []
    for process in clients:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        status, rows = out.split()
        assert rows == "5000"
        statuses.append(status)
    assert statuses.count("miss-led") == 1, statuses
    assert set(statuses) <= {"miss-led", "miss-followed", "hit"}


_SLOW_READER = """
import sys, time
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
reader = client.do_get(flight.Ticket(sys.argv[2].encode()))
reader.read_chunk()
print("reading", flush=True)
time.sleep(600)
"""


def test_client_killed_mid_stream_releases_everything(
    served: tuple[Server, dict[str, str]], lake: Path
) -> None:
    server, env = served
    ticket = json.dumps(_scan(lake / "big.parquet"))
    reader = run_python(env, _SLOW_READER, server.url, ticket)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "reading"
        with Client(server.url) as client:
            assert client.health()["running_queries"] == 1  # mid-stream
            reader.kill()
            reader.wait(30)
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=30)
            (row,) = client.reports()
            assert row["grant_count"] == 0
            assert row["grant_bytes"] == 0
        server.wait_for(r"big\.parquet.* cancelled ")
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.communicate(timeout=30)


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_are_scraped_and_parsed(served: tuple[Server, dict[str, str]], lake: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    server, _ = served
    with Client(server.url) as client:
        client.execute(_scan(lake / "facts.parquet"))
    assert server.metrics_url is not None
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "nexus_gpu_cache_evictable_resident_bytes",
        "nexus_gpu_cache_pinned_in_use_bytes",
        "nexus_cache_requests",
        "nexus_admission_waits",
        "nexus_admission_refusals",
        "nexus_queries",
        "nexus_query_duration_seconds",
        "nexus_queries_running",
    ):
        assert name in families, name
    (evictable,) = families["nexus_gpu_cache_evictable_resident_bytes"].samples
    assert evictable.labels == {"device": "0"}
    assert evictable.value > 0
    hits = [
        s
        for s in families["nexus_cache_requests"].samples
        if s.name.endswith("_total") and s.labels == {"cache": "source", "status": "hit"}
    ]
    assert hits[0].value >= 1
    count = [
        s
        for s in families["nexus_query_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["type"] == "scan"
    ]
    assert count[0].value >= 1


# -- security ----------------------------------------------------------------------------------


def test_token_is_enforced_and_refused_calls_leave_no_trace(lake: Path, tmp_path: Path) -> None:
    toml = tmp_path / "nexus.toml"
    toml.write_text(f"[server]\nallowed_roots = [{json.dumps(str(lake))}]\n")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    env = server_env(tmp_path)
    server = start_server(env, "--token-file", str(token_file), "--config", str(toml))
    try:
        plain = flight.connect(server.url)
        query = _ticket(_scan(lake / "token.parquet"))
        with pytest.raises(flight.FlightUnauthenticatedError):
            plain.do_get(query).read_all()
        wrong = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])
        with pytest.raises(flight.FlightUnauthenticatedError):
            plain.do_get(query, wrong).read_all()
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(plain.do_action(flight.Action("reports", b""), wrong))
        plain.close()
        with pytest.raises(ServerAuthError):
            Client(server.url, token="nope").health()
        cli = run_cli(
            {**env, "NEXUS_SERVER_TOKEN": "nope"},
            "scan",
            str(lake / "token.parquet"),
            "--server",
            server.url,
        )
        assert cli.returncode == 2
        assert "refused the call" in cli.stderr
        with Client(server.url, token="s3cret") as client:
            (row,) = client.reports()
            assert row["source_entries"] == 0  # no refused call reached a cache
            assert not (tmp_path / "cache").exists() or not any(
                p.name.endswith(".parquet") for p in (tmp_path / "cache").rglob("*")
            )
            outside = tmp_path / "outside.parquet"
            write_parquet(fact_table(10), outside)
            with pytest.raises(ConfigError, match="outside this server's allowed_roots"):
                client.execute(_scan(outside))
            assert client.execute(_scan(lake / "token.parquet")).table.num_rows == 5000
            assert client.shutdown() == {"status": "stopping"}
        assert server.process.wait(60) == 0
        server.wait_for(r"caches drained")
    finally:
        close_all([server])


def test_non_loopback_bind_without_token_refuses_to_start(tmp_path: Path) -> None:
    cli = run_cli(server_env(tmp_path), "serve", "--host", "0.0.0.0", "--port", "0")
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert "not a loopback address and no token is set" in line
    assert "--allow-unauthenticated" in line


def test_tls_serves_grpc_tls(tmp_path: Path, lake: Path) -> None:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        capture_output=True,
        check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr[-200:]!r}")
    server = start_server(server_env(tmp_path), "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert server.url.startswith("grpc+tls://127.0.0.1:")
        with Client(server.url, tls_root_certs=cert.read_bytes()) as client:
            assert client.health()["status"] == "ready"
            assert client.execute(_scan(lake / "facts.parquet")).table.num_rows == 5000
        assert server.stop() == 0
    finally:
        close_all([server])


# -- stopping and restarting -------------------------------------------------------------------


def test_sigkill_keeps_lakehouse_entries_and_sigterm_exits_0(lake: Path, tmp_path: Path) -> None:
    env = server_env(tmp_path)
    source = _scan(lake / "restart.parquet")
    servers = [start_server(env)]
    first = servers[0]
    try:
        with Client(first.url) as client:
            cold = client.execute(source).diagnostics
        assert cold.lakehouse["status"] == "miss"
        first.stop(signal.SIGKILL)
        second = start_server(env)
        servers.append(second)
        with Client(second.url) as client:
            again = client.execute(source).diagnostics
        assert again.lakehouse["status"] == "hit"  # the entry outlived the process
        assert again.source_cache["status"] == "miss-led"  # the GPU caches did not
        assert second.stop(signal.SIGTERM) == 0
        log = second.log()
        assert "stopping: refusing new queries" in log
        assert "graph cache, then source cache drained, domain owner released" in log
    finally:
        close_all(servers)


def test_a_taken_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = run_cli(server_env(tmp_path), "serve", "--port", str(port))
    assert cli.returncode == 2
    assert f"nexus-cache: error: cannot listen on grpc://127.0.0.1:{port}" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_the_fingerprint_travels_where_evidence_records_it_and_is_computed_where_not(
    served: tuple[Server, dict[str, str]], lake: Path, tmp_path: Path
) -> None:
    """Without evidence the server sends no fingerprint and the client computes it
    from the rows it received; a server writing evidence sends the one it sealed."""
    from nexus_cache.service import Scan, table_fingerprint

    query = Scan(str(lake / "facts.parquet"), columns=("order_id", "amount"))
    server, _ = served
    with Client(server.url) as client:
        result = client.execute(query)
    assert result.diagnostics.result_fingerprint == table_fingerprint(result.table)
    evidence = tmp_path / "evidence"
    recording = start_server(server_env(tmp_path, NEXUS_SERVICE_EVIDENCE_DIR=str(evidence)))
    try:
        plain = flight.connect(recording.url)
        try:
            table = plain.do_get(_ticket(query.to_dict())).read_all()
        finally:
            plain.close()
    finally:
        close_all([recording])
    sent = json.loads(table.schema.metadata[b"nexus.diagnostics"])["result_fingerprint"]
    (doc,) = [json.loads(p.read_text()) for p in evidence.glob("attempt-*.json")]
    assert sent == doc["result"]["fingerprint"] == table_fingerprint(result.table)
