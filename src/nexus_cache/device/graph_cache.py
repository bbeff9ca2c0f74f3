"""Resident-graph cache subdomain of one device (the minimal registry).

Parked graphs have no LRU eviction and no per-key invalidation: they stay
resident until shutdown, and a reservation never evicts to make room (when
there is no headroom the caller runs the attempt-owned uncached path).
Duplicate concurrent builds are reconciled at publication: the first
published entry wins and the duplicate is torn down.
"""

from __future__ import annotations

from nexus_cache.device.subdomain import CacheSubdomain

__all__ = ["GraphCacheSubdomain"]


class GraphCacheSubdomain(CacheSubdomain):
    """Parked graphs on one device; resident until shutdown. Thread-safe."""

    kind = "graph"
    evicts_lru = False
    evict_on_reserve = False
