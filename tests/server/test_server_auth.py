"""Token authentication as Flight clients meet it: a real server process with a
token on loopback, plain ``pyarrow.flight`` clients, the refusal log and metric;
and the ``cancel`` action behind that token, naming a query by the id its call
carried."""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import ServerAuthError
from nexus_cache.service.datagen import fact_table, ring_edges, write_parquet

from ._helpers import Server, close_all, run_cli, server_env, start_server, wait_until

_TOKEN = "s3cret-Tok3n"
# A PageRank that runs for hours (alpha near 1 on a ring: see ring_edges).
_SLOW = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(fact_table(500), root / "facts.parquet", row_groups=2)
    write_parquet(ring_edges(100_000), root / "ring.parquet", row_groups=2)
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    for path in root.iterdir():
        os.utime(path, (past, past))
    return root


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("guarded")
    token_file = root / "token"
    token_file.write_text(_TOKEN + "\n")
    server = start_server(server_env(root), "--token-file", str(token_file), "--metrics-port", "0")
    try:
        yield server
    finally:
        close_all([server])


def _ticket(lake: Path) -> flight.Ticket:
    return flight.Ticket(
        json.dumps({"type": "scan", "source": str(lake / "facts.parquet")}).encode()
    )


def _with(header: bytes) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(headers=[(b"authorization", header)])


def _refused(server: Server) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    assert server.metrics_url is not None
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    (family,) = (
        f for f in text_string_to_metric_families(text) if f.name == "nexus_server_auth_refused"
    )
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_missing_malformed_and_wrong_tokens_are_told_apart_logged_and_counted(
    guarded: Server, lake: Path
) -> None:
    before = _refused(guarded)
    assert set(before) == {"missing", "malformed", "wrong"}
    client = flight.connect(guarded.url)
    try:
        with pytest.raises(flight.FlightUnauthenticatedError) as missing:
            client.do_get(_ticket(lake)).read_all()
        assert "carried none" in str(missing.value)
        with pytest.raises(flight.FlightUnauthenticatedError) as wrong:
            client.do_get(_ticket(lake), _with(b"Bearer nope")).read_all()
        assert "is not this nexus-cache server's token" in str(wrong.value)
        assert "carried none" not in str(wrong.value)
        with pytest.raises(flight.FlightUnauthenticatedError) as malformed:
            list(client.do_action(flight.Action("health", b""), _with(_TOKEN.encode())))
        assert "is not 'Bearer <token>'" in str(malformed.value)
        # the JSON extra_info the nexus-cache client reads
        assert json.loads(wrong.value.extra_info)["error"] == "ServerAuthError"
    finally:
        client.close()
    with pytest.raises(ServerAuthError, match="is not this nexus-cache server's token"):
        Client(guarded.url, token="nope").health()
    after = _refused(guarded)
    assert after["missing"] - before["missing"] == 1
    assert after["wrong"] - before["wrong"] == 2
    assert after["malformed"] - before["malformed"] == 1
    guarded.wait_for(r"refused a do_get call: no authorization header")
    guarded.wait_for(r"refused a do_get call: wrong token")
    guarded.wait_for(r"refused a do_action call: malformed authorization header")
    assert "nope" not in guarded.log()  # the token sent is never logged
    assert _TOKEN not in guarded.log()


def test_bearer_in_any_case_and_the_basic_handshake_of_a_plain_flight_client(
    guarded: Server, lake: Path
) -> None:
    client = flight.connect(guarded.url)
    try:
        for scheme in (b"Bearer", b"bearer", b"BEARER", b"bEaReR"):
            table = client.do_get(_ticket(lake), _with(scheme + b" " + _TOKEN.encode())).read_all()
            assert table.num_rows == 500
        # Dremio-style: the handshake with any user name and the token as password
        # answers the bearer header the client then sends
        name, value = client.authenticate_basic_token("anyone", _TOKEN)
        assert name.lower() == b"authorization"
        assert value.lower().startswith(b"bearer ")
        options = flight.FlightCallOptions(headers=[(name, value)])
        assert client.do_get(_ticket(lake), options).read_all().num_rows == 500
        (health,) = client.do_action(flight.Action("health", b""), options)
        assert json.loads(health.body.to_pybytes())["status"] == "ready"
        with pytest.raises(flight.FlightUnauthenticatedError, match="is not this nexus"):
            client.authenticate_basic_token("anyone", "nope")
        basic = base64.b64encode(f"someone:{_TOKEN}".encode())
        assert client.do_get(_ticket(lake), _with(b"Basic " + basic)).read_all().num_rows == 500
    finally:
        client.close()
    with Client(guarded.url, token=_TOKEN) as ours:
        assert ours.health()["status"] == "ready"


# -- the cancel action --------------------------------------------------------------------------


def _named(query_id: str) -> flight.FlightCallOptions:
    """The token, and ``query_id`` in the call's query id header."""
    return flight.FlightCallOptions(
        headers=[
            (b"authorization", f"Bearer {_TOKEN}".encode()),
            (b"x-nexus-query-id", query_id.encode()),
        ]
    )


def _query_id(table: pa.Table) -> str:
    """The query id in a result's diagnostics."""
    return str(json.loads(table.schema.metadata[b"nexus.diagnostics"])["query_id"])


