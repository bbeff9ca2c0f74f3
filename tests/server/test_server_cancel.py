"""A client that goes away while its query still executes cancels it: a real
server process on loopback, clients killed with SIGKILL or out of time."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

from nexus_cache.client import Client
from nexus_cache.service.datagen import fact_table, ring_edges, write_parquet

from ._helpers import (
    Server,
    admission_decisions,
    close_all,
    run_python,
    server_env,
    start_server,
    wait_until,
)

# A PageRank that runs for hours (alpha near 1 on a ring: see ring_edges).
_SLOW = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}
# Grants of at least 1 GiB on the 2 GiB simulated device (1.8 GiB managed):
# while one query holds its grant, the next one waits for admission.
_CONFIG = 'min_grant_bytes = "1GiB"\nadmission_timeout_s = 300\n'

_CLIENT = """
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
print("asking", flush=True)
table = client.do_get(flight.Ticket(sys.argv[2].encode())).read_all()
print("done", table.num_rows, flush=True)
"""


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    root.mkdir()
    write_parquet(ring_edges(100_000), root / "ring.parquet", row_groups=2)
    write_parquet(fact_table(5000), root / "facts.parquet", row_groups=2)
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    for path in root.iterdir():
        os.utime(path, (past, past))
    return root


def _serve(tmp_path: Path, **extra: str) -> tuple[Server, dict[str, str]]:
    config = tmp_path / "service.toml"
    config.write_text(_CONFIG)
    env = server_env(
        tmp_path,
        NEXUS_SERVICE_CONFIG=str(config),
        NEXUS_SERVICE_EVIDENCE_DIR=str(tmp_path / "evidence"),
        **extra,
    )
    return start_server(env), env


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    server, env = _serve(tmp_path)
    try:
        yield server, env
    finally:
        close_all([server])


def _slow_pagerank(lake: Path) -> str:
    edges = {"type": "scan", "source": str(lake / "ring.parquet")}
    query = {"type": "graph", "edges": edges, "src": "src", "dst": "dst"}
    return json.dumps({**query, "algorithm": "pagerank", "params": _SLOW})


def _facts(lake: Path) -> str:
    return json.dumps({"type": "scan", "source": str(lake / "facts.parquet")})


def _grants(client: Client) -> int:
    (report,) = client.reports()
    return int(report["grant_count"])


def test_killed_clients_cancel_their_queries_waiting_and_running(
    served: tuple[Server, dict[str, str]], lake: Path, tmp_path: Path
) -> None:
    server, env = served
    evidence = tmp_path / "evidence"
    running = run_python(env, _CLIENT, server.url, _slow_pagerank(lake))
    waiting = None
    try:
        assert running.stdout is not None
        assert running.stdout.readline().strip() == "asking"
        assert wait_until(lambda: admission_decisions(evidence) == ["admitted"], timeout=60)
        waiting = run_python(env, _CLIENT, server.url, _facts(lake))
        with Client(server.url) as client:
            assert wait_until(lambda: client.health()["running_queries"] == 2)
            time.sleep(0.5)  # the scan is queued behind the PageRank's grant
            assert admission_decisions(evidence) == ["admitted"]
            assert _grants(client) == 1

            waiting.kill()  # a client gone while its query waits for admission
            waiting.wait(30)
            both = ["admitted", "cancelled"]
            assert wait_until(lambda: admission_decisions(evidence) == both, 60)
            assert _grants(client) == 1  # the PageRank runs on

            killed = time.monotonic()
            running.kill()  # a client gone while its PageRank iterates
            running.wait(30)
            # the PageRank would run for hours: a bound far under that (and
            # generous for a loaded host) shows the client's death cancelled it
            assert wait_until(lambda: _grants(client) == 0, timeout=60)
            assert time.monotonic() - killed < 60
            assert admission_decisions(evidence) == ["admitted", "cancelled", "cancelled"]
            assert wait_until(lambda: client.health()["running_queries"] == 0, timeout=60)
            (report,) = client.reports()
            assert report["grant_bytes"] == 0
            # and the server keeps serving
            assert client.execute(json.loads(_facts(lake))).table.num_rows == 5000
        server.wait_for(r"ring\.parquet.* cancelled ")
        server.wait_for(r"facts\.parquet.* cancelled ")
        outcomes = sorted(
            json.loads(p.read_text())["outcome"] for p in evidence.glob("attempt-*.json")
        )
        assert outcomes == ["cancelled", "cancelled", "ok"]
    finally:
        for process in (running, waiting):
            if process is not None:
                if process.poll() is None:
                    process.kill()
                process.communicate(timeout=30)


def test_a_client_out_of_time_cancels_its_query(
    served: tuple[Server, dict[str, str]], lake: Path, tmp_path: Path
) -> None:
    server, _env = served
    client = flight.connect(server.url)
    options = flight.FlightCallOptions(timeout=1.0)
    started = time.monotonic()
    with pytest.raises(flight.FlightTimedOutError):
        client.do_get(flight.Ticket(_slow_pagerank(lake).encode()), options).read_all()
    with Client(server.url) as ours:
        # the PageRank would run for hours: far under that, its 1 s deadline cancelled it
        assert wait_until(lambda: _grants(ours) == 0, timeout=60)
        assert time.monotonic() - started < 60
        assert wait_until(lambda: ours.health()["running_queries"] == 0, timeout=60)
    assert admission_decisions(tmp_path / "evidence") == ["admitted", "cancelled"]
    client.close()


def test_shutdown_cancels_a_query_still_running_after_its_wait(tmp_path: Path, lake: Path) -> None:
    server, env = _serve(tmp_path, NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="1")
    running = run_python(env, _CLIENT, server.url, _slow_pagerank(lake))
    try:
        assert running.stdout is not None
        assert running.stdout.readline().strip() == "asking"
        evidence = tmp_path / "evidence"
        assert wait_until(lambda: admission_decisions(evidence) == ["admitted"], timeout=60)
        stopping = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=60) == 0
        # the 1 s wait, then the cancel; never the PageRank's hours
        assert time.monotonic() - stopping < 45
        server.wait_for(r"1 queries still running .* cancelling them")
        assert admission_decisions(evidence) == ["admitted", "cancelled"]
        assert "still running; stopping anyway" not in server.log()
        # nothing of the query stayed pinned: the caches drained whole
        assert "domain owner released" in server.log()
        _out, err = running.communicate(timeout=30)
        assert running.returncode != 0  # its query was cancelled, not answered
        # told why (the server stops), as Flight's cancelled error (gRPC CANCELLED)
        assert "FlightCancelledError" in err
        assert "was cancelled because the nexus-cache server is shutting down" in err
        assert "went away" not in err
        # and the log names the query
        line = server.wait_for(r"query (\S+) \{.*ring\.parquet.* cancelled .*shutting down")
        assert re.fullmatch(r"[0-9a-f]{16}", line.group(1))
        assert line.group(1) in err
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate(timeout=30)
        close_all([server])


def test_a_second_sigterm_cancels_running_queries_at_once_and_still_drains(
    tmp_path: Path, lake: Path
) -> None:
    server, env = _serve(tmp_path, NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="120")
    running = run_python(env, _CLIENT, server.url, _slow_pagerank(lake))
    try:
        assert running.stdout is not None
        assert running.stdout.readline().strip() == "asking"
        evidence = tmp_path / "evidence"
        assert wait_until(lambda: admission_decisions(evidence) == ["admitted"], timeout=60)
        stopping = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.wait_for(r"stopping: refusing new queries")
        time.sleep(0.5)
        assert server.process.poll() is None  # the first signal waits for the query
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0
        # not the 120 s shutdown_timeout_s: the second signal cut the wait short
        assert time.monotonic() - stopping < 90
        server.wait_for(r"1 queries still running at a second signal; cancelling them")
        assert admission_decisions(evidence) == ["admitted", "cancelled"]
        assert "domain owner released" in server.log()  # the caches still drained
        _out, err = running.communicate(timeout=30)
        assert running.returncode != 0
        assert "was cancelled" in err
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate(timeout=30)
        close_all([server])


def test_list_flights_shows_the_queries_running(
    served: tuple[Server, dict[str, str]], lake: Path, tmp_path: Path
) -> None:
    server, env = served
    ticket = _slow_pagerank(lake)
    running = run_python(env, _CLIENT, server.url, ticket)
    client = flight.connect(server.url)
    try:
        assert running.stdout is not None
        assert running.stdout.readline().strip() == "asking"
        evidence = tmp_path / "evidence"
        assert wait_until(lambda: admission_decisions(evidence) == ["admitted"], timeout=60)
        (info,) = client.list_flights()
        assert info.descriptor.command == ticket.encode()
        assert info.endpoints[0].ticket.ticket == ticket.encode()
        facts = json.loads(info.app_metadata)
        assert facts["state"] == "executing"
        assert facts["seconds"] > 0
        running.kill()
        running.communicate(timeout=30)
        server.wait_for(rf"query {facts['query_id']} .*ring\.parquet.* cancelled ")
        assert wait_until(lambda: list(client.list_flights()) == [], timeout=10)
    finally:
        client.close()
        if running.poll() is None:
            running.kill()
            running.communicate(timeout=30)
