"""Cancellation attacked from outside: clients killed at random moments, a shutdown
that cancels a result half streamed, a server stopped with queries waiting and
running. Real server processes on loopback (host backend)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import networkx as nx
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

from nexus_cache.client import Client
from nexus_cache.service import GraphQuery, Scan, verify_evidence
from nexus_cache.service.datagen import fact_table, ring_edges, rmat_edges, write_parquet

from ._helpers import (
    admission_decisions,
    close_all,
    end_processes,
    run_python,
    server_env,
    start_server,
    wait_until,
)

# A PageRank that runs for hours (alpha near 1 on a ring).
_SLOW = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}

# Reads the first batch of its result, waits for a line on stdin, then reads the
# rest: prints the rows it got, or the error that ended the stream.
_SLOW_READER = """
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
reader = client.do_get(flight.Ticket(sys.argv[2].encode()))
rows = reader.read_chunk().data.num_rows
print("first", rows, flush=True)
sys.stdin.readline()
try:
    while True:
        rows += reader.read_chunk().data.num_rows
except StopIteration:
    print("complete", rows, flush=True)
except flight.FlightError as exc:
    print("error", " ".join(str(exc).split())[:300], flush=True)
"""


def _old(path: Path) -> None:
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    os.utime(path, (past, past))


def _long_result(tmp_path: Path) -> tuple[Path, int]:
    """A ring whose scan is 64 MB of result (several streamed batches), and its rows."""
    lake = tmp_path / "lake"
    lake.mkdir()
    rows = 4_000_000
    write_parquet(ring_edges(rows - 1), lake / "ring.parquet", row_groups=4)
    _old(lake / "ring.parquet")
    return lake, rows


def test_a_result_cut_short_by_shutdown_ends_in_an_error_not_a_short_table(
    tmp_path: Path,
) -> None:
    lake, rows = _long_result(tmp_path)
    env = server_env(
        tmp_path,
        NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="1",
        NEXUS_SERVICE_EVIDENCE_DIR=str(tmp_path / "evidence"),
    )
    server = start_server(env)
    ticket = json.dumps(Scan(str(lake / "ring.parquet")).to_dict())
    reader = subprocess.Popen(
        [sys.executable, "-c", _SLOW_READER, server.url, ticket],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        assert reader.stdin is not None
        first = reader.stdout.readline().split() or ["nothing"]
        assert first[0] == "first", reader.communicate(timeout=30)
        assert 0 < int(first[1]) < rows
        # the client stalls mid-stream; the server is told to stop and, after
        # its 1 s wait, cancels the query still streaming (unless gRPC's
        # buffers took the whole rest of the stream first: then it finished)
        server.process.send_signal(signal.SIGTERM)
        server.wait_for(r"1 queries still running .* cancelling them|caches drained")
        reader.stdin.write("go\n")
        reader.stdin.flush()
        out, _err = reader.communicate(timeout=60)
        assert server.process.wait(60) == 0
        # the whole result, or an error: never a shorter table that looks whole
        kind, detail = out.split(maxsplit=1)
        assert kind == "error" or int(detail) == rows, out
        if kind == "error":
            assert "cut short" in detail
    finally:
        end_processes([reader])
        close_all([server])


def test_a_result_cut_short_by_the_cancel_action_says_who_cancelled_it(tmp_path: Path) -> None:
    lake, rows = _long_result(tmp_path)
    server = start_server(server_env(tmp_path))
    client = flight.connect(server.url)
    try:
        named = flight.FlightCallOptions(headers=[(b"x-nexus-query-id", b"long-scan")])
        ticket = flight.Ticket(json.dumps(Scan(str(lake / "ring.parquet")).to_dict()).encode())
        reader = client.do_get(ticket, named)
        got = reader.read_chunk().data.num_rows
        assert 0 < got < rows
        # the client still reads; another cancels its query by id mid-stream
        (answer,) = client.do_action(flight.Action("cancel", b"long-scan"))
        assert json.loads(answer.body.to_pybytes()) == {
            "query_id": "long-scan",
            "found": True,
            "state": "streaming",
        }
        message = None
        try:
            while True:
                got += reader.read_chunk().data.num_rows
        except StopIteration:
            pass
        except flight.FlightCancelledError as exc:
            message = str(exc)
        # the whole result (gRPC's buffers took the rest first), or an error naming
        # the cancel: never a shorter table, and never "the server is stopping"
        assert message is not None or got == rows
        if message is not None:
            assert "query long-scan was cancelled on the server" in message
            assert "cut short" in message
            assert "stopping" not in message
        server.wait_for(r"query long-scan: cancel requested by a client \(streaming\)")
        server.wait_for(r"query long-scan .* (cancelled|ok) ")
    finally:
        client.close()
        close_all([server])


_CALLER = """
import sys, time
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
print("asking", flush=True)
while True:
    client.do_get(flight.Ticket(sys.argv[2].encode())).read_all()
