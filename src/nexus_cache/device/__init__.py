"""GPU-resident caches: device ledger, allocation domains, residency lifecycle.

Per device, :class:`DeviceLedger` is the single byte authority: attempt
grants and cache bytes by residency state. With a nonzero ``cache_cap_bytes``
a :class:`DeviceResidentCaches` installs one
:class:`DeviceCacheAllocationFactory` (owner of the device's one allocation
domain) and the source and graph subdomains that share it. See
``docs/device.md`` for the capacity equation and the lifecycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.device.checkout import CheckoutStatus as CheckoutStatus
    from nexus_cache.device.checkout import PinLease as PinLease
    from nexus_cache.device.checkout import SourceCheckout as SourceCheckout
    from nexus_cache.device.checkout import SourceDiagnostics as SourceDiagnostics
    from nexus_cache.device.domain import (
        DeviceCacheAllocationFactory as DeviceCacheAllocationFactory,
    )
    from nexus_cache.device.graph.cache import GraphCacheStats as GraphCacheStats
    from nexus_cache.device.graph.cache import GraphCacheSubdomain as GraphCacheSubdomain
    from nexus_cache.device.graph.cache import GraphRun as GraphRun
    from nexus_cache.device.graph.cache import GraphRunStatus as GraphRunStatus
    from nexus_cache.device.graph.cache import run_graph as run_graph
    from nexus_cache.device.graph.key import GraphPlan as GraphPlan
    from nexus_cache.device.graph.key import GraphUncachedReason as GraphUncachedReason
    from nexus_cache.device.graph.key import ResidentGraphKey as ResidentGraphKey
    from nexus_cache.device.graph.key import plan_graph_run as plan_graph_run
    from nexus_cache.device.ledger import DeviceLedger as DeviceLedger
    from nexus_cache.device.ledger import Evictor as Evictor
    from nexus_cache.device.ledger import Grant as Grant
    from nexus_cache.device.ledger import LedgerSnapshot as LedgerSnapshot
    from nexus_cache.device.metrics import GAUGE_EVICTABLE_RESIDENT as GAUGE_EVICTABLE_RESIDENT
    from nexus_cache.device.metrics import GAUGE_PINNED_IN_USE as GAUGE_PINNED_IN_USE
    from nexus_cache.device.metrics import GAUGES as GAUGES
    from nexus_cache.device.metrics import DeviceCacheCollector as DeviceCacheCollector
    from nexus_cache.device.metrics import gauge_snapshot as gauge_snapshot
    from nexus_cache.device.metrics import register_prometheus as register_prometheus
    from nexus_cache.device.profile import MANAGED_CAPACITY_FRACTION as MANAGED_CAPACITY_FRACTION
    from nexus_cache.device.profile import DeviceProfile as DeviceProfile
    from nexus_cache.device.report import REPORT_COLUMNS as REPORT_COLUMNS
    from nexus_cache.device.report import DeviceCacheReport as DeviceCacheReport
    from nexus_cache.device.report import format_tsv as format_tsv
    from nexus_cache.device.residency import TRANSITIONS as TRANSITIONS
    from nexus_cache.device.residency import PinHandle as PinHandle
    from nexus_cache.device.residency import ResidencyState as ResidencyState
    from nexus_cache.device.residency import ResidentEntry as ResidentEntry
    from nexus_cache.device.resident import DeviceResidentCaches as DeviceResidentCaches
    from nexus_cache.device.resident import DeviceShutdown as DeviceShutdown
    from nexus_cache.device.source.cache import SOURCE_WAIT_TIMEOUT_S as SOURCE_WAIT_TIMEOUT_S
    from nexus_cache.device.source.cache import SourceCacheSubdomain as SourceCacheSubdomain
    from nexus_cache.device.source.claim import LEADER_LOCAL_ERRORS as LEADER_LOCAL_ERRORS
    from nexus_cache.device.source.claim import SourceClaim as SourceClaim
    from nexus_cache.device.source.events import SOURCE_EVENT_KINDS as SOURCE_EVENT_KINDS
    from nexus_cache.device.source.events import SOURCE_EVENT_LIMIT as SOURCE_EVENT_LIMIT
    from nexus_cache.device.source.events import SourceCacheEvent as SourceCacheEvent
    from nexus_cache.device.source.events import SourceEventSnapshot as SourceEventSnapshot
    from nexus_cache.device.source.key import SourceBypass as SourceBypass
    from nexus_cache.device.source.key import SourceFrameKey as SourceFrameKey
    from nexus_cache.device.subdomain import CacheSubdomain as CacheSubdomain
    from nexus_cache.device.subdomain import DrainResult as DrainResult
    from nexus_cache.device.subdomain import SubdomainStats as SubdomainStats
    from nexus_cache.device.values import ArrayBundle as ArrayBundle
    from nexus_cache.device.values import DeviceValue as DeviceValue

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "CheckoutStatus": "nexus_cache.device.checkout",
    "PinLease": "nexus_cache.device.checkout",
    "SourceCheckout": "nexus_cache.device.checkout",
    "SourceDiagnostics": "nexus_cache.device.checkout",
    "DeviceCacheAllocationFactory": "nexus_cache.device.domain",
    "GraphCacheStats": "nexus_cache.device.graph.cache",
    "GraphCacheSubdomain": "nexus_cache.device.graph.cache",
    "GraphRun": "nexus_cache.device.graph.cache",
    "GraphRunStatus": "nexus_cache.device.graph.cache",
    "run_graph": "nexus_cache.device.graph.cache",
    "GraphPlan": "nexus_cache.device.graph.key",
    "GraphUncachedReason": "nexus_cache.device.graph.key",
    "ResidentGraphKey": "nexus_cache.device.graph.key",
    "plan_graph_run": "nexus_cache.device.graph.key",
    "DeviceLedger": "nexus_cache.device.ledger",
    "Evictor": "nexus_cache.device.ledger",
    "Grant": "nexus_cache.device.ledger",
    "LedgerSnapshot": "nexus_cache.device.ledger",
    "GAUGE_EVICTABLE_RESIDENT": "nexus_cache.device.metrics",
    "GAUGE_PINNED_IN_USE": "nexus_cache.device.metrics",
    "GAUGES": "nexus_cache.device.metrics",
    "DeviceCacheCollector": "nexus_cache.device.metrics",
    "gauge_snapshot": "nexus_cache.device.metrics",
    "register_prometheus": "nexus_cache.device.metrics",
    "MANAGED_CAPACITY_FRACTION": "nexus_cache.device.profile",
    "DeviceProfile": "nexus_cache.device.profile",
    "REPORT_COLUMNS": "nexus_cache.device.report",
    "DeviceCacheReport": "nexus_cache.device.report",
    "format_tsv": "nexus_cache.device.report",
    "TRANSITIONS": "nexus_cache.device.residency",
    "PinHandle": "nexus_cache.device.residency",
    "ResidencyState": "nexus_cache.device.residency",
    "ResidentEntry": "nexus_cache.device.residency",
    "DeviceResidentCaches": "nexus_cache.device.resident",
    "DeviceShutdown": "nexus_cache.device.resident",
    "SOURCE_WAIT_TIMEOUT_S": "nexus_cache.device.source.cache",
    "SourceCacheSubdomain": "nexus_cache.device.source.cache",
    "LEADER_LOCAL_ERRORS": "nexus_cache.device.source.claim",
    "SourceClaim": "nexus_cache.device.source.claim",
    "SOURCE_EVENT_KINDS": "nexus_cache.device.source.events",
    "SOURCE_EVENT_LIMIT": "nexus_cache.device.source.events",
    "SourceCacheEvent": "nexus_cache.device.source.events",
    "SourceEventSnapshot": "nexus_cache.device.source.events",
    "SourceBypass": "nexus_cache.device.source.key",
    "SourceFrameKey": "nexus_cache.device.source.key",
    "CacheSubdomain": "nexus_cache.device.subdomain",
    "DrainResult": "nexus_cache.device.subdomain",
    "SubdomainStats": "nexus_cache.device.subdomain",
    "ArrayBundle": "nexus_cache.device.values",
    "DeviceValue": "nexus_cache.device.values",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
