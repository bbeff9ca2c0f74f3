"""A service over two (host-simulated) devices: routing, pinning, independence."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.errors import ConfigError
from nexus_cache.service import GraphQuery, QueryService, Scan

from ._helpers import make_config, make_lake


def _service(root: Path) -> QueryService:
    return QueryService(
        make_config(root, devices=[0, 1]),
        backend=HostBackend(device_total_bytes=1 << 30, device_count=2),
    )


def test_a_repeated_query_goes_to_the_device_that_holds_its_source(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    scan = Scan(lake.facts, columns=("order_id", "amount"))
    with _service(tmp_path) as service:
        cold = service.execute(scan)
        # the cold scan's cached frame makes its device the one with less free
        # memory: without routing, the next scan went to the other, cold, device
        for _ in range(3):
            warm = service.execute(scan)
            assert warm.diagnostics.device_id == cold.diagnostics.device_id
            assert warm.diagnostics.source_cache["status"] == "hit"
            assert warm.table.equals(cold.table)
        other = service.execute(Scan(lake.edges, columns=("src", "dst")))
        assert other.diagnostics.device_id != cold.diagnostics.device_id


def test_queries_pinned_to_each_device_run_concurrently_and_agree(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    edges = Scan(lake.edges, columns=("src", "dst"))
    queries = [
        Scan(lake.facts, columns=("order_id", "amount"), batch_rows=500),
        GraphQuery(edges, "src", "dst", "pagerank"),
        GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source}),
    ]
    with _service(tmp_path / "one") as single:
        expected = [single.execute(q, device=0).table for q in queries]
    results: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[BaseException] = []
    with _service(tmp_path / "two") as service:

        def run(device: int) -> None:
            try:
                for _ in range(2):  # cold, then warm
                    for q in queries:
                        results[device].append(service.execute(q, device=device))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        for device in (0, 1):
            assert [r.diagnostics.device_id for r in results[device]] == [device] * 6
            for result, table in zip(results[device], expected * 2, strict=True):
                assert result.table.equals(table)
            warm = results[device][3:]
            assert [r.diagnostics.source_cache["status"] for r in warm] == ["hit"] * 3
        reports = {r.device_id: r for r in service.device_cache_reports()}
        assert set(reports) == {0, 1}
        shutdown = service.shutdown()
    assert [d.device_id for d in shutdown] == [0, 1]
    assert all(d.complete for d in shutdown)


@pytest.mark.parametrize("device", [2, -1, True, "0", 0.0])
def test_a_device_the_service_does_not_serve_is_refused(tmp_path: Path, device: Any) -> None:
    lake = make_lake(tmp_path)
    with (
        _service(tmp_path) as service,
        pytest.raises(ConfigError, match=r"device=.*use one of: 0, 1"),
    ):
        service.execute(Scan(lake.facts), device=device)


@pytest.mark.parametrize("raw", ["0", "65", "two", "1_0", "-1", "\u0661"])
def test_a_bad_host_device_count_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", raw)
    with pytest.raises(ConfigError, match=r"NEXUS_HOST_DEVICE_COUNT=.*from 1 to 64"):
        HostBackend()


def test_the_host_device_count_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", " 3 ")
    assert HostBackend().device_count() == 3
    monkeypatch.setenv("NEXUS_HOST_DEVICE_COUNT", "")
    assert HostBackend().device_count() == 1
