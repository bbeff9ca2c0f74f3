"""The server's lakehouse counter counts copies made: six concurrent cold
queries of one object through a real server make one copy and count one miss."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.client import Client
from nexus_cache.service.datagen import fact_table, write_parquet

from ._helpers import close_all, server_env, start_server

CLIENTS = 6


def _lakehouse_counts(metrics_url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "nexus_cache_requests"
    ]
    return {
        s.labels["status"]: s.value
        for s in family.samples
        if s.name.endswith("_total") and s.labels["cache"] == "lakehouse"
    }


@pytest.mark.parametrize("kind", ["scan", "count"])
def test_concurrent_cold_queries_count_one_copy(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("prometheus_client")
    source = tmp_path / "lake" / "facts.parquet"
    source.parent.mkdir()
    write_parquet(fact_table(20_000), source, row_groups=4)
    past = time.time() - 60  # older than local_min_age_s: its identity is provable
    os.utime(source, (past, past))
    env = server_env(tmp_path)
    server = start_server(env, "--metrics-port", "0")
    try:
        assert server.metrics_url is not None
        start = threading.Barrier(CLIENTS)
        statuses: list[str] = []
        errors: list[BaseException] = []

        def query() -> None:
            try:
                with Client(server.url) as client:
                    start.wait(timeout=30)
                    result: Any = client.execute({"type": kind, "source": str(source)})
                    statuses.append(result.diagnostics.lakehouse["status"])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=query) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors
        # exactly one query copied the object; every other one either followed
        # that copy or was planned after it (a hit)
        assert statuses.count("miss") == 1, statuses
        assert set(statuses) <= {"miss", "miss-followed", "hit"}, statuses
        counts = _lakehouse_counts(server.metrics_url)
        assert counts.get("miss") == 1, counts
        assert sum(counts.values()) == CLIENTS
    finally:
        close_all([server])
