"""The two ledger fields appear identically in reports, snapshots and Prometheus."""

from __future__ import annotations

import pytest

from nexus_cache.device import GAUGES, format_tsv, gauge_snapshot

from ._helpers import KIB, fill, make_caches


def test_gauge_names_and_mapping() -> None:
    assert GAUGES["nexus.gpu.cache.evictable.resident"][:2] == (
        "cache_evictable_resident_bytes",
        "nexus_gpu_cache_evictable_resident_bytes",
    )
    assert GAUGES["nexus.gpu.cache.pinned.in_use"][:2] == (
        "cache_pinned_in_use_bytes",
        "nexus_gpu_cache_pinned_in_use_bytes",
    )


def test_snapshot_equals_ledger_report_fields() -> None:
    caches = make_caches(devices=2, total=1 << 20)
    fill(caches.source_cache(0), "a", 3 * KIB)
    fill(caches.source_cache(1), "b", 5 * KIB)
    pin = caches.source_cache(1).checkout("b")
    snap = caches.gauge_snapshot()
    assert snap == {
        "nexus.gpu.cache.evictable.resident": {0: 3 * KIB, 1: 0},
        "nexus.gpu.cache.pinned.in_use": {0: 0, 1: 5 * KIB},
    }
    for report in caches.device_cache_reports():
        row = report.to_dict()
        for gauge, (field, _, _) in GAUGES.items():
            assert snap[gauge][report.device_id] == row[field]
    pin.release()
    assert gauge_snapshot(caches.ledgers())["nexus.gpu.cache.pinned.in_use"] == {0: 0, 1: 0}


def test_tsv_of_reports_and_of_their_dict_form_agree() -> None:
    # a client holds the rows a server sent as dicts, and prints them the same way
    caches = make_caches(devices=2, total=1 << 20)
    fill(caches.source_cache(1), "b", 5 * KIB)
    reports = caches.device_cache_reports()
    text = format_tsv(reports)
    assert format_tsv([r.to_dict() for r in reports]) == text
    assert len(text.splitlines()) == 3
    assert str(5 * KIB) in text.splitlines()[2].split("\t")


def test_prometheus_export_on_private_registry() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    caches = make_caches(devices=2, total=1 << 20)
    caches.register_prometheus(registry)
    fill(caches.source_cache(0), "a", 3 * KIB)
    pin = caches.source_cache(0).checkout("a")

    def value(name: str, device: str) -> float | None:
        return registry.get_sample_value(name, {"device": device})

    assert value("nexus_gpu_cache_pinned_in_use_bytes", "0") == 3 * KIB
    assert value("nexus_gpu_cache_evictable_resident_bytes", "0") == 0
    assert value("nexus_gpu_cache_pinned_in_use_bytes", "1") == 0
    pin.release()  # read at scrape time: the next scrape sees the release
    assert value("nexus_gpu_cache_pinned_in_use_bytes", "0") == 0
    assert value("nexus_gpu_cache_evictable_resident_bytes", "0") == 3 * KIB
    text = prometheus_client.generate_latest(registry).decode()
    assert 'nexus_gpu_cache_evictable_resident_bytes{device="0"} 3072.0' in text
    # a second set of caches cannot register the same names on the same registry
    with pytest.raises(ValueError, match="Duplicated"):
        make_caches().register_prometheus(registry)
