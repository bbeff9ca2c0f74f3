"""Deprecated path of :mod:`nexus_cache.device.source.events`, where these names moved.

Import them from there or from :mod:`nexus_cache.device`; importing this
module warns (``DeprecationWarning``) once per process.
"""

from __future__ import annotations

from nexus_cache.device._moved import warn_moved
from nexus_cache.device.source.events import (
    SOURCE_EVENT_KINDS,
    SOURCE_EVENT_LIMIT,
    SourceCacheEvent,
    SourceEventLog,
    SourceEventSnapshot,
)

__all__ = [
    "SOURCE_EVENT_KINDS",
    "SOURCE_EVENT_LIMIT",
    "SourceCacheEvent",
    "SourceEventLog",
    "SourceEventSnapshot",
]

warn_moved(__name__, "nexus_cache.device.source.events")
