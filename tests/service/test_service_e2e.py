"""End to end on the host backend: results, cold == warm, statuses, retries, shutdown."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import LifecycleError, StalePlanError
from nexus_cache.service import Count, GraphQuery, Scan, verify_evidence
from nexus_cache.service.datagen import fact_table, write_parquet

from ._helpers import make_lake, make_service


@pytest.fixture
def lake(tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_lake(tmp_path)


def _mix(lake):  # type: ignore[no-untyped-def]
    edges = Scan(lake.edges, columns=("src", "dst"))
    return [
        Scan(lake.facts, columns=("order_id", "amount"), batch_rows=500),
        Count(lake.facts),
        GraphQuery(edges, "src", "dst", "pagerank"),
        GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source}),
        GraphQuery(edges, "src", "dst", "jaccard", directed=False),
    ]


def test_cold_and_warm_results_are_equal_and_statuses_as_expected(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    with make_service(tmp_path) as service:
        cold = [service.execute(q) for q in _mix(lake)]
        warm = [service.execute(q) for q in _mix(lake)]
    for c, w in zip(cold, warm, strict=True):
        assert c.table.equals(w.table)
        assert c.diagnostics.result_fingerprint == w.diagnostics.result_fingerprint
        assert len(c.diagnostics.attempts) == 1
        assert c.diagnostics.attempts[0].outcome == "ok"
    scan, count, pagerank, bfs, jaccard = cold
    # the first read of each object is a lakehouse miss filled before the read
    assert scan.diagnostics.lakehouse["status"] == "miss"
    assert scan.diagnostics.lakehouse["fill_mode"] == "blocking"
    assert pagerank.diagnostics.lakehouse["status"] == "miss"
    # count reads only the footer, through the entry the scan filled, and bypasses the source cache
    assert count.diagnostics.lakehouse["status"] == "hit"
    assert count.diagnostics.source_cache == {
        "status": "bypass",
        "reason": "synthetic count source",
    }
    assert count.diagnostics.graph_cache["status"] == "not_applicable"
    assert count.table.column("rows").to_pylist() == [4000]
    for result in warm:
        assert result.diagnostics.lakehouse["status"] == "hit"
    # the decoded-source cache: the first scan of each source leads the decode,
    # every later one (BFS and Jaccard read PageRank's edges) is a hit
    assert scan.diagnostics.source_cache["status"] == "miss-led"
    assert pagerank.diagnostics.source_cache["status"] == "miss-led"
    assert bfs.diagnostics.source_cache["status"] == "hit"
    assert jaccard.diagnostics.source_cache["status"] == "hit"
    for result in warm[:1] + warm[2:]:
        assert result.diagnostics.source_cache["status"] == "hit"
        assert result.diagnostics.lakehouse["read"] is False  # no byte read
    assert scan.diagnostics.graph_cache["status"] == "not_applicable"
    # the resident-graph cache: each construction contract is built once
    # (PageRank's graph is stored transposed, Jaccard's undirected), then reused
    for result in (pagerank, bfs, jaccard):
        assert result.diagnostics.graph_cache == {"status": "miss", "reason": None}
    for result in warm[2:]:
        assert result.diagnostics.graph_cache == {"status": "hit", "reason": None}
    assert scan.table.num_rows == 4000
    assert scan.table.column_names == ["order_id", "amount"]


def _nx_graph(lake, directed: bool, multi: bool = False):  # type: ignore[no-untyped-def]
    table = pq.read_table(lake.edges)
    if multi:  # every copy of a repeated edge counts
        graph = nx.MultiDiGraph() if directed else nx.MultiGraph()
    else:
        graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_edges_from(zip(table["src"].to_pylist(), table["dst"].to_pylist(), strict=True))
    return graph


def test_a_directory_source_and_a_zero_cache_cap(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    table = tmp_path / "facts_table"
    table.mkdir()
    write_parquet(fact_table(4000), table / "part-0.parquet")
    write_parquet(fact_table(300, seed=9), table / "part-1.parquet")
    (table / "_SUCCESS").write_text("")
    with make_service(tmp_path) as service:
        cold = service.execute(Scan(str(table), columns=("order_id",)))
        warm = service.execute(Scan(str(table), columns=("order_id",)))
        assert service.execute(Count(str(table))).table["rows"].to_pylist() == [4300]
    assert cold.table.num_rows == 4300
    assert cold.diagnostics.lakehouse["objects"] == 2
    assert cold.diagnostics.source_cache["status"] == "miss-led"
    assert warm.diagnostics.source_cache["status"] == "hit"
    assert cold.table.equals(warm.table)
    with make_service(tmp_path / "nocache", cache_cap_bytes=0) as service:
        result = service.execute(Scan(lake.facts))
        ranks = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
        assert service.caches.source_cache(0) is None
    assert result.diagnostics.source_cache == {"status": "bypass", "reason": "cache_cap_bytes=0"}
    assert ranks.diagnostics.graph_cache["status"] == "bypass"
    assert ranks.diagnostics.graph_cache["reason"].startswith("no_cache")


def test_one_parked_graph_serves_other_parameters(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    edges = Scan(lake.edges, columns=("src", "dst"))
    with make_service(tmp_path) as service:
        first = service.execute(
            GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source})
        )
        other = service.execute(
            GraphQuery(
                edges, "src", "dst", "bfs", params={"source": lake.bfs_source, "depth_limit": 1}
            )
        )
        stats = service.caches.graph_cache(0).stats()
    assert first.diagnostics.graph_cache["status"] == "miss"
    assert other.diagnostics.graph_cache["status"] == "hit"
    assert stats.entries == 1
    distances = [d for d in other.table["distance"].to_pylist() if d is not None]
    assert max(distances) == 1


def test_graph_results_agree_with_networkx(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    edges = Scan(lake.edges)
    with make_service(tmp_path) as service:
        pr = service.execute(GraphQuery(edges, "src", "dst", "pagerank", params={"tol": 1e-9}))
        bfs = service.execute(
            GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source})
        )
        jac = service.execute(GraphQuery(edges, "src", "dst", "jaccard", directed=False))
    directed = _nx_graph(lake, True)
    # PageRank counts each copy of a repeated edge, as NetworkX's multigraph does
    expected = nx.pagerank(_nx_graph(lake, True, multi=True), alpha=0.85, tol=1e-12, max_iter=1000)
    got = dict(zip(pr.table["vertex"].to_pylist(), pr.table["pagerank"].to_pylist(), strict=True))
    assert set(got) == set(expected)
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6
    lengths = nx.single_source_shortest_path_length(directed, lake.bfs_source)
    got_bfs = {
        v: d
        for v, d in zip(
            bfs.table["vertex"].to_pylist(), bfs.table["distance"].to_pylist(), strict=True
        )
        if d is not None
    }
    assert got_bfs == lengths
    undirected = _nx_graph(lake, False)
    # self loops stay in the neighbourhoods (as in NetworkX) but are not scored
    loops = nx.number_of_selfloops(undirected)
    pairs = list(zip(jac.table["first"].to_pylist(), jac.table["second"].to_pylist(), strict=True))
    assert len(pairs) == undirected.number_of_edges() - loops
    # NetworkX leaves u and v out of their common neighbours; the graph layer
    # counts a loop's vertex like any neighbour: compare pairs without loops
    looped = {u for u, _ in nx.selfloop_edges(undirected)}
    clean = [i for i, (u, v) in enumerate(pairs) if u not in looped and v not in looped]
    assert len(clean) > len(pairs) // 4
    scores = {(u, v): s for u, v, s in nx.jaccard_coefficient(undirected, pairs)}
    got_j = jac.table["jaccard"].to_numpy()
    assert np.allclose(got_j[clean], [scores[pairs[i]] for i in clean])


def test_a_stale_plan_is_retried_with_a_fresh_plan(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    planned = []

    def remove_entry_after_first_plan(plan) -> None:  # type: ignore[no-untyped-def]
        planned.append(plan)
        if len(planned) == 2:  # the warm query's first plan: a planned hit
            assert plan.source.plans[0].status.value == "hit"
            removed, _ = service.lakehouse.clear()
            assert removed == 1

    # no GPU caches: a source-cache hit would not read the lakehouse at all
    service = make_service(tmp_path, cache_cap_bytes=0, on_planned=remove_entry_after_first_plan)
    with service:
        query = Scan(lake.facts)
        cold = service.execute(query)
        result = service.execute(query)
    attempts = result.diagnostics.attempts
    assert [a.outcome for a in attempts] == ["retried", "ok"]
    assert "StalePlanError" in (attempts[0].error or "")
    assert planned[2].source.plans[0].status.value == "miss"  # the retry planned afresh
    assert result.table.equals(cold.table)
    report = verify_evidence(tmp_path / "evidence")
    assert report.ok
    assert len(report.verified) == 3
    docs = [json.loads(p.read_text()) for p in (tmp_path / "evidence").glob("attempt-*.json")]
    retried = [d for d in docs if d["outcome"] == "retried"]
    assert len(retried) == 1
    assert retried[0]["statuses"]["lakehouse"]["status"] == "stale"


def test_a_source_that_changes_after_every_plan_fails_after_max_attempts(
    tmp_path: Path, lake
) -> None:  # type: ignore[no-untyped-def]
    rewrites = []

    def rewrite_source(plan) -> None:  # type: ignore[no-untyped-def]
        rewrites.append(plan)
        write_parquet(fact_table(100 + len(rewrites)), lake.facts)

    with make_service(tmp_path, max_attempts=2, on_planned=rewrite_source) as service:
        with pytest.raises(StalePlanError, match=r"changed|plan again"):
            service.execute(Scan(lake.facts))
        lines = service.admission_log.lines
    assert len(rewrites) == 2
    assert [line["decision"] for line in lines] == ["admitted", "admitted"]
    docs = [json.loads(p.read_text()) for p in (tmp_path / "evidence").glob("attempt-*.json")]
    assert sorted(d["outcome"] for d in docs) == ["failed", "retried"]
    assert verify_evidence(tmp_path / "evidence").ok


def test_an_exhausted_grant_is_retried_with_a_larger_grant(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    with make_service(tmp_path, grant_expansion=1e-4, min_grant_bytes=512) as service:
        result = service.execute(Scan(lake.facts))
        lines = service.admission_log.lines
    attempts = result.diagnostics.attempts
    assert [a.outcome for a in attempts] == ["retried", "ok"]
    assert "GrantExhaustedError" in (attempts[0].error or "")
    assert attempts[1].grant_bytes >= 2 * attempts[0].used_bytes
    assert attempts[1].used_bytes <= attempts[1].grant_bytes
    assert [line["decision"] for line in lines] == ["admitted", "admitted"]


def test_shutdown_is_idempotent_and_refuses_new_queries(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    service = make_service(tmp_path)
    service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
    graph, source = service.caches.graph_cache(0), service.caches.source_cache(0)
    assert graph.stats().entries == 1
    assert source.stats().entries == 1
    assert service.caches.ledger(0).snapshot().cache_evictable_resident_bytes > 0
    first = service.shutdown()
    (device,) = first
    assert device.complete
    assert device.graph.destroyed == 1  # the graph cache drained, then the source cache
    assert device.source.destroyed == 1
    assert device.domain_released
    assert service.caches.ledger(0).snapshot().cache_charged_bytes == 0
    assert service.shutdown() is first
    assert service.caches.closed
    with pytest.raises(LifecycleError, match="shut down"):
        service.execute(Scan(lake.facts))


def test_json_queries_and_errors_reach_the_caller(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    with make_service(tmp_path) as service:
        result = service.execute(json.dumps({"type": "count", "source": lake.facts}))
        assert result.table.column("rows").to_pylist() == [4000]
        with pytest.raises(FileNotFoundError):
            service.execute(Scan(str(tmp_path / "missing.parquet")))
        with pytest.raises(Exception, match="not in"):
            service.execute(Scan(lake.facts, columns=("nope",)))
    assert verify_evidence(tmp_path / "evidence").ok


def test_concurrent_cold_scans_decode_once(tmp_path: Path, lake) -> None:  # type: ignore[no-untyped-def]
    import threading

    barrier = threading.Barrier(4)
    results: list = []  # type: ignore[type-arg]

    def together(plan) -> None:  # type: ignore[no-untyped-def]
        barrier.wait(timeout=10)  # every attempt planned before any decodes

    with make_service(tmp_path, on_planned=together) as service:
        query = Scan(lake.edges, columns=("src", "dst"))

        def run() -> None:
            results.append(service.execute(query))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        events = service.caches.source_cache(0).event_snapshot()
    statuses = sorted(r.diagnostics.source_cache["status"] for r in results)
    assert len(results) == 4
    assert statuses.count("miss-led") == 1
    assert set(statuses) <= {"miss-led", "miss-followed", "hit"}
    assert [e.kind for e in events.events].count("load") == 1  # one decode for four scans
    assert all(r.table.equals(results[0].table) for r in results)
