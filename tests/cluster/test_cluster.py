"""Query services on a real Dask ``LocalCluster`` of worker processes (host backend)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from nexus_cache.cluster import (  # noqa: E402
    SHUTDOWN_RECORD,
    ClusterDiagnostics,
    ClusterQueryClient,
    rendezvous_order,
    routing_key,
)
from nexus_cache.errors import ConfigError, LifecycleError  # noqa: E402
from nexus_cache.service import Count, GraphQuery, QueryService, Scan, tables_match  # noqa: E402
from server._helpers import wait_until  # noqa: E402
from service._helpers import make_config, make_lake  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _lake_with_copies(root: Path, copies: int) -> tuple[object, list[str]]:
    lake = make_lake(root)
    sources = []
    for i in range(copies):
        path = lake.root / f"facts-{i}.parquet"
        shutil.copyfile(lake.facts, path)
        past = time.time() - 60
        os.utime(path, (past, past))
        sources.append(str(path))
    return lake, sources


def _queries(lake) -> list:  # type: ignore[no-untyped-def]
    edges = Scan(lake.edges, columns=("src", "dst"))
    return [
        Scan(lake.facts),
        Scan(lake.facts, columns=("order_id", "amount")),
        Count(lake.facts),
        GraphQuery(edges, "src", "dst", "pagerank"),
        GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source}),
        GraphQuery(edges, "src", "dst", "jaccard", directed=False),
    ]


def _cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int = 3):  # type: ignore[no-untyped-def]
    # The workers' program caches land here (their environment is this one's).
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", "1GiB")
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    cluster = distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=2,
        processes=True,
        dashboard_address=":0",
        silence_logs=40,
    )
    return cluster, distributed.Client(cluster)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("cluster")
    mp = pytest.MonkeyPatch()
    lake, copies = _lake_with_copies(root, 9)
    cluster, client = _cluster(root, mp)  # type: ignore[arg-type]
    nexus = ClusterQueryClient(client, make_config(root))
    yield root, lake, copies, nexus
    client.close()
    cluster.close()
    mp.undo()


def test_results_equal_single_process_execution(running, tmp_path):
    _, lake, _, nexus = running
    with QueryService(make_config(tmp_path)) as alone:
        for query in _queries(lake):
            here = alone.execute(query)
            there = nexus.execute(query)
            assert tables_match(there.table, here.table), query
            assert isinstance(there.diagnostics, ClusterDiagnostics)
            assert there.diagnostics.worker in nexus.workers()
            assert there.diagnostics.result_fingerprint == here.diagnostics.result_fingerprint
            assert there.diagnostics.to_dict()["worker"] == there.diagnostics.worker


def _source_hits(nexus) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {r["worker"]: sum(d["source_hits"] for d in r["devices"]) for r in nexus.report()}


def test_a_repeated_query_hits_its_workers_source_cache_and_only_its(running):
    _, _, copies, nexus = running
    source = copies[0]
    query = Scan(source, columns=("customer", "amount"))
    first = nexus.execute(query)
    owner = first.diagnostics.worker
    assert first.diagnostics.source_cache["status"] == "miss-led"
    before = _source_hits(nexus)
    second = nexus.execute(query.to_dict())  # the dict form routes the same
    after = _source_hits(nexus)
    assert second.diagnostics.worker == owner == nexus.worker_for(query)
    assert second.diagnostics.source_cache["status"] == "hit"
    assert second.diagnostics.lakehouse["read_mode"] == "not_read"
    assert after[owner] == before[owner] + 1
    assert {w: n for w, n in after.items() if w != owner} == {
        w: n for w, n in before.items() if w != owner
    }
    # a graph query on the source of a scan goes to the same worker
    edges = Scan(source, columns=("customer", "order_id"))
    graph = nexus.execute(GraphQuery(edges, "customer", "order_id", "pagerank"))
    assert graph.diagnostics.worker == owner


def test_different_sources_spread_over_the_workers(running):
    _, _, copies, nexus = running
    used = {nexus.execute(Count(s)).diagnostics.worker for s in copies}
    assert len(used) >= 2
    assert used <= set(nexus.workers())


def test_routing_moves_only_the_keys_of_a_worker_that_leaves():
    workers = [f"tcp://10.0.0.{i}:4000" for i in range(4)]
    keys = [f"s3://bucket/table-{i}/" for i in range(400)]
    before = {k: rendezvous_order(k, workers)[0] for k in keys}
    gone = workers[1]
    after = {k: rendezvous_order(k, [w for w in workers if w != gone])[0] for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone}
    for k in moved:  # each to its next worker in its own order
        assert after[k] == rendezvous_order(k, workers)[1]
    assert 60 < len(moved) < 140  # about a quarter of the keys
    assert routing_key(Scan("file:///data/t/")) == routing_key(Count(" /data/t"))


def test_every_filter_and_snapshot_of_one_table_routes_to_one_worker() -> None:
    """The key is the table's location, never its filter or as_of: every query on
    one table (any filter, any snapshot, a graph on it) meets one worker, whose
    lakehouse and source caches hold the data files snapshots share."""
    table = "s3://lake/delta/edges"
    queries = [
        Scan(table),
        Scan(table + "/", ("src", "dst"), filter=[("w", ">", 0.5)]),
        Scan(table, filter=[[("kind", "=", "follow")], [("w", "<", 0.1)]], as_of=3),
        Scan(table, as_of=0),
        Count(table),
        GraphQuery(
            Scan(table, ("src", "dst"), filter=[("w", ">", 0.5)], as_of=7),
            "src",
            "dst",
            "pagerank",
        ),
    ]
    assert {routing_key(q) for q in queries} == {table}
    workers = [f"tcp://10.0.0.{i}:8786" for i in range(8)]
    assert len({rendezvous_order(routing_key(q), workers)[0] for q in queries}) == 1


def _pids(client) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return client.run(os.getpid)


def _executing(client, worker: str) -> int:  # type: ignore[no-untyped-def]
    """How many tasks ``worker``'s threads run now (asked of the worker itself)."""
    counts = client.run(lambda dask_worker: dask_worker.state.executing_count, workers=[worker])
    return int(counts[worker])


