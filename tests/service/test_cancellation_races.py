"""Cancellation attacked at its edges: the event set exactly as a query finishes,
as its grant is admitted, while it leads a decode that others follow, while its
graph is being built; at random moments in a loop. Always the result or the
error (never both), and nothing held afterwards."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import networkx as nx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import QueryCancelledError
from nexus_cache.graph import stopping
from nexus_cache.service import GraphQuery, QueryService, Scan, verify_evidence
from nexus_cache.service.datagen import fact_table, ring_edges, write_parquet

from ._helpers import make_lake, make_service


def _held(service: QueryService) -> tuple[int, int, int, int, int]:
    (report,) = service.device_cache_reports()
    facts = report.to_dict()
    return (
        facts["grant_count"],
        facts["cache_reserved_bytes"],
        facts["cache_pinned_in_use_bytes"],
        facts["source_in_flight"],
        facts["graph_in_flight"],
    )


def _decisions(service: QueryService) -> list[str]:
    return [str(line["decision"]) for line in service.admission_log.lines]


def _outcomes(evidence: Path) -> list[str]:
    report = verify_evidence(evidence)
    assert report.ok, report.problems
    docs = [json.loads(p.read_text()) for p in evidence.glob("attempt-*.json")]
    return [d["outcome"] for d in sorted(docs, key=lambda d: d["attempt_id"])]


def _tsv_rows(evidence: Path) -> list[dict[str, str]]:
    header, *rows = (evidence / "admission.tsv").read_text().split("\n")[:-1]
    names = header.split("\t")
    out = []
    for row in rows:
        cells = row.split("\t")
        assert len(cells) == len(names), row
        out.append(dict(zip(names, cells, strict=True)))
    return out


def test_a_cancel_set_as_the_result_is_sealed_returns_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nexus_cache.service.evidence as evidence_module

    lake = make_lake(tmp_path)
    cancel = threading.Event()
    real_seal = evidence_module.EvidenceWriter.seal

    def seal_then_cancel(self: Any, doc: Any) -> Any:
        sealed = real_seal(self, doc)
        cancel.set()  # the query is done: only the grant's release is left
        return sealed

    monkeypatch.setattr(evidence_module.EvidenceWriter, "seal", seal_then_cancel)
    with make_service(tmp_path) as service:
        result = service.execute(Scan(lake.facts), cancel=cancel)
        assert result.table.equals(pq.read_table(lake.facts))
        assert _decisions(service) == ["admitted"]
        assert _held(service) == (0, 0, 0, 0, 0)
    assert _outcomes(tmp_path / "evidence") == ["ok"]


def test_a_cancel_set_as_the_grant_is_admitted_stops_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nexus_cache.service.admission as admission_module

    lake = make_lake(tmp_path)
    cancel = threading.Event()
    real_admitted = admission_module.Admission._admitted

    def admitted_then_cancel(self: Any, request: Any) -> None:
        real_admitted(self, request)
        cancel.set()

    monkeypatch.setattr(admission_module.Admission, "_admitted", admitted_then_cancel)
    with make_service(tmp_path) as service:
        with pytest.raises(QueryCancelledError, match="before it ran"):
            service.execute(Scan(lake.facts), cancel=cancel)
        assert _decisions(service) == ["admitted", "cancelled"]
        assert _held(service) == (0, 0, 0, 0, 0)
    assert _outcomes(tmp_path / "evidence") == ["cancelled"]


def test_cancels_at_random_moments_give_the_result_or_the_error_and_hold_nothing(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    edges = pq.read_table(lake.edges)
    pairs = list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    expected = nx.pagerank(nx.MultiDiGraph(pairs), tol=1e-12)
    facts = pq.read_table(lake.facts)
    ring = tmp_path / "ring.parquet"
    write_parquet(ring_edges(100_000), ring, row_groups=4)
    past = time.time() - 60
    os.utime(ring, (past, past))
    queries = [
        Scan(lake.facts),
        GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"),
        GraphQuery(Scan(lake.edges), "src", "dst", "jaccard"),
        # a few dozen iterations: many stop points to land between
        GraphQuery(
            Scan(str(ring)), "src", "dst", "pagerank", params={"tol": 1e-300, "max_iter": 40}
        ),
        Scan(str(ring)),
    ]
    rng = random.Random(11)
    answered = cancelled = 0
    with make_service(tmp_path) as service:
        took = []
        for query in queries:  # how long each takes, caches warm
            service.execute(query)
            started = time.perf_counter()
            service.execute(query)
            took.append(time.perf_counter() - started)
        for i in range(60):
            k = i % len(queries)
            query = queries[k]
            cancel = threading.Event()
            timer = threading.Timer(rng.uniform(0.0, 1.5 * took[k]), cancel.set)
            timer.start()
            started = time.perf_counter()
            try:
                result = service.execute(query, cancel=cancel)
            except QueryCancelledError:
                cancelled += 1
                result = None
                # it ran longer than measured (the host got busier): its next
                # cancel comes later, so results keep coming on a loaded host too
                took[k] *= 1.5
            finally:
                timer.join()
            if result is not None:
                took[k] = time.perf_counter() - started
                answered += 1
                if query is queries[0]:
                    assert result.table.equals(facts)
                elif query is queries[1]:
                    got = dict(
                        zip(
                            result.table["vertex"].to_pylist(),
                            result.table["pagerank"].to_pylist(),
                            strict=True,
                        )
                    )
                    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6
                elif query is queries[3]:
                    assert result.table.num_rows == 100_000
                    assert abs(sum(result.table["pagerank"].to_pylist()) - 1.0) < 1e-9
            assert _held(service) == (0, 0, 0, 0, 0)
        assert answered > 0
        assert cancelled > 0
    outcomes = _outcomes(tmp_path / "evidence")
    assert set(outcomes) <= {"ok", "cancelled"}
    rows = _tsv_rows(tmp_path / "evidence")
    assert {r["decision"] for r in rows} <= {"admitted", "cancelled"}
    # each query: admitted first, cancelled at most once after it
    by_query: dict[str, list[str]] = {}
    for row in rows:
        by_query.setdefault(row["query_id"], []).append(row["decision"])
    for decisions in by_query.values():
        assert decisions in (["admitted"], ["admitted", "cancelled"], ["cancelled"])


def test_a_decode_leader_cancelled_as_it_publishes_leaves_whole_frames_to_its_followers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nexus_cache.device.source.claim as claim_module
    import nexus_cache.service._attempt as attempt_module

    source = tmp_path / "parts"
    source.mkdir()
    for part in range(3):
        write_parquet(fact_table(3000, seed=part), source / f"part-{part}.parquet", row_groups=2)
        past = time.time() - 60
        os.utime(source / f"part-{part}.parquet", (past, past))
    first = source / "part-0.parquet"
    expected = pa.concat_tables(
        [pq.read_table(source / f"part-{part}.parquet") for part in range(3)]
    )
    real_decode = attempt_module.decode_object
    real_publish = claim_module.SourceClaim.publish
    leading, release = threading.Event(), threading.Event()
    leader_cancel = threading.Event()

    def held_first_decode(*args: Any, **kwargs: Any) -> Any:
        if not leading.is_set():  # the leader's first decode waits for the followers
            leading.set()
            assert release.wait(30)
        return real_decode(*args, **kwargs)

    def publish_and_cancel(self: Any, value: Any, **kwargs: Any) -> Any:
        leader_cancel.set()  # while the leader publishes its first frame
        return real_publish(self, value, **kwargs)

    monkeypatch.setattr(attempt_module, "decode_object", held_first_decode)
    monkeypatch.setattr(claim_module.SourceClaim, "publish", publish_and_cancel)
    boxes: list[dict[str, Any]] = []

    def run(query: Scan, cancel: threading.Event | None, box: dict[str, Any]) -> None:
        try:
            box["result"] = service.execute(query, cancel=cancel)
        except BaseException as exc:
            box["error"] = exc

    with make_service(tmp_path) as service:
        threads = []
        # the leader scans the three objects; the followers the first object alone
        # (the same frame key), so the leader goes on to the next object by itself
        for query, cancel in ((Scan(str(source)), leader_cancel), (Scan(str(first)), None)):
            for _ in range(1 if cancel else 2):
                box: dict[str, Any] = {}
                boxes.append(box)
                threads.append(threading.Thread(target=run, args=(query, cancel, box)))
                threads[-1].start()
            if cancel is leader_cancel:
                assert leading.wait(20)
        deadline = time.monotonic() + 20
        while service.caches.source_cache(0).stats().waits < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        for thread in threads:
            thread.join(60)
        error = boxes[0].get("error")
        assert isinstance(error, QueryCancelledError), boxes[0]
        assert "while decoding its source" in str(error)
        for box in boxes[1:]:
            assert "error" not in box, box
            assert box["result"].diagnostics.source_cache["status"] == "miss-followed"
            assert box["result"].table.equals(pq.read_table(first))
        assert _held(service) == (0, 0, 0, 0, 0)
        (report,) = service.device_cache_reports()
        assert report.to_dict()["source_entries"] == 1  # the published frame, whole
        # a later scan hits that frame and decodes the others, equal to pyarrow
        again = service.execute(Scan(str(source)))
        assert again.diagnostics.source_cache["status"] == "mixed(hit,miss-led)"
        assert again.table.equals(expected)
    assert sorted(_outcomes(tmp_path / "evidence")) == ["cancelled", "ok", "ok", "ok"]


@pytest.mark.parametrize("algorithm", ["pagerank", "bfs"])
def test_a_query_cancelled_while_its_graph_builds_leaves_the_graph_whole_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    import nexus_cache.graph.csr as csr_module

    # the NumPy BFS looks at the stop check between levels (the compiled one has no
    # stop point: a cancel during its build would find the query done)
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "numpy")
    lake = make_lake(tmp_path)
    params = {"source": lake.bfs_source} if algorithm == "bfs" else {}
    query = GraphQuery(Scan(lake.edges), "src", "dst", algorithm, params=params)
    cancel = threading.Event()
    real_build = csr_module.build_graph

    def build_and_cancel(*args: Any, **kwargs: Any) -> Any:
        cancel.set()  # while the graph builds: seen at the algorithm's first stop point
        return real_build(*args, **kwargs)

    with make_service(tmp_path) as service:
        monkeypatch.setattr(csr_module, "build_graph", build_and_cancel)
        with pytest.raises(QueryCancelledError, match="during its graph algorithm"):
            service.execute(query, cancel=cancel)
        monkeypatch.setattr(csr_module, "build_graph", real_build)
        assert _held(service) == (0, 0, 0, 0, 0)
        assert stopping._CHECK.get() is None  # no stop check left in this thread
        first = service.execute(query)
        assert first.diagnostics.graph_cache["status"] == "hit"  # built once, parked whole
        (report,) = service.device_cache_reports()
        assert report.to_dict()["graph_entries"] == 1
        service.caches.graph_cache(0)  # still serving
        fresh_root = tmp_path / "fresh"
        fresh_root.mkdir()
    with make_service(fresh_root) as fresh:
        assert fresh.execute(query).table.equals(first.table)  # as an uncancelled build


def test_a_cancelled_query_leaves_no_stop_check_for_the_next_in_its_thread(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    ring = tmp_path / "ring.parquet"
    write_parquet(ring_edges(100_000), ring, row_groups=2)
    past = time.time() - 60
    os.utime(ring, (past, past))
    # runs for hours: alpha near 1 on a ring
    slow = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}
    pagerank = GraphQuery(Scan(str(ring)), "src", "dst", "pagerank", params=slow)
    edges = pq.read_table(lake.edges)
    pairs = list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    expected = nx.pagerank(nx.MultiDiGraph(pairs), tol=1e-12)
    outcome: dict[str, Any] = {}

    def one_thread() -> None:
        # every query of this thread, one after the other, as a server worker runs them
        with make_service(tmp_path) as service:
            cancel = threading.Event()
            threading.Timer(0.3, cancel.set).start()
            try:
                service.execute(pagerank, cancel=cancel)
            except QueryCancelledError as exc:
                outcome["cancelled"] = str(exc)
            outcome["left"] = stopping._CHECK.get()
            # a stop check of an outer caller is restored, not dropped, after a query
            with stopping.stop_check(lambda: None):
                before = stopping._CHECK.get()
                service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
                outcome["restored"] = stopping._CHECK.get() is before
            result = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
            outcome["ranks"] = dict(
                zip(
                    result.table["vertex"].to_pylist(),
                    result.table["pagerank"].to_pylist(),
                    strict=True,
                )
            )

    thread = threading.Thread(target=one_thread)
    thread.start()
    thread.join(120)
    assert "during its graph algorithm" in outcome["cancelled"]
    assert outcome["left"] is None
    assert outcome["restored"] is True
    got = outcome["ranks"]
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6


@pytest.mark.parametrize("where", ["as_it_is_logged", "after_it_is_logged"])
def test_ctrl_c_landing_just_after_the_ledger_grants_leaves_no_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A KeyboardInterrupt is raised at the first check for signals after the
    signal arrives: here, as the admission begins to log the grant, or as the
    queue's bookkeeping runs once it is logged (a long-lived service in a
    notebook lives on after the interrupt)."""
    import nexus_cache.service.admission as admission_module

    lake = make_lake(tmp_path)
    real_admitted = admission_module.Admission._admitted
    real_notify = admission_module.threading.Condition.notify_all
    armed = [False]  # not an Event: that notifies through the patched Condition

    def interrupted_admitted(self: Any, request: Any) -> None:
        if where == "as_it_is_logged":
            raise KeyboardInterrupt
        armed[0] = True
        real_admitted(self, request)

    def notify_all(self: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt
        real_notify(self)

    monkeypatch.setattr(admission_module.Admission, "_admitted", interrupted_admitted)
    monkeypatch.setattr(admission_module.threading.Condition, "notify_all", notify_all)
    with make_service(tmp_path) as service:
        with pytest.raises(KeyboardInterrupt):
            service.execute(Scan(lake.facts))
        assert _held(service) == (0, 0, 0, 0, 0)
        monkeypatch.setattr(admission_module.Admission, "_admitted", real_admitted)
        assert service.execute(Scan(lake.facts)).table.num_rows == 4000
