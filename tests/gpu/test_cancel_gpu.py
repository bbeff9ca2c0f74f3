"""Cancelling a query on the CUDA backend: a PageRank on the GPU stops between
iterations and gives back its grant and its working memory.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.errors import QueryCancelledError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import Graph, QueryService, Scan, ServiceConfig, verify_evidence
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
    query = Graph(Scan(str(path)), "src", "dst", "pagerank", params=params)
    with QueryService(config) as service:
        cancel = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = service.execute(query, cancel=cancel)
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 120
        while not any(line["decision"] == "admitted" for line in service.admission_log.lines):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(2.0)  # past the first run's compile, well into the iterations
        assert thread.is_alive()
        cancelled_at = time.monotonic()
        cancel.set()
        thread.join(30)
        assert time.monotonic() - cancelled_at < 2.0
        assert isinstance(box.get("error"), QueryCancelledError)
        snap = service.caches.ledger(0).snapshot()
        assert (snap.grant_count, snap.cache_reserved_bytes, snap.cache_pinned_in_use_bytes) == (
            0,
            0,
            0,
        )
        decisions = [str(line["decision"]) for line in service.admission_log.lines]
        assert decisions == ["admitted", "cancelled"]
        # the device keeps serving: a short PageRank on the same (cached) graph
        done = service.execute(Graph(Scan(str(path)), "src", "dst", "pagerank"))
        assert done.table.num_rows == 1_000_000
    assert verify_evidence(tmp_path / "evidence").ok
