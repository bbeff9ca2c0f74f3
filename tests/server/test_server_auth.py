"""Token authentication as Flight clients meet it: a real server process with a
token on loopback, plain ``pyarrow.flight`` clients, the refusal log and metric."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import ServerAuthError
from nexus_cache.service.datagen import fact_table, write_parquet

from ._helpers import Server, close_all, server_env, start_server

_TOKEN = "s3cret-Tok3n"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(fact_table(500), root / "facts.parquet", row_groups=2)
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    os.utime(root / "facts.parquet", (past, past))
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
