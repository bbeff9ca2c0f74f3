"""GPU-resident caches: device ledger, allocation domains, residency lifecycle.

Per device, :class:`DeviceLedger` is the single byte authority: attempt
grants and cache bytes by residency state. With a nonzero ``cache_cap_bytes``
a :class:`DeviceResidentCaches` installs one
:class:`DeviceCacheAllocationFactory` (owner of the device's one allocation
domain) and the source and graph subdomains that share it. See
``docs/device.md`` for the capacity equation and the lifecycle.
"""

from __future__ import annotations

from nexus_cache.device.checkout import (
    CheckoutStatus,
    PinLease,
    SourceCheckout,
    SourceDiagnostics,
)
from nexus_cache.device.domain import DeviceCacheAllocationFactory
from nexus_cache.device.graph import (
    ALGORITHMS,
    GraphCacheStats,
    GraphCacheSubdomain,
    GraphPlan,
    GraphRun,
    GraphRunStatus,
    GraphUncachedReason,
    ResidentGraphKey,
    plan_graph_run,
    run_graph,
)
from nexus_cache.device.ledger import DeviceLedger, Evictor, Grant, LedgerSnapshot
from nexus_cache.device.metrics import (
    GAUGE_EVICTABLE_RESIDENT,
    GAUGE_PINNED_IN_USE,
    GAUGES,
    DeviceCacheCollector,
    gauge_snapshot,
    register_prometheus,
)
from nexus_cache.device.profile import MANAGED_CAPACITY_FRACTION, DeviceProfile
from nexus_cache.device.report import REPORT_COLUMNS, DeviceCacheReport, format_tsv
from nexus_cache.device.residency import TRANSITIONS, PinHandle, ResidencyState, ResidentEntry
from nexus_cache.device.resident import DeviceResidentCaches, DeviceShutdown
from nexus_cache.device.source_cache import SOURCE_WAIT_TIMEOUT_S, SourceCacheSubdomain
from nexus_cache.device.source_claim import LEADER_LOCAL_ERRORS, SourceClaim
from nexus_cache.device.source_events import (
    SOURCE_EVENT_KINDS,
    SOURCE_EVENT_LIMIT,
    SourceCacheEvent,
    SourceEventSnapshot,
)
from nexus_cache.device.source_key import SourceBypass, SourceFrameKey
from nexus_cache.device.subdomain import CacheSubdomain, DrainResult, SubdomainStats
from nexus_cache.device.values import ArrayBundle, DeviceValue

__all__ = [
    "ALGORITHMS",
    "GraphCacheStats",
    "GraphPlan",
    "GraphRun",
    "GraphRunStatus",
    "GraphUncachedReason",
    "ResidentGraphKey",
    "plan_graph_run",
    "run_graph",
    "GAUGES",
    "LEADER_LOCAL_ERRORS",
    "SOURCE_EVENT_KINDS",
    "SOURCE_EVENT_LIMIT",
    "SOURCE_WAIT_TIMEOUT_S",
    "ArrayBundle",
    "CheckoutStatus",
    "DeviceValue",
    "PinLease",
    "SourceBypass",
    "SourceCacheEvent",
    "SourceCheckout",
    "SourceClaim",
    "SourceDiagnostics",
    "SourceEventSnapshot",
    "SourceFrameKey",
    "GAUGE_EVICTABLE_RESIDENT",
    "GAUGE_PINNED_IN_USE",
    "MANAGED_CAPACITY_FRACTION",
    "REPORT_COLUMNS",
    "TRANSITIONS",
    "CacheSubdomain",
    "DeviceCacheAllocationFactory",
    "DeviceCacheCollector",
    "DeviceCacheReport",
    "DeviceLedger",
    "DeviceProfile",
    "DeviceResidentCaches",
    "DeviceShutdown",
    "DrainResult",
    "Evictor",
    "GraphCacheSubdomain",
    "Grant",
    "LedgerSnapshot",
    "PinHandle",
    "ResidencyState",
    "ResidentEntry",
    "SourceCacheSubdomain",
    "SubdomainStats",
    "format_tsv",
    "gauge_snapshot",
    "register_prometheus",
]
