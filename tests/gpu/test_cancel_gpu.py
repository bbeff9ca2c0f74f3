"""Cancelling a query on the CUDA backend: a PageRank on the GPU stops between
iterations and gives back its grant and its working memory.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path

import pytest

from nexus_cache.errors import QueryCancelledError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import GraphQuery, QueryService, Scan, ServiceConfig, verify_evidence
from nexus_cache.service.datagen import ring_edges, write_parquet

pytestmark = pytest.mark.gpu


def test_a_pagerank_on_the_gpu_stops_when_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "ring.parquet"
    write_parquet(ring_edges(1_000_000), path, row_groups=4)
    config = ServiceConfig(
        backend="cuda",
        cache_cap_bytes=1 << 30,
        evidence_dir=tmp_path / "evidence",
        lakehouse=LakehouseCacheConfig(
            root=tmp_path / "cache",
            policy="fill_before_read",
            max_bytes="4GiB",
            local_min_age_s=0.0,
        ),
    )
    params = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}
    query = GraphQuery(Scan(str(path)), "src", "dst", "pagerank", params=params)
    small = tmp_path / "small.parquet"
    write_parquet(ring_edges(1000), small, row_groups=1)
    with QueryService(config) as service:
        # compile PageRank's kernels first (a fresh machine spends seconds there,
        # a step with no stop point), so the cancel below lands in the iterations
        service.execute(GraphQuery(Scan(str(small)), "src", "dst", "pagerank"))
        cancel = threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(1)
        future = pool.submit(service.execute, query, cancel=cancel)
        deadline = time.monotonic() + 120
        while sum(line["decision"] == "admitted" for line in service.admission_log.lines) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(2.0)  # past the graph build, well into the iterations
        assert not future.done()
        cancelled_at = time.monotonic()
        cancel.set()
        with pytest.raises(QueryCancelledError):
            future.result(timeout=30)
        # stopped at its next iteration, not after its hours (generous: a loaded host)
        assert time.monotonic() - cancelled_at < 20
        pool.shutdown()
        snap = service.caches.ledger(0).snapshot()
        assert (snap.grant_count, snap.cache_reserved_bytes, snap.cache_pinned_in_use_bytes) == (
            0,
            0,
            0,
        )
        decisions = [str(line["decision"]) for line in service.admission_log.lines]
        assert decisions == ["admitted", "admitted", "cancelled"]
        # the device keeps serving: a short PageRank on the same (cached) graph
        done = service.execute(GraphQuery(Scan(str(path)), "src", "dst", "pagerank"))
        assert done.table.num_rows == 1_000_000
    assert verify_evidence(tmp_path / "evidence").ok
