"""The decoded source cache: one device's Parquet frames, decoded once per key.

:class:`SourceFrameKey` (``key``) is what the cache keys on;
:class:`SourceCacheSubdomain` (``cache``) hands out checkouts and, to one
caller per cold key, a :class:`SourceClaim` (``claim``: the decode lead and
the single flight behind it); ``events`` keeps the bounded, fingerprinted
load and promotion events. ``docs/device.md`` describes the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
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

# public name -> module that defines it (the imports above, for type checkers)
_EXPORTS: dict[str, str] = {
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
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