def _cancel(client: flight.FlightClient, body: bytes, token: str = _TOKEN) -> dict[str, object]:
    action = flight.Action("cancel", body)
    (result,) = client.do_action(action, _with(f"Bearer {token}".encode()))
    return dict(json.loads(result.body.to_pybytes()))


def test_a_call_names_its_query_and_the_cancel_action_behind_the_token_cancels_it(
    guarded: Server, lake: Path
) -> None:
    ring = {"type": "scan", "source": str(lake / "ring.parquet")}
    pagerank = {"type": "graph", "edges": ring, "src": "src", "dst": "dst"}
    ticket = flight.Ticket(
        json.dumps({**pagerank, "algorithm": "pagerank", "params": _SLOW}).encode()
    )
    client = flight.connect(guarded.url)
    ended: list[BaseException] = []

    def slow() -> None:
        try:
            client.do_get(ticket, _named("slow-pagerank_1")).read_all()
        except BaseException as exc:  # the test reads it
            ended.append(exc)

    def states() -> dict[str, str]:
        listed = client.list_flights(options=_with(f"Bearer {_TOKEN}".encode()))
        facts = [json.loads(info.app_metadata) for info in listed]
        return {f["query_id"]: f["state"] for f in facts}

    thread = threading.Thread(target=slow, daemon=True)
    thread.start()
    ours = Client(guarded.url, token=_TOKEN)
    try:
        # the server runs the PageRank under the id its call carried, holding its grant
        assert wait_until(lambda: states().get("slow-pagerank_1") == "executing", 60)
        assert wait_until(lambda: ours.reports()[0]["grant_count"] == 1, 60)
        assert "cancel" in [
            a.type for a in client.list_actions(_with(f"Bearer {_TOKEN}".encode()))
        ]

        # an id already running, or not an id, is not taken: the server names the query
        for sent in ("slow-pagerank_1", "bad id!", "a" * 65):
            named = _query_id(client.do_get(_ticket(lake), _named(sent)).read_all())
            assert re.fullmatch(r"[0-9a-f]{16}", named), (sent, named)
        guarded.wait_for(r"query id slow-pagerank_1 is already running")
        guarded.wait_for(r"ignored the call's x-nexus-query-id header 'bad id!'")
        assert _query_id(client.do_get(_ticket(lake), _named("my-scan")).read_all()) == "my-scan"

        # a wrong token cancels nothing: refused before the action runs
        with pytest.raises(flight.FlightUnauthenticatedError, match="is not this nexus"):
            _cancel(client, b"slow-pagerank_1", token="not-the-token")
        assert "slow-pagerank_1: cancel requested" not in guarded.log()
        assert states().get("slow-pagerank_1") == "executing"

        # an id no query runs under, and a body that is no id
        assert _cancel(client, b"no-such-query") == {"query_id": "no-such-query", "found": False}
        with pytest.raises(flight.FlightServerError, match="is not a query id"):
            _cancel(client, b"bad id!")

        # the token and the id cancel it: its call ends cancelled, its grant is released
        answer = _cancel(client, b"slow-pagerank_1")
        assert answer == {"query_id": "slow-pagerank_1", "found": True, "state": "executing"}
        thread.join(30)
        assert not thread.is_alive()
        (error,) = ended
        assert isinstance(error, flight.FlightCancelledError), error
        assert "query slow-pagerank_1 was cancelled" in str(error)
        guarded.wait_for(r"query slow-pagerank_1 .* cancelled ", timeout=10)
        assert wait_until(lambda: ours.reports()[0]["grant_count"] == 0, 30)
        assert _cancel(client, b"slow-pagerank_1")["found"] is False
    finally:
        ours.close()
        client.close()
        thread.join(30)


def test_a_token_no_header_can_carry_is_refused_where_it_is_given(
    guarded: Server, lake: Path, tmp_path: Path
) -> None:
    """A token with an accent or a line break could never be sent (gRPC headers are
    printable ASCII): the server refuses to start with it, naming where it came
    from, and a client refuses to send it, naming the token, instead of failing
    every call with gRPC's 'Invalid metadata' blamed on the server."""
    env = server_env(tmp_path)
    for text in ("pässwörd", "line-one\nline-two"):
        token_file = tmp_path / "token"
        token_file.write_text(text + "\n")
        started = time.monotonic()
        serve = run_cli(env, "serve", "--port", "0", "--token-file", str(token_file), timeout=60)
        assert serve.returncode == 2, serve.stderr
        (line,) = serve.stderr.strip().splitlines()
        assert "--token-file" in line, line
        assert "printable ASCII" in line, line
        assert "warm-up" not in serve.stderr
        assert time.monotonic() - started < 30
        # the same token given to a client, against a running server
        cli = run_cli(
            {**env, "NEXUS_SERVER_TOKEN": text},
            "scan",
            str(lake / "facts.parquet"),
            "--server",
            guarded.url,
        )
        assert cli.returncode == 2, cli.stderr
        (line,) = cli.stderr.strip().splitlines()
        assert "NEXUS_SERVER_TOKEN" in line, line
        assert "printable ASCII" in line, line
    # the server's own token still works
    with Client(guarded.url, token=_TOKEN) as client:
        assert client.health()["status"] == "ready"
