"""The graph cache stays useful: rewritten edge files retire their old graphs, and
cached source frames never keep a graph build out."""

from __future__ import annotations

import os
import time
from pathlib import Path

from nexus_cache.service import GraphQuery, Scan
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet

from ._helpers import MIB, make_lake, make_service


def test_a_rewritten_edge_file_retires_its_old_graphs(tmp_path: Path) -> None:
    lake = make_lake(tmp_path, scale=8)
    path = Path(lake.edges)
    statuses = []
    # a cap that holds a few graphs: superseded versions used to pile up until
    # every graph query bypassed (no_headroom)
    with make_service(tmp_path, cache_cap_bytes=2 * MIB) as service:
        graphs = service.caches.graph_cache(0)
        for version in range(8):
            write_parquet(rmat_edges(8, seed=version), path, row_groups=4)
            past = time.time() - 600 + version  # a new identity each time, old enough
            os.utime(path, (past, past))
            result = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
            statuses.append(result.diagnostics.graph_cache["status"])
            assert graphs.stats().entries == 1  # only the current version stays parked
        again = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
        stats = graphs.graph_stats()
    assert statuses == ["miss"] * 8
    assert again.diagnostics.graph_cache["status"] == "hit"
    assert stats.retired == 7
    assert stats.retired_bytes > 0


def test_source_frames_filling_the_cap_do_not_keep_a_graph_out(tmp_path: Path) -> None:
    lake = make_lake(tmp_path, scale=8)
    facts = tmp_path / "lake" / "more"
    facts.mkdir()
    for number in range(6):
        write_parquet(fact_table(20_000, seed=number), facts / f"f{number}.parquet")
    past = time.time() - 600
    for name in os.listdir(facts):
        os.utime(facts / name, (past, past))
    with make_service(tmp_path, cache_cap_bytes=3 * MIB) as service:
        for name in sorted(os.listdir(facts)):  # cached frames, unpinned, fill the cap
            service.execute(Scan(str(facts / name)))
        source = service.caches.source_cache(0)
        assert source.stats().entries >= 2
        filled = service.caches.ledger(0).snapshot().cache_evictable_resident_bytes
        assert filled > 2 * MIB
        result = service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
        assert result.diagnostics.graph_cache == {"status": "miss", "reason": None}
        assert source.stats().evictions >= 1
