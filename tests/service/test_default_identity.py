"""The default configuration (no NEXUS_* variable, no lakehouse root) caches on
the device: identity is proven from the file's stat, and a rewrite is a miss."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.service import GraphQuery, QueryService, Scan, ServiceConfig


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NEXUS_"):
            monkeypatch.delenv(name)


def _write(path: Path, table: pa.Table, age_s: float = 60.0) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=max(1, table.num_rows // 3))
    os.replace(tmp, path)  # a new inode, as writers that replace files make
    past = time.time() - age_s
    os.utime(path, (past, past))


def _edges(n: int, star: bool = False) -> pa.Table:
    """A ring-like graph on 37 vertices, or (``star``) every vertex pointing at 0."""
    return pa.table(
        {
            "src": pa.array([i % 37 for i in range(n)], pa.int64()),
            "dst": pa.array([0 if star else (i * 7 + 1) % 37 for i in range(n)], pa.int64()),
        }
    )


def _service() -> QueryService:
    config = ServiceConfig.from_env(backend="host")
    assert config.lakehouse.root is None  # the default: no lakehouse root
    return QueryService(config, backend=HostBackend(device_total_bytes=1 << 30))


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A facts and an edges path, with no NEXUS_* variable set."""
    _clean_env(monkeypatch)
    return tmp_path / "facts.parquet", tmp_path / "edges.parquet"


def test_default_config_hits_the_source_and_graph_caches(paths: tuple[Path, Path]) -> None:
    facts, edges = paths
    _write(facts, pa.table({"x": list(range(3000)), "y": [i % 5 for i in range(3000)]}))
    _write(edges, _edges(500))
    scan, ranks = Scan(str(facts)), GraphQuery(Scan(str(edges)), "src", "dst", "pagerank")
    with _service() as service:
        first = [service.execute(q) for q in (scan, ranks)]
        second = [service.execute(q) for q in (scan, ranks)]
    cold_scan, cold_rank = first
    warm_scan, warm_rank = second
    assert cold_scan.diagnostics.lakehouse["reason"] == "no_root"  # read remotely
    assert cold_scan.diagnostics.source_cache["status"] == "miss-led"
    assert cold_rank.diagnostics.graph_cache == {"status": "miss", "reason": None}
    assert warm_scan.diagnostics.source_cache["status"] == "hit"
    assert warm_rank.diagnostics.source_cache["status"] == "hit"
    assert warm_rank.diagnostics.graph_cache == {"status": "hit", "reason": None}
    assert warm_scan.table.equals(cold_scan.table)
    assert warm_rank.table.equals(cold_rank.table)


def test_default_config_rewritten_file_is_a_miss_never_a_stale_hit(
    paths: tuple[Path, Path],
) -> None:
    facts, edges = paths
    _write(facts, pa.table({"x": list(range(100))}))
    _write(edges, _edges(300))
    ranks = GraphQuery(Scan(str(edges)), "src", "dst", "pagerank")
    with _service() as service:
        assert service.execute(Scan(str(facts))).table["x"].to_pylist() == list(range(100))
        before = service.execute(ranks)
        _write(facts, pa.table({"x": list(range(100, 250))}), age_s=30.0)
        _write(edges, _edges(300, star=True), age_s=30.0)
        scan = service.execute(Scan(str(facts)))
        after = service.execute(ranks)
        expected_after = _host_pagerank(service, edges)
    assert scan.table["x"].to_pylist() == list(range(100, 250))
    assert scan.diagnostics.source_cache["status"] == "miss-led"
    assert after.diagnostics.source_cache["status"] == "miss-led"
    assert after.diagnostics.graph_cache["status"] == "miss"
    assert not after.table.equals(before.table)
    assert after.table.equals(expected_after)


def _host_pagerank(service: QueryService, edges: Path) -> pa.Table:
    """The same PageRank with the device caches bypassed (a fresh service, cap 0)."""
    config = ServiceConfig.from_env(backend="host", cache_cap_bytes=0)
    with QueryService(config, backend=HostBackend(device_total_bytes=1 << 30)) as fresh:
        return fresh.execute(GraphQuery(Scan(str(edges)), "src", "dst", "pagerank")).table


def test_an_unprovable_identity_says_why_and_what_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_env(monkeypatch)
    edges = tmp_path / "edges.parquet"
    _write(edges, _edges(200), age_s=0.0)  # modified just now: not yet provable
    with _service() as service:
        scan = service.execute(Scan(str(edges)))
        ranks = service.execute(GraphQuery(Scan(str(edges)), "src", "dst", "pagerank"))
    reason = scan.diagnostics.source_cache["reason"]
    assert scan.diagnostics.source_cache["status"] == "bypass"
    assert "local_file_too_new" in reason
    assert "local_min_age_s" in reason
    assert ranks.diagnostics.graph_cache["status"] == "bypass"
    assert ranks.diagnostics.graph_cache["reason"].startswith("unstable_source: ")
    assert "local_min_age_s" in ranks.diagnostics.graph_cache["reason"]
