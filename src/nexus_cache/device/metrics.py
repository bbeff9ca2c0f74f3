"""The two ledger gauges, as a plain snapshot and through prometheus-client.

The ledger fields and gauge names are one mapping, so reports, snapshots and
Prometheus always project the same values:

* ``cache_evictable_resident_bytes`` = gauge ``nexus.gpu.cache.evictable.resident``
  = Prometheus ``nexus_gpu_cache_evictable_resident_bytes{device="N"}``
* ``cache_pinned_in_use_bytes`` = gauge ``nexus.gpu.cache.pinned.in_use``
  = Prometheus ``nexus_gpu_cache_pinned_in_use_bytes{device="N"}``

Prometheus names cannot contain dots, hence the second spelling (with the
``_bytes`` unit suffix Prometheus asks for). prometheus-client is imported
only when a collector is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from nexus_cache.device.ledger import DeviceLedger, LedgerSnapshot
from nexus_cache.errors import BackendUnavailableError

__all__ = [
    "GAUGES",
    "GAUGE_EVICTABLE_RESIDENT",
    "GAUGE_PINNED_IN_USE",
    "DeviceCacheCollector",
    "gauge_snapshot",
    "register_prometheus",
]

GAUGE_EVICTABLE_RESIDENT = "nexus.gpu.cache.evictable.resident"
GAUGE_PINNED_IN_USE = "nexus.gpu.cache.pinned.in_use"

#: gauge -> (ledger field, Prometheus name, help text)
GAUGES: Mapping[str, tuple[str, str, str]] = {
    GAUGE_EVICTABLE_RESIDENT: (
        "cache_evictable_resident_bytes",
        "nexus_gpu_cache_evictable_resident_bytes",
        "Resident GPU cache bytes charged to the device ledger and not pinned (evictable).",
    ),
    GAUGE_PINNED_IN_USE: (
        "cache_pinned_in_use_bytes",
        "nexus_gpu_cache_pinned_in_use_bytes",
        "Resident GPU cache bytes charged to the device ledger and pinned by a checkout.",
    ),
}


def _snapshots(ledgers: Iterable[DeviceLedger]) -> list[LedgerSnapshot]:
    return [ledger.snapshot() for ledger in ledgers]


def gauge_snapshot(ledgers: Iterable[DeviceLedger]) -> dict[str, dict[int, int]]:
    """``{gauge name: {device id: bytes}}``, each device read under one ledger lock."""
    snaps = _snapshots(ledgers)
    return {
        gauge: {snap.device_id: getattr(snap, field) for snap in snaps}
        for gauge, (field, _, _) in GAUGES.items()
    }


class DeviceCacheCollector:
    """prometheus-client collector for the ledger gauges of some ledgers.

    Register it on a registry of your choice (tests use a private
    ``CollectorRegistry``); values are read from the ledgers at scrape time.
    """

    def __init__(self, ledgers: Callable[[], Iterable[DeviceLedger]]) -> None:
        self._ledgers = ledgers
        try:
            from prometheus_client.core import GaugeMetricFamily
        except ImportError as exc:
            raise BackendUnavailableError(
                f"Prometheus export needs prometheus-client ({exc}); install "
                "nexus-cache[metrics], or read gauge_snapshot() instead"
            ) from exc
        self._family = GaugeMetricFamily

    def _families(self, snaps: list[LedgerSnapshot]) -> Iterator[Any]:
        for field, prom_name, help_text in GAUGES.values():
            family = self._family(prom_name, help_text, labels=["device"])
            for snap in snaps:
                family.add_metric([str(snap.device_id)], getattr(snap, field))
            yield family

    def collect(self) -> Iterator[Any]:
        yield from self._families(_snapshots(self._ledgers()))

    def describe(self) -> Iterator[Any]:
        yield from self._families([])


def register_prometheus(
    ledgers: Callable[[], Iterable[DeviceLedger]], registry: Any = None
) -> DeviceCacheCollector:
    """Register a :class:`DeviceCacheCollector` on ``registry`` (default: the global one)."""
    collector = DeviceCacheCollector(ledgers)
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    registry.register(collector)
    return collector
