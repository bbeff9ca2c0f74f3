"""An adversary against a real ``nexus-cache serve`` with ``allowed_roots``: links
inside the lake that point outside it (reached through a directory, ``..``,
``file://``), and hostile tickets. Every refusal is one line naming what was
refused; no server traceback text ever reaches a client."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from nexus_cache.client import Client
from nexus_cache.errors import ConfigError
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

from ._helpers import Server, close_all, run_cli, server_env, start_server


def _aged(root: Path) -> None:
    past = time.time() - 60
    for path in root.rglob("*.parquet"):
        if not path.is_symlink():
            os.utime(path, (past, past))


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, dict[str, str], Path]]:
    """A lake with links out of it, the secrets they point to, and a server whose
    ``allowed_roots`` is the lake."""
    top = tmp_path_factory.mktemp("hostile")
    lake, outside = top / "lake", top / "outside"
    for folder in (lake / "dir", lake / "mixed", outside / "more"):
        folder.mkdir(parents=True)
    write_parquet(fact_table(11), outside / "secret.parquet")
    write_parquet(rmat_edges(6), outside / "more" / "edges.parquet")
    write_parquet(fact_table(5), lake / "dir" / "a_real.parquet")
    write_parquet(rmat_edges(6), lake / "edges.parquet")
    write_parquet(fact_table(7), lake / "mixed" / "real.parquet")
    # a file link out of the lake, listed by a directory scan
    (lake / "dir" / "innocent.parquet").symlink_to(outside / "secret.parquet")
    # a directory link out of the lake, and one inside a directory of the lake
    (lake / "elsewhere").symlink_to(outside)
    (lake / "mixed" / "sub").symlink_to(outside / "more")
    _aged(top)
    toml = top / "nexus.toml"
    toml.write_text(f"[server]\nallowed_roots = [{json.dumps(str(lake))}]\n")
    env = server_env(top)
    server = start_server(env, "--config", str(toml))
    try:
        yield server, env, top
    finally:
        close_all([server])


def _scan(source: str) -> dict[str, object]:
    return {"type": "scan", "source": source}


def _server_error(call: object) -> flight.FlightServerError:
    with pytest.raises(flight.FlightError) as info:
        call()  # type: ignore[operator]
    error = info.value
    # pyarrow's ArrowInvalid / FlightInternalError carry a Python traceback
    assert isinstance(error, flight.FlightServerError), repr(error)
    text = str(error)
    assert "Traceback" not in text, text
    assert 'File "' not in text, text
    assert "\n" not in text.split(". Detail:")[0], text
    return error


# -- allowed_roots ----------------------------------------------------------------------------


def test_a_directory_listing_a_link_out_of_the_roots_refuses_every_front_end(
    world: tuple[Server, dict[str, str], Path],
) -> None:
    server, env, top = world
    lake = top / "lake"
    link, secret = lake / "dir" / "innocent.parquet", top / "outside" / "secret.parquet"
    forms = [
        str(lake / "dir"),
        f"file://{lake / 'dir'}",
        f"local://{lake / 'dir'}",
        str(lake / "mixed" / ".." / "dir") + "/",
    ]
    graph_of = {
        "type": "graph",
        "src": "src",
        "dst": "dst",
        "algorithm": "degree",
    }

    def refused(error: BaseException) -> None:
        text = str(error)
        assert "/innocent.parquet' (listed in source" in text, text  # as listed
        assert repr(str(secret)) in text, text  # and what it resolves to
        assert "outside allowed_roots" in text, text

    plain = flight.connect(server.url)
    try:
        with Client(server.url) as client:
            for source in forms:
                queries = [
                    _scan(source),
                    {"type": "count", "source": source},
                    {**graph_of, "edges": _scan(source)},
                ]
                for query in queries:
                    with pytest.raises(ConfigError) as info:
                        client.execute(query)
                    refused(info.value)
                with pytest.raises(ConfigError) as info:
                    client.plan(_scan(source))
                refused(info.value)
                raw = json.dumps(_scan(source)).encode()
                descriptor = flight.FlightDescriptor.for_command(raw)
                refused(_server_error(lambda d=descriptor: plain.get_flight_info(d)))
                refused(_server_error(lambda r=raw: plain.do_get(flight.Ticket(r)).read_all()))
                plan = flight.Action("plan", raw)
                refused(_server_error(lambda a=plan: list(plain.do_action(a))))
            # what lies under the root still works
            table = client.execute(_scan(str(lake / "dir" / "a_real.parquet"))).table
            assert table.num_rows == 5
    finally:
        plain.close()
    cli = run_cli(env, "scan", str(lake / "dir"), "--server", server.url)
    assert cli.returncode == 2
    (line,) = cli.stderr.strip().splitlines()
    assert repr(str(link)) in line
    assert "outside allowed_roots" in line


def test_links_and_dot_dot_out_of_the_roots_are_refused_and_never_followed(
    world: tuple[Server, dict[str, str], Path],
) -> None:
    server, _env, top = world
    lake = top / "lake"
    with Client(server.url) as client:
        for source in (
            str(lake / "dir" / "innocent.parquet"),
            str(lake / "elsewhere"),
            str(lake / "elsewhere" / "secret.parquet"),
            str(lake / "mixed" / "sub"),
            str(lake / "mixed" / "sub" / "edges.parquet"),
            str(lake / ".." / "outside" / "secret.parquet"),
            f"file://{lake}/../outside",
            f"local://{lake}/elsewhere",
            f"file://{lake / 'elsewhere' / 'secret.parquet'}",
        ):
            for query in (_scan(source), {"type": "count", "source": source}):
                with pytest.raises(ConfigError, match=r"outside .*allowed_roots"):
                    client.execute(query)
        # a directory whose subdirectory links out: the link is not followed,
        # so the scan reads the lake's rows only
        result = client.execute(_scan(str(lake / "mixed")))
        assert result.table.equals(pq.read_table(lake / "mixed" / "real.parquet"))
        assert result.diagnostics.lakehouse["objects"] == 1


def test_percent_encoded_dot_segments_never_leave_a_url_root(tmp_path: Path) -> None:
    """An HTTP client decodes ``%2e%2e`` and resolves it, so a URL under an HTTP root
    written with encoded dot segments would fetch what lies outside the root."""
    site = tmp_path / "site"
    (site / "lake").mkdir(parents=True)
    write_parquet(fact_table(5), site / "lake" / "facts.parquet")
    write_parquet(fact_table(11), site / "secret.parquet")
    requested: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def send_head(self) -> Any:
            requested.append(self.path)
            return super().send_head()

        def log_message(self, *_: Any) -> None:
            pass

    web = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(site)))
    threading.Thread(target=web.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{web.server_address[1]}/lake"
    toml = tmp_path / "nexus.toml"
    toml.write_text(f"[server]\nallowed_roots = [{json.dumps(root)}]\n")
    server = start_server(server_env(tmp_path), "--config", str(toml))
    try:
        with Client(server.url) as client:
            for source in (
                f"{root}/%2e%2e/secret.parquet",
                f"{root}/%2E%2E/secret.parquet",
                f"{root}/.%2e/secret.parquet",
                f"{root}/..%2fsecret.parquet",
                f"{root}/%252e%252e/secret.parquet",
                f"{root}/sub/%2e%2e/%2e%2e/secret.parquet",
            ):
                for query in (_scan(source), {"type": "count", "source": source}):
                    with pytest.raises(ConfigError, match=r"outside .*allowed_roots"):
                        client.execute(query)
                with pytest.raises(ConfigError, match=r"outside .*allowed_roots"):
                    client.plan(_scan(source))
        assert not [p for p in requested if not p.startswith("/lake/")], requested
    finally:
        close_all([server])
        web.shutdown()
        web.server_close()


# -- hostile tickets --------------------------------------------------------------------------


def _hostile(facts: str) -> dict[str, bytes]:
    def j(query: object) -> bytes:
        return json.dumps(query).encode()

    graph = {"type": "graph", "edges": _scan(facts), "src": "src", "dst": "dst"}
    return {
        "nul in the source": j(_scan(facts[:-3] + "\x00" + facts[-3:])),
        "nul in a file URL": j(_scan("file://" + facts + "\x00")),
        "nul in a column": j({**_scan(facts), "columns": ["amount\x00"]}),
        "nul in the type": j({"type": "scan\x00", "source": facts}),
        "nul in a key": j({**_scan(facts), "x\x00": 1}),
        "nul in the algorithm": j({**graph, "algorithm": "bfs\x00"}),
        "nul in a parameter": j({**graph, "algorithm": "bfs", "params": {"source\x00": 1}}),
        "nul in an edge column": j({**graph, "src": "s\x00", "algorithm": "degree"}),
        "a huge source": j(_scan("/" + "a" * 60_000)),
        "a huge column": j({**_scan(facts), "columns": ["c" * 60_000]}),
        "a source of a number": j({"type": "scan", "source": 1}),
        "a source of a list": j({"type": "scan", "source": [facts]}),
        "columns of a string": j({**_scan(facts), "columns": "amount"}),
        "batch_rows of text": j({**_scan(facts), "batch_rows": "x"}),
        "batch_rows of NaN": b'{"type":"scan","source":%s,"batch_rows":NaN}' % j(facts),
        "an integer of 5000 digits": b'{"type":"scan","source":"x","batch_rows":%s}'
        % (b"9" * 5000),
        "a device of text": j({"query": _scan(facts), "device": "0"}),
        "a null query": j({"query": None}),
        "params of a list": j({**graph, "algorithm": "bfs", "params": [1]}),
        "a list": b"[1,2]",
        "nothing": b"",
        "invalid UTF-8": b'{"type":"scan","source":"\xff\xfe"}',
        "a lone surrogate": b'{"type":"scan","source":"/tmp/\\ud800.parquet"}',
        "deeply nested lists": b"[" * 30_000 + b"]" * 30_000,
        "a deeply nested field": b'{"type":"scan","source":"x","columns":'
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
    }


def test_hostile_tickets_get_one_line_errors_never_a_traceback(
    world: tuple[Server, dict[str, str], Path],
) -> None:
    server, _env, top = world
    facts = str(top / "lake" / "dir" / "a_real.parquet")
    plain = flight.connect(server.url)
    try:
        for name, raw in _hostile(facts).items():
            error = _server_error(lambda r=raw: plain.do_get(flight.Ticket(r)).read_all())
            info = json.loads(error.extra_info)
            assert info["message"], name
            assert "\n" not in info["message"], name
            assert len(info["message"]) < 2100, name
            # a plan reads no columns and ignores the device: those tickets plan
            planned: flight.FlightError | None = None
            try:
                plain.get_flight_info(flight.FlightDescriptor.for_command(raw))
            except flight.FlightError as exc:
                planned = exc
            if planned is not None:
                assert isinstance(planned, flight.FlightServerError), (name, repr(planned))
                assert "Traceback" not in str(planned), name
        assert plain.do_get(flight.Ticket(json.dumps(_scan(facts)).encode())).read_all()
    finally:
        plain.close()


def test_a_nul_in_a_source_is_the_documented_config_error(
    world: tuple[Server, dict[str, str], Path],
) -> None:
    server, _env, top = world
    source = str(top / "lake" / "dir") + "\x00/a.parquet"
    with Client(server.url) as client:
        with pytest.raises(ConfigError) as info:
            client.execute(_scan(source))
        assert str(info.value) == f"Scan.source={source!r} holds a NUL byte (\\x00); remove it"
        with pytest.raises(ConfigError, match="holds a NUL byte"):
            client.plan(_scan(source))