"""


def _pagerank_of(table: pa.Table) -> dict[int, float]:
    return dict(zip(table["vertex"].to_pylist(), table["pagerank"].to_pylist(), strict=True))


def test_clients_gone_at_random_moments_leave_nothing_held_and_the_others_right(
    tmp_path: Path,
) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    ring, rmat, facts_path = root / "ring.parquet", root / "rmat.parquet", root / "facts.parquet"
    write_parquet(ring_edges(200_000), ring, row_groups=4)
    write_parquet(rmat_edges(8), rmat, row_groups=4)
    write_parquet(fact_table(4000), facts_path, row_groups=4)
    for path in (ring, rmat, facts_path):
        _old(path)
    config = tmp_path / "service.toml"
    # grants large enough that a few queries at once queue for admission
    config.write_text('min_grant_bytes = "400MiB"\nadmission_timeout_s = 300\n')
    evidence = tmp_path / "evidence"
    env = server_env(
        tmp_path, NEXUS_SERVICE_CONFIG=str(config), NEXUS_SERVICE_EVIDENCE_DIR=str(evidence)
    )
    server = start_server(env)
    edges = pq.read_table(rmat)
    pairs = list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    source = pairs[0][0]
    expected_rank = nx.pagerank(nx.MultiDiGraph(pairs), tol=1e-12)
    expected_hops = nx.single_source_shortest_path_length(nx.DiGraph(pairs), source)
    facts = pq.read_table(facts_path)
    queries = [
        Scan(str(facts_path)),
        Scan(str(ring)),
        GraphQuery(Scan(str(rmat)), "src", "dst", "pagerank"),
        GraphQuery(Scan(str(rmat)), "src", "dst", "bfs", params={"source": source}),
        GraphQuery(Scan(str(ring)), "src", "dst", "pagerank", params=_SLOW),
    ]
    problems: list[str] = []
    answered = [0]
    stop = threading.Event()

    def check(query: Any, table: pa.Table) -> None:
        if query is queries[0] and not table.equals(facts):
            problems.append("facts scan differs from pyarrow")
        elif query is queries[1] and table.num_rows != 200_001:
            problems.append(f"ring scan has {table.num_rows} rows")
        elif query is queries[2]:
            got = _pagerank_of(table)
            if (
                got.keys() != expected_rank.keys()
                or max(abs(got[v] - expected_rank[v]) for v in expected_rank) > 1e-6
            ):
                problems.append("pagerank differs from NetworkX")
        elif query is queries[3]:
            hops = {
                v: d
                for v, d in zip(
                    table["vertex"].to_pylist(), table["distance"].to_pylist(), strict=True
                )
                if d is not None and d >= 0
            }
            if hops != expected_hops:
                problems.append("bfs differs from NetworkX")

    def survivor() -> None:
        with Client(server.url) as client:
            while not stop.is_set():
                for query in queries[:4]:
                    try:
                        check(query, client.execute(query).table)
                        answered[0] += 1
                    except Exception as exc:  # every failure is reported
                        problems.append(f"surviving {query.kind}: {exc!r}")

    survivors = [threading.Thread(target=survivor) for _ in range(2)]
    rng = random.Random(7)
    callers: list[subprocess.Popen[str]] = []
    try:
        for thread in survivors:
            thread.start()
        flight_client = flight.connect(server.url)
        for i in range(50):
            query = queries[rng.randrange(len(queries))]
            ticket = flight.Ticket(json.dumps(query.to_dict()).encode())
            if i % 10 == 0:
                # a client process killed at a random moment
                caller = run_python(env, _CALLER, server.url, ticket.ticket.decode())
                callers.append(caller)
                assert caller.stdout is not None
                assert caller.stdout.readline().strip() == "asking"
                time.sleep(rng.uniform(0.0, 0.5))
                caller.kill()
                caller.communicate(timeout=30)
                continue
            # a call whose client gives up at a random moment
            options = flight.FlightCallOptions(timeout=rng.uniform(0.005, 0.4))
            with contextlib.suppress(flight.FlightError):
                flight_client.do_get(ticket, options).read_all()
        stop.set()
        for thread in survivors:
            thread.join(120)
        assert problems == []
        assert answered[0] >= 8
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=30)
            (report,) = client.reports()
            held = {
                name: report[name]
                for name in (
                    "grant_count",
                    "grant_bytes",
                    "cache_pinned_in_use_bytes",
                    "cache_reserved_bytes",
                    "graph_in_flight",
                    "source_in_flight",
                )
            }
            assert held == dict.fromkeys(held, 0)
            # and it goes on answering right
            check(queries[2], client.execute(queries[2]).table)
            assert problems == []
        assert server.stop(signal.SIGTERM, timeout=60) == 0
        assert "domain owner released" in server.log()
        report_ = verify_evidence(evidence)
        assert report_.ok, report_.problems
        header, *rows = (evidence / "admission.tsv").read_text().splitlines()
        width = len(header.split("\t"))
        assert all(len(row.split("\t")) == width for row in rows)
        decisions = {row.split("\t")[header.split("\t").index("decision")] for row in rows}
        assert decisions <= {"admitted", "admitted_after_wait", "cancelled"}
        assert "cancelled" in decisions
    finally:
        stop.set()
        end_processes(callers)
        close_all([server])


_ONE_CALL = """
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
print("asking", flush=True)
try:
    table = client.do_get(flight.Ticket(sys.argv[2].encode())).read_all()
    print("rows", table.num_rows, flush=True)
