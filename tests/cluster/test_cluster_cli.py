"""``nexus-cache cluster report`` against a real scheduler (workers in this process)."""

from __future__ import annotations

import json

import pytest

distributed = pytest.importorskip("distributed")

from nexus_cache.cli.main import main  # noqa: E402
from nexus_cache.cluster import ClusterQueryClient  # noqa: E402
from nexus_cache.service import Scan  # noqa: E402
from service._helpers import make_config, make_lake  # noqa: E402


@pytest.fixture
def cluster(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    with (
        distributed.LocalCluster(
            n_workers=2, processes=False, dashboard_address=":0", silence_logs=40
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield cluster, client


def test_report_lists_each_workers_caches_as_json_and_as_a_table(cluster, tmp_path, capsys):
    local, client = cluster
    lake = make_lake(tmp_path)
    nexus = ClusterQueryClient(client, make_config(tmp_path))
    query = Scan(lake.facts)
    nexus.execute(query)
    owner = nexus.execute(query).diagnostics.worker
    assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    workers = {w["worker"]: w for w in data["workers"]}
    assert set(workers) == set(nexus.workers())
    assert workers[owner]["devices"][0]["source_hits"] == 1
    assert workers[owner]["lakehouse"]["root"].endswith("worker-" + workers[owner]["name"])
    (program,) = workers[owner]["program_cache"]
    assert program["kind"] == "FileStreamProgramCache"
    assert main(["cluster", "report", "--scheduler", local.scheduler_address]) == 0
    out = capsys.readouterr().out
    for address in workers:
        assert address in out
    assert "2 workers" in out


def test_a_worker_without_the_plugin_is_listed_as_such(cluster, capsys):
    local, _ = cluster
    assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [w["service"] for w in data["workers"]] == [False, False]


def test_an_unreachable_scheduler_is_one_line_and_exit_2(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    assert main(["cluster", "report", "--scheduler", address, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: cannot reach the Dask scheduler")
    assert err.count("\n") == 1
