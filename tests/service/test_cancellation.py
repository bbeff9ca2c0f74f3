"""Cancelling a query through its cancel event: it stops where it is (waiting for
admission, in PageRank's iterations, before a retry), releases everything it
held, and says ``cancelled`` in the admission log and its evidence."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import networkx as nx
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import AttemptCancelledError, ConfigError, QueryCancelledError
from nexus_cache.service import GraphQuery, QueryService, Scan, verify_evidence
from nexus_cache.service.datagen import ring_edges, write_parquet

from ._helpers import MIB, make_lake, make_service

# PageRank that runs for hours on a ring: alpha near 1 converges slowly, and
# the tolerance is never met before max_iter
_SLOW_PAGERANK = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}


def _ring(root: Path) -> str:
    path = root / "ring.parquet"
    write_parquet(ring_edges(100_000), path, row_groups=2)
    past = time.time() - 60
    os.utime(path, (past, past))
    return str(path)


def _in_thread(service: QueryService, query: Any, cancel: threading.Event) -> dict[str, Any]:
    """Run ``query`` in a thread; the returned dict gets ``error`` (or ``result``)
    and ``finished`` (monotonic time) when it ends, and ``thread``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = service.execute(query, cancel=cancel)
        except BaseException as exc:
            box["error"] = exc
        box["finished"] = time.monotonic()

    box["thread"] = threading.Thread(target=run)
    box["thread"].start()
    return box


def _decisions(service: QueryService) -> list[tuple[str, str]]:
    return [(str(line["query_id"]), str(line["decision"])) for line in service.admission_log.lines]


def _outcomes(evidence: Path) -> list[str]:
    """The outcomes of the sealed attempts, which verify as a whole."""
    report = verify_evidence(evidence)
    assert report.ok, report.problems
    assert not report.warnings
    return [json.loads(p.read_text())["outcome"] for p in sorted(evidence.glob("attempt-*.json"))]


def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _queued(service: QueryService) -> int:
    """How many requests wait in the service's admission queues (read from its
    internals: the one way to see that a query has reached the queue)."""
    admission = service._admission
    with admission._released:
        return sum(len(queue) for queue in admission._queues.values())


def _graphs(service: QueryService) -> tuple[int, int]:
    """The device's graph cache ``(entries, hits)``: a graph is parked (or a
    parked one found) before its algorithm starts."""
    stats = service.caches.graph_cache(0).stats()
    return stats.entries, stats.hits