except flight.FlightError as exc:
    print("error", " ".join(str(exc).split())[:300], flush=True)
"""


def test_sigterm_with_queries_waiting_for_a_slot_for_admission_and_running(
    tmp_path: Path,
) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    ring, facts = root / "ring.parquet", root / "facts.parquet"
    write_parquet(ring_edges(100_000), ring, row_groups=2)
    write_parquet(fact_table(5000), facts, row_groups=2)
    for path in (ring, facts):
        _old(path)
    config = tmp_path / "service.toml"
    # one 1 GiB grant at a time on the 2 GiB simulated device
    config.write_text('min_grant_bytes = "1GiB"\nadmission_timeout_s = 300\n')
    evidence = tmp_path / "evidence"
    env = server_env(
        tmp_path,
        NEXUS_SERVICE_CONFIG=str(config),
        NEXUS_SERVICE_EVIDENCE_DIR=str(evidence),
        NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="1",
        NEXUS_SERVER_MAX_RUNNING_QUERIES="2",
        NEXUS_SERVER_QUEUE_TIMEOUT_S="300",
    )
    server = start_server(env)
    slow = GraphQuery(Scan(str(ring)), "src", "dst", "pagerank", params=_SLOW)
    tickets = [json.dumps(slow.to_dict())] + [json.dumps(Scan(str(facts)).to_dict())] * 2
    clients: list[subprocess.Popen[str]] = []
    try:
        with Client(server.url) as client:
            for ticket in tickets:
                caller = run_python(env, _ONE_CALL, server.url, ticket)
                clients.append(caller)
                assert caller.stdout is not None
                assert caller.stdout.readline().strip() == "asking"
                count = len(clients)
                assert wait_until(lambda n=count: client.health()["running_queries"] == n, 60)
                if count == 1:  # the PageRank holds its grant before the scans come
                    assert wait_until(lambda: admission_decisions(evidence) == ["admitted"], 60)
            time.sleep(0.3)
            # running, waiting for admission, waiting for a running-query slot
            assert admission_decisions(evidence) == ["admitted"]
        stopping = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=60) == 0
        # the queries would run for hours: far under that is the 1 s wait, then
        # their cancel (a generous bound: the host may be loaded)
        assert time.monotonic() - stopping < 45
        server.wait_for(r"3 queries still running .* cancelling them")
        assert "stopping anyway" not in server.log()
        assert "domain owner released" in server.log()
        outs = [c.communicate(timeout=30)[0].split(maxsplit=1) for c in clients]
        # each got an error, none a result
        assert [o[0] for o in outs] == ["error"] * 3, outs
        assert all("cancel" in o[1] for o in outs), outs
        assert sorted(admission_decisions(evidence)) == ["admitted", "cancelled", "cancelled"]
        report = verify_evidence(evidence)
        assert report.ok, report.problems
    finally:
        end_processes(clients)
        close_all([server])
