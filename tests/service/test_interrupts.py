"""Ctrl-C in the middle of a query: every grant, reservation and pin is given back."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.service import GraphQuery, Scan

from ._helpers import make_lake, make_service


def test_an_interrupted_graph_query_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = make_lake(tmp_path)
    memory = importlib.import_module("nexus_cache.graph.memory")

    def interrupted(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt

    service = make_service(tmp_path)
    try:
        monkeypatch.setattr(memory, "transient_bytes", interrupted)
        with pytest.raises(KeyboardInterrupt):
            service.execute(GraphQuery(Scan(lake.edges), "src", "dst", "pagerank"))
        snap = service.caches.ledger(0).snapshot()
        assert (snap.grant_count, snap.cache_reserved_bytes, snap.cache_pinned_in_use_bytes) == (
            0,
            0,
            0,
        )
    finally:
        started = time.monotonic()
        shutdown = service.shutdown(timeout=120.0)
    assert all(device.complete for device in shutdown)
    # nothing was left pinned: the shutdown did not wait out its timeout
    assert time.monotonic() - started < 60
