"""One front door for queries: ``as_query``/``as_request`` read every form, ``scan``
and ``location`` say what a query reads, and a new ``Scan`` field travels through
every front end with no change outside ``service/queries.py``."""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.cluster import routing_key
from nexus_cache.errors import ConfigError
from nexus_cache.server import encode_ticket, parse_ticket
from nexus_cache.service import (
    Count,
    GraphQuery,
    QueryService,
    Scan,
    ServiceConfig,
    as_query,
    as_request,
    queries,
)
from nexus_cache.service import config as config_module
from server._helpers import close_all, run_cli, server_env, start_server
from service._helpers import make_config, make_lake

# A value other than the default for every field of every query kind. A new field
# makes test_every_field_of_every_kind_round_trips fail until it is added here.
_EDGES = Scan("/data/edges.parquet", columns=("s", "d", "w"), batch_rows=1000)
_SAMPLES: dict[type, dict[str, Any]] = {
    Scan: {
        "source": "s3://bucket/t",
        "columns": ("a", "b"),
        "batch_rows": 7,
        "filter": ((("a", ">=", 2), ("b", "in", ("x", None))), (("a", "=", 1.5),)),
        "as_of": 3,
    },
    Count: {"source": "file:///data/t/", "filter": ((("a", "in", ("x", None)),),), "as_of": 4},
    GraphQuery: {
        "edges": _EDGES,
        "src": "s",
        "dst": "d",
        "algorithm": "pagerank",
        "weight": "w",
        "directed": False,
        "params": {"alpha": 0.5, "tol": 1e-3, "max_iter": 9, "convergence": "networkx"},
    },
}


def test_every_field_of_every_kind_round_trips() -> None:
    for kind, sample in _SAMPLES.items():
        assert set(sample) == {f.name for f in dataclasses.fields(kind)}, kind
        query = kind(**sample)
        data = query.to_dict()
        assert set(data) == {"type", *sample}
        text = json.dumps(data)
        for form in (query, data, text, text.encode(), bytearray(text.encode())):
            assert as_query(form) == query
        assert as_request(encode_ticket(data, 3)) == (query, 3)
        assert parse_ticket(encode_ticket(data), max_bytes=1 << 16, allowed_roots=None) == (
            query,
            None,
        )


def test_as_query_refuses_what_is_no_query_in_one_form() -> None:
    for bad, words in [
        (42, "use a Scan, Count or GraphQuery"),
        (b"\xff\xfe", "query JSON is malformed"),
        ("[1]", "use a JSON object with a 'type'"),
        ("9" * 5000, "query JSON is malformed: it holds an integer of more digits"),
        ('{"type": "count", "source": "/x", "colour": 1}', "unknown field"),
    ]:
        with pytest.raises(ConfigError, match=words):
            as_query(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as digits:
        as_query("9" * 5000)
    assert "set_int_max_str_digits" not in str(digits.value)  # nothing a client can do
    # the server's ticket check gives the very same text
    with pytest.raises(ConfigError) as here:
        as_query(b"{")
    with pytest.raises(ConfigError) as there:
        parse_ticket(b"{", max_bytes=1 << 16, allowed_roots=None)
    assert str(here.value) == str(there.value)
    with pytest.raises(ConfigError, match="ticket device="):
        as_request({"query": Count("/x").to_dict(), "device": -1})
    with pytest.raises(ConfigError, match=r"ticket has unknown field\(s\) \['x'\]"):
        as_request('{"query": {"type": "count", "source": "/x"}, "x": 1}')


def test_query_scan_is_the_scan_it_reads() -> None:
    scan = Scan("/data/t", columns=("a",))
    assert scan.scan is scan
    assert Count("/data/t").scan == Scan("/data/t")
    graph = GraphQuery(_EDGES, "s", "d", "bfs", params={"source": 1})
    assert graph.scan is _EDGES


def test_one_normal_form_of_a_location_routes_and_is_read_without_the_filesystem(
    tmp_path: Path,
) -> None:
    # spellings of one local directory, and of one URL, share a location and a route
    local = [" /data/t", "/data/t/", "file:///data/t", "FILE:///data/t//", "local:///data/t/"]
    assert {Scan(s).location for s in local} == {"/data/t"}
    assert {routing_key(Count(s)) for s in local} == {"/data/t"}
    urls = ["s3://bucket/t", "S3://bucket/t/", " s3://bucket/t"]
    assert {routing_key(Scan(s)) for s in urls} == {"s3://bucket/t"}
    assert routing_key(Scan("s3://bucket/T")) != routing_key(Scan("s3://bucket/t"))
    # a link is not followed: routing reads the text only
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert Scan(str(tmp_path / "link")).location == str(tmp_path / "link")


def test_service_config_json_is_read_back_validated_and_hostile_text_refused(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, storage_options={"key": "secret"}, allowed_roots=["/data"])
    assert ServiceConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["storage_options"] == {"key": "secret"}
    for text, words in [
        ("{", "service config JSON is malformed"),
        ("[]", "write it with ServiceConfig.to_json"),
        ('{"colour": 1}', "does not fit ServiceConfig"),
        ('{"devices": [1]}', "does not fit ServiceConfig"),
        ('{"max_attempts": 0}', "max_attempts"),
        ("[" * 100_000, "malformed"),
    ]:
        with pytest.raises(ConfigError, match=words):
            ServiceConfig.from_json(text)


def test_the_public_names_examples_run() -> None:
    for module in (queries, config_module):
        result = doctest.testmod(module, raise_on_error=False, verbose=False)
        assert result.attempted > 0, module.__name__
        assert result.failed == 0, module.__name__


# -- a scratch Scan field, added in service/queries.py only -----------------------------

# What adding a field to Scan changes: the class (here a subclass with the field)
# and its entry in queries.py's table of kinds. Nothing of server/, client/ or
# cluster/ knows the field.
_SCRATCH = """
import dataclasses

from nexus_cache.errors import ConfigError
from nexus_cache.service import queries


@dataclasses.dataclass(frozen=True)
class ScratchScan(queries.Scan):
    scratch: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scratch is not None and not isinstance(self.scratch, str):
            raise ConfigError(f"Scan.scratch={self.scratch!r}; use a string")


queries._KINDS["scan"] = ScratchScan
"""


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scratch field in this process and, through a ``sitecustomize`` module on
    ``PYTHONPATH``, in every Python process started from here on."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_SCRATCH))
    monkeypatch.setattr(queries, "_KINDS", dict(queries._KINDS))
    exec(compile(_SCRATCH, "scratch", "exec"), {})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *sys.path]))
    return site


