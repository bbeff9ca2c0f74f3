"""The lakehouse status a query reports is what its read did, not what was planned."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nexus_cache.service import Count, Scan

from ._helpers import make_lake, make_service

QUERIES = 6


def _together(
    make_query: Callable[[str], Any], tmp_path: Path
) -> tuple[list[Any], dict[str, int]]:
    """Run ``QUERIES`` copies of one query on one cold object at once: the results,
    and the lakehouse's read counts."""
    lake = make_lake(tmp_path)
    barrier = threading.Barrier(QUERIES)
    results: list[Any] = []

    def planned(plan: object) -> None:
        barrier.wait(timeout=30)  # every query planned the cold object before any reads

    with make_service(tmp_path, on_planned=planned) as service:
        query = make_query(lake.edges)

        def run() -> None:
            results.append(service.execute(query))

        threads = [threading.Thread(target=run) for _ in range(QUERIES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        reads = service.lakehouse.stats()["reads"]
    assert len(results) == QUERIES
    return results, reads


def test_concurrent_cold_scans_one_miss_the_rest_followed(tmp_path: Path) -> None:
    # The decoded-source cache lets one scan read; the others wait for its
    # decode and read nothing: they made no copy, so they are not misses.
    results, reads = _together(lambda source: Scan(source, columns=("src", "dst")), tmp_path)
    statuses = sorted(r.diagnostics.lakehouse["status"] for r in results)
    assert statuses == ["miss"] + ["miss-followed"] * (QUERIES - 1)
    followed = [r for r in results if r.diagnostics.lakehouse["status"] == "miss-followed"]
    assert all(r.diagnostics.lakehouse["read"] is False for r in followed)
    assert reads["miss"] == 1


def test_concurrent_cold_counts_one_miss_the_rest_followed(tmp_path: Path) -> None:
    # A count reads every footer through the lakehouse itself: five of the six
    # reads wait on the first one's fill and read the entry it published.
    results, reads = _together(Count, tmp_path)
    statuses = sorted(r.diagnostics.lakehouse["status"] for r in results)
    assert statuses == ["miss"] + ["miss-followed"] * (QUERIES - 1)
    assert all(r.diagnostics.lakehouse["read_mode"] == "local" for r in results)
    assert reads["miss"] == 1
    assert reads["miss-followed"] == QUERIES - 1
