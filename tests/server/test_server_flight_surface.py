"""What a generic Flight client meets: ``get_schema`` and ``FlightInfo.schema``
equal to the result's, path descriptors refused with a message, Flight error
classes (gRPC status codes) by what happened, never a server traceback. A real
server process on loopback."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from nexus_cache import errors
from nexus_cache.client._errors import translated
from nexus_cache.server.wire import encode_error
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

from ._helpers import Server, close_all, server_env, start_server


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(fact_table(300), root / "facts.parquet", row_groups=2)
    write_parquet(rmat_edges(7), root / "edges.parquet", row_groups=2)
    for day in (1, 2):  # a Hive table: 'day' is in the paths only
        (root / "hive" / f"day={day}").mkdir(parents=True)
        write_parquet(fact_table(50), root / "hive" / f"day={day}" / "part-0.parquet")
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    for path in root.rglob("*.parquet"):
        os.utime(path, (past, past))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(server_env(tmp_path_factory.mktemp("served")))
    try:
        yield server
    finally:
        close_all([server])


def _queries(lake: Path) -> list[dict[str, object]]:
    edges = {"type": "scan", "source": str(lake / "edges.parquet")}
    graph = {"type": "graph", "edges": edges, "src": "src", "dst": "dst"}
    hive = str(lake / "hive")
    return [
        {"type": "scan", "source": str(lake / "facts.parquet")},
        # a table read: its partition column, a filter, a filter that prunes every file
        {"type": "scan", "source": hive},
        {
            "type": "scan",
            "source": hive,
            "columns": ["day", "amount"],
            "filter": [["day", "=", 2]],
        },
        {"type": "scan", "source": hive, "filter": [["day", "=", 9]]},
        # columns in an order of their own
        {"type": "scan", "source": str(lake / "facts.parquet"), "columns": ["amount", "order_id"]},
        {"type": "count", "source": str(lake / "facts.parquet")},
        {**graph, "algorithm": "pagerank"},
        {
            **graph,
            "algorithm": "bfs",
            "params": {"source": int(rmat_edges(7)["src"][0].as_py())},
        },
    ]


def test_get_schema_and_flight_info_give_the_result_schema_without_running(
    served: Server, lake: Path
) -> None:
    client = flight.connect(served.url)
    try:
        for query in _queries(lake):
            command = flight.FlightDescriptor.for_command(json.dumps(query).encode())
            schema = client.get_schema(command).schema
            info = client.get_flight_info(command)
            result = client.do_get(flight.Ticket(json.dumps(query).encode())).read_all()
            assert schema.equals(result.schema.remove_metadata()), query
            assert info.schema.equals(schema), query
        # a path descriptor names no query: one line that says what is served
        path = flight.FlightDescriptor.for_path(str(lake / "facts.parquet"))
        with pytest.raises(flight.FlightServerError) as refused:
            client.get_flight_info(path)
        assert "only command descriptors holding a query's JSON" in str(refused.value)
        assert "Traceback" not in str(refused.value)
        assert json.loads(refused.value.extra_info)["error"] == "ConfigError"
        # get_schema's errors: pyarrow's server sends them as a generic Arrow error
        # (it converts no Flight error there), with the same one line
        with pytest.raises(pa.ArrowException, match="only command descriptors holding"):
            client.get_schema(path)
        missing = json.dumps({"type": "scan", "source": str(lake / "nothing.parquet")})
        with pytest.raises(flight.FlightServerError) as error:
            client.get_flight_info(flight.FlightDescriptor.for_command(missing.encode()))
        assert json.loads(error.value.extra_info)["error"] == "FileNotFoundError"
        unknown = {"type": "scan", "source": str(lake / "facts.parquet"), "columns": ["nope"]}
        with pytest.raises(pa.ArrowException, match="not in the Parquet schema"):
            client.get_schema(flight.FlightDescriptor.for_command(json.dumps(unknown).encode()))
        assert list(client.list_flights()) == []  # nothing runs now
    finally:
        client.close()


def test_the_client_maps_every_flight_error_class_back_to_the_service_error() -> None:
    cases = [
        (flight.FlightServerError, errors.ConfigError("bad query")),
        (flight.FlightServerError, FileNotFoundError("no source")),
        (flight.FlightCancelledError, errors.QueryCancelledError("query q was cancelled")),
        (flight.FlightInternalError, RuntimeError("boom")),
    ]
    for flight_class, exc in cases:
        message, info = encode_error(exc)
        with pytest.raises(Exception) as raised, translated("grpc://x:1", None):
            raise flight_class(message, extra_info=info)
        expected = errors.ServerError if type(exc) is RuntimeError else type(exc)
        assert type(raised.value) is expected
        assert str(raised.value) == message


def test_uploads_and_exchanges_are_refused_in_one_line_and_the_server_goes_on(
    served: Server, lake: Path
) -> None:
    """``do_put`` and ``do_exchange`` are not served: a generic client gets a one-line
    error saying what is served, never pyarrow's traceback of the server."""
    client = flight.connect(served.url)
    try:
        descriptor = flight.FlightDescriptor.for_command(b'{"type": "scan"}')
        schema = pa.schema([("a", pa.int64())])

        def put() -> None:
            writer, _ = client.do_put(descriptor, schema)
            writer.write_table(pa.table({"a": [1, 2]}))
            writer.close()

        def exchange() -> None:
            writer, reader = client.do_exchange(descriptor)
            writer.done_writing()
            reader.read_all()

        for name, call in (("do_put", put), ("do_exchange", exchange)):
            with pytest.raises(flight.FlightError) as info:
                call()
            error = info.value
            assert isinstance(error, flight.FlightServerError), (name, repr(error))
            text = str(error)
            assert "Traceback" not in text, text
            assert 'File "' not in text, text
            line = text.split(". Detail:")[0]
            assert name in line, line
            assert "do_get" in line, line
            assert json.loads(error.extra_info)["error"] == "ConfigError"
        ticket = flight.Ticket(
            json.dumps({"type": "count", "source": str(lake / "facts.parquet")}).encode()
        )
        assert client.do_get(ticket).read_all()["rows"][0].as_py() == 300
    finally:
        client.close()