def _scratch_queries(lake: Any) -> list[dict[str, Any]]:
    edges = {"source": lake.edges, "columns": ["src", "dst"], "scratch": "e"}
    return [
        {"type": "scan", "source": lake.facts, "columns": ["order_id"], "scratch": "x"},
        {"type": "graph", "edges": edges, "src": "src", "dst": "dst", "algorithm": "degree"},
    ]


def _scratch_of(query: dict[str, Any]) -> Any:
    return (query["edges"] if query["type"] == "graph" else query)["scratch"]


def test_a_new_scan_field_travels_through_every_front_end(
    scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.client import Client

    lake = make_lake(tmp_path / "data", scale=6, fact_rows=500)
    sent = _scratch_queries(lake)
    assert as_query(sent[0]).to_dict()["scratch"] == "x"
    with pytest.raises(ConfigError, match="scratch"):
        as_query({**sent[0], "scratch": 1})

    # 1. the in-process service
    with QueryService(make_config(tmp_path / "alone")) as service:
        for query in sent:
            assert _scratch_of(service.execute(query).diagnostics.query) == _scratch_of(query)
            assert _scratch_of(service.execute(json.dumps(query)).diagnostics.query) == (
                _scratch_of(query)
            )

    # 2. a real server process and the client; 4. the CLI's ticket path to it
    env = server_env(tmp_path / "server", PYTHONPATH=os.environ["PYTHONPATH"])
    server = start_server(env)
    try:
        with Client(server.url) as client:
            for query in sent:
                result = client.execute(query, device=0)
                assert _scratch_of(result.diagnostics.query) == _scratch_of(query)
                assert _scratch_of(client.plan(query)["query"]) == _scratch_of(query)
        done = run_cli(env, "scan", lake.facts, "--limit", "0", "--json", "--server", server.url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["diagnostics"]["query"]["scratch"] is None
    finally:
        close_all([server])

    # 3. the cluster client, on a real LocalCluster of one worker process
    distributed = pytest.importorskip("distributed")
    from nexus_cache.cluster import ClusterQueryClient

    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", "1GiB")
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
    )
    try:
        with distributed.Client(cluster) as dask_client:
            nexus = ClusterQueryClient(dask_client, make_config(tmp_path / "cluster"))
            for query in sent:
                result = nexus.execute(query)
                assert _scratch_of(result.diagnostics.query) == _scratch_of(query)
    finally:
        cluster.close()
