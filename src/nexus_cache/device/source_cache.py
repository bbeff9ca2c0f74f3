"""Decoded-source cache subdomain of one device (the minimal registry).

Unpinned source entries are evictable in LRU order: this subdomain registers
an evictor with the device ledger, so grant admission and its own
reservations can reclaim them. Single-flight decode (``checkout_or_claim``,
leader and followers) builds on this class.
"""

from __future__ import annotations

from nexus_cache.device.subdomain import CacheSubdomain

__all__ = ["SourceCacheSubdomain"]


class SourceCacheSubdomain(CacheSubdomain):
    """Source entries on one device; LRU-evictable when unpinned. Thread-safe."""

    kind = "source"
    evicts_lru = True
    evict_on_reserve = True