def test_a_query_waiting_for_admission_leaves_the_queue_when_cancelled(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    with make_service(
        tmp_path, total=64 * MIB, cache_cap_bytes=MIB, admission_timeout_s=60.0
    ) as service:
        ledger = service.caches.ledger(0)
        # every free byte taken: the query's grant waits (it could fit later)
        blocker = ledger.admit_grant("blocker", ledger.snapshot().free_managed_bytes)
        cancel = threading.Event()
        box = _in_thread(service, Scan(lake.facts), cancel)
        _wait_for(lambda: _queued(service) == 1, timeout=60)  # it is queued now
        assert "finished" not in box
        cancelled_at = time.monotonic()
        cancel.set()
        box["thread"].join(60)
        # it left the queue at its next look (every 0.05 s), far before
        # its 60 s admission timeout (generously bounded: the host may be loaded)
        assert box["finished"] - cancelled_at < 30
        error = box["error"]
        assert isinstance(error, QueryCancelledError)
        assert isinstance(error, AttemptCancelledError)  # a decode leader hands over
        assert "while waiting for admission" in str(error)
        assert ledger.snapshot().grant_count == 1  # the blocker's alone
        decisions = _decisions(service)
        assert [d for _q, d in decisions] == ["cancelled"]
        assert _outcomes(tmp_path / "evidence") == ["cancelled"]
        ledger.release_grant(blocker)
        # the queue is empty again: the next query is admitted at once
        assert service.execute(Scan(lake.facts)).table.num_rows == 4000
        assert _decisions(service)[-1][1] == "admitted"


def test_a_running_pagerank_stops_between_iterations_and_releases_its_grant(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    query = GraphQuery(Scan(_ring(tmp_path)), "src", "dst", "pagerank", params=_SLOW_PAGERANK)
    with make_service(tmp_path) as service:
        cancel = threading.Event()
        box = _in_thread(service, query, cancel)
        # the graph is built and parked: its algorithm runs (a fixed sleep could
        # cancel it still decoding on a loaded host)
        _wait_for(lambda: _graphs(service)[0] == 1, timeout=60)
        assert "finished" not in box
        cancelled_at = time.monotonic()
        cancel.set()
        box["thread"].join(60)
        # stopped at its next iteration, not after its hours (generous: a loaded host)
        assert box["finished"] - cancelled_at < 30
        error = box["error"]
        assert isinstance(error, QueryCancelledError)
        assert "during its graph algorithm" in str(error)
        snap = service.caches.ledger(0).snapshot()
        assert (snap.grant_count, snap.cache_reserved_bytes, snap.cache_pinned_in_use_bytes) == (
            0,
            0,
            0,
        )
        assert [d for _q, d in _decisions(service)] == ["admitted", "cancelled"]
        assert _outcomes(tmp_path / "evidence") == ["cancelled"]
        # the evidence says how the graph cache answered before the algorithm
        # was stopped: it built and parked the graph
        (sealed,) = sorted((tmp_path / "evidence").glob("attempt-*.json"))
        graph_cache = json.loads(sealed.read_text())["statuses"]["graph_cache"]
        assert graph_cache == {"status": "miss", "reason": None}
        again = _in_thread(service, query, cancel := threading.Event())
        try:
            _wait_for(lambda: len(_decisions(service)) == 3)  # admitted again
            _wait_for(lambda: _graphs(service)[1] == 1, timeout=60)  # the parked graph found
        finally:
            cancel.set()  # whatever failed, the slow PageRank stops
            again["thread"].join(30)
        assert isinstance(again["error"], QueryCancelledError)
        latest = max(
            (tmp_path / "evidence").glob("attempt-*.json"), key=lambda p: p.stat().st_mtime
        )
        assert json.loads(latest.read_text())["statuses"]["graph_cache"]["status"] == "hit"
        # the caches keep serving; the next PageRank is right
        result = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
        got = dict(
            zip(
                result.table["vertex"].to_pylist(),
                result.table["pagerank"].to_pylist(),
                strict=True,
            )
        )
        edges = pq.read_table(lake.edges)
        expected = nx.pagerank(
            nx.MultiDiGraph(
                list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
            ),
            tol=1e-12,
        )
        assert got.keys() == expected.keys()
        assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6


def test_a_retry_that_is_cancelled_stops_there(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    cancel = threading.Event()
    plans: list[int] = []

    def cancel_the_retry(plan: Any) -> None:
        plans.append(plan.grant_bytes)
        if len(plans) == 2:
            cancel.set()

    # a grant of a few bytes is exhausted by any scan: the first attempt is retried
    with make_service(
        tmp_path, min_grant_bytes=1, grant_expansion=1e-9, on_planned=cancel_the_retry
    ) as service:
        with pytest.raises(QueryCancelledError):
            service.execute(Scan(lake.facts), cancel=cancel)
        assert len(plans) == 2  # no third attempt
        assert [d for _q, d in _decisions(service)] == ["admitted", "cancelled"]
        assert _outcomes(tmp_path / "evidence") == ["retried", "cancelled"]
        assert service.caches.ledger(0).snapshot().grant_count == 0


def test_an_already_cancelled_query_never_runs(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    cancel = threading.Event()
    cancel.set()
    with make_service(tmp_path) as service:
        with pytest.raises(QueryCancelledError, match="before its next attempt"):
            service.execute(Scan(lake.facts), cancel=cancel)
        assert service.admission_log.lines == []
        with pytest.raises(ConfigError, match="cancel="):
            service.execute(Scan(lake.facts), cancel=True)  # type: ignore[arg-type]


def test_a_query_waiting_for_another_querys_decode_leaves_when_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nexus_cache.service._attempt as attempt_module

    lake = make_lake(tmp_path)
    real_decode = attempt_module.decode_object
    leading, release = threading.Event(), threading.Event()

    def slow_first_decode(*args: Any, **kwargs: Any) -> Any:
        if not leading.is_set():  # the leader's decode: held until the test lets it go
            leading.set()
            assert release.wait(30)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(attempt_module, "decode_object", slow_first_decode)
    with make_service(tmp_path) as service:
        leader = _in_thread(service, Scan(lake.facts), threading.Event())
        assert leading.wait(20)
        cancel = threading.Event()
        follower = _in_thread(service, Scan(lake.facts), cancel)
        _wait_for(lambda: service.caches.source_cache(0).stats().waits >= 1)
        cancelled_at = time.monotonic()
        cancel.set()
        follower["thread"].join(60)
        # it left the wait at once: not at the source cache's 120 s wait timeout
        # (generously bounded: the host may be loaded)
        assert follower["finished"] - cancelled_at < 60
        error = follower["error"]
        assert isinstance(error, QueryCancelledError)
        assert "while waiting for another query's decode" in str(error)
        assert service.caches.ledger(0).snapshot().grant_count == 1  # the leader's alone
        release.set()
        leader["thread"].join(30)
        assert leader["result"].table.num_rows == 4000
        assert leader["result"].diagnostics.source_cache["status"] == "miss-led"
        snap = service.caches.ledger(0).snapshot()
        assert (snap.grant_count, snap.cache_pinned_in_use_bytes) == (0, 0)
        assert sorted(d for _q, d in _decisions(service)) == ["admitted", "admitted", "cancelled"]