def _queries_on(client, worker: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The query tasks the scheduler has placed on ``worker`` (waiting or running)."""
    keys = client.processing(workers=[worker]).get(worker, [])
    return [k for k in keys if str(k).startswith("nexus-query-")]


def test_a_worker_killed_mid_run_loses_no_query_and_shutdown_is_in_order(tmp_path, monkeypatch):
    _, copies = _lake_with_copies(tmp_path, 12)
    cluster, client = _cluster(tmp_path, monkeypatch)
    evidence = tmp_path / "evidence"
    nexus = ClusterQueryClient(client, make_config(tmp_path, evidence_dir=evidence))
    try:
        workers = nexus.workers()
        assert len(workers) == 3
        keys = [routing_key(Count(s)) for s in copies]
        before = {k: rendezvous_order(k, workers)[0] for k in keys}
        with QueryService(make_config(tmp_path / "alone")) as alone:
            expected = {s: alone.execute(Scan(s)).table for s in copies}
        victim = nexus.worker_for(Scan(copies[0]))
        pid = _pids(client)[victim]
        # Both of the victim's threads busy: its queries wait there, in flight,
        # until it dies.
        blockers = [client.submit(time.sleep, 120, workers=[victim], pure=False) for _ in range(2)]
        assert wait_until(lambda: _executing(client, victim) == 2, timeout=60)
        results: dict[str, object] = {}
        failures: list[BaseException] = []

        def stream() -> None:
            try:
                for s in copies:
                    results[s] = nexus.execute(Scan(s))
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        graph_done: list[object] = []
        edges = Scan(copies[0], columns=("customer", "order_id"))
        heavy = threading.Thread(
            target=lambda: graph_done.append(
                nexus.execute(GraphQuery(edges, "customer", "order_id", "pagerank"))
            )
        )
        runner = threading.Thread(target=stream)
        heavy.start()
        runner.start()
        # Kill only once the graph query and the stream's first query were
        # both sent to the victim: a query that picks its worker after the
        # scheduler has dropped the victim never waits there (a fixed sleep
        # cannot promise this on a busy host).
        assert wait_until(lambda: len(_queries_on(client, victim)) == 2, timeout=60)
        assert results.get(copies[0]) is None  # waiting on the victim
        os.kill(pid, signal.SIGKILL)
        runner.join(120)
        heavy.join(120)
        for blocker in blockers:
            blocker.cancel()
        assert failures == []
        assert len(graph_done) == 1
        assert graph_done[0].diagnostics.lost_workers == (victim,)  # type: ignore[attr-defined]
        for s in copies:
            assert tables_match(results[s].table, expected[s])  # type: ignore[attr-defined]
            lost = results[s].diagnostics.lost_workers  # type: ignore[attr-defined]
            assert lost in ((), (victim,))
        # the stream's first query waited on the victim and was sent on when it died
        assert results[copies[0]].diagnostics.lost_workers == (victim,)  # type: ignore[attr-defined]
        # only the victim's keys moved (and those a replacement worker now wins)
        deadline = time.monotonic() + 30
        while victim in nexus.workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        now = nexus.workers()
        assert victim not in now
        joined = set(now) - set(workers)
        after = {k: rendezvous_order(k, now)[0] for k in keys}
        for k in keys:
            if before[k] != victim:
                assert after[k] in (before[k], *joined), k
        survivors = [w for w in workers if w != victim]
    finally:
        client.close()
        cluster.close()
    # closing the cluster shut each surviving worker's service down, in order
    records = [json.loads(p.read_text()) for p in evidence.glob(f"worker-*/{SHUTDOWN_RECORD}")]
    by_worker = {r["worker"]: r for r in records}
    for w in survivors:
        record = by_worker[w]
        assert record["complete"] is True
        assert record["service_closed"] is True
        assert record["order"][:4] == ["refuse_queries", "graph", "source", "domain"]
        (device,) = record["devices"]
        assert device["domain_released"] is True
        assert device["graph"]["still_pinned"] == device["source"]["still_pinned"] == 0
    assert victim not in by_worker  # SIGKILL: no teardown ran there


def test_an_error_of_the_query_is_raised_as_one_process_raises_it(running, tmp_path):
    _, _, _, nexus = running
    query = Scan(str(tmp_path / "missing.parquet"))
    with QueryService(make_config(tmp_path)) as alone, pytest.raises(Exception) as here:
        alone.execute(query)
    with pytest.raises(type(here.value)):
        nexus.execute(query)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"config": {"backend": "host"}}, "use a ServiceConfig"),
        ({"max_worker_losses": -1}, "max_worker_losses"),
        ({"max_worker_losses": True}, "max_worker_losses"),
        # on a worker, a bad shutdown_timeout failed its teardown: its service ran on unshut
        ({"shutdown_timeout": -1}, "shutdown_timeout=-1"),
        ({"shutdown_timeout": float("nan")}, "shutdown_timeout=nan"),
        ({"shutdown_timeout": "10"}, "shutdown_timeout='10'"),
        ({"shutdown_timeout": True}, "shutdown_timeout=True"),
    ],
)
def test_bad_client_settings_are_refused_before_touching_the_cluster(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClusterQueryClient(object(), **kwargs)


def test_filtered_scans_route_to_one_worker_and_share_its_decoded_source(running):
    import pyarrow.parquet as pq

    _, _, copies, nexus = running
    source = copies[1]
    columns = ("customer", "amount")
    first_filter = [("amount", ">", 50.0)]
    second_filter = [[("amount", "<=", 10.0)], [("customer", "<", 3)]]
    first = nexus.execute(Scan(source, columns, filter=first_filter))
    second = nexus.execute(Scan(source, columns, filter=second_filter).to_dict())
    assert second.diagnostics.worker == first.diagnostics.worker
    assert second.diagnostics.source_cache["status"] == "hit"
    assert second.diagnostics.table["filter_digest"] != first.diagnostics.table["filter_digest"]
    for result, flt in ((first, first_filter), (second, second_filter)):
        want = pq.read_table(source, columns=list(columns), filters=flt)
        assert sorted(result.table.to_pylist(), key=str) == sorted(want.to_pylist(), key=str)


def test_the_worker_list_never_reads_empty_while_the_client_refreshes_its_own(
    running, monkeypatch
):
    """The client's periodic refresh of its cached scheduler info asks for no worker:
    read between a fetch and its use, that copy lists none. ``workers()`` reads the
    scheduler's own answer instead."""
    _, _, _, nexus = running
    client = nexus._client
    want = nexus.workers()
    assert len(want) == 3
    # what the periodic refresh leaves behind, there before every read
    refresh = client._update_scheduler_info
    monkeypatch.setattr(client, "_update_scheduler_info", lambda n_workers=0: refresh(n_workers=0))
    for _ in range(20):
        assert nexus.workers() == want


def test_a_closed_dask_client_is_named_not_an_attribute_error(tmp_path, monkeypatch):
    # a closed Client has no scheduler: every call failed with AttributeError
    # "'NoneType' object has no attribute 'identity'"
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as cluster:
        client = distributed.Client(cluster)
        nexus = ClusterQueryClient(client, make_config(tmp_path))
        client.close()
        query = Scan(str(tmp_path / "facts.parquet"))
        calls = [
            lambda: nexus.execute(query),
            lambda: nexus.worker_for(query),
            nexus.workers,
            nexus.report,
            lambda: ClusterQueryClient(client, make_config(tmp_path)),
        ]
        for call in calls:
            with pytest.raises(LifecycleError, match="the Dask client is closed; make a new"):
                call()
