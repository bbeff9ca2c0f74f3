"""Deprecated path of :mod:`nexus_cache.device.graph.cache`, where these names moved.

Import them from there or from :mod:`nexus_cache.device`; importing this
module warns (``DeprecationWarning``) once per process.
"""

from __future__ import annotations

from nexus_cache.device._moved import warn_moved
from nexus_cache.device.graph.cache import (
    GraphCacheStats,
    GraphCacheSubdomain,
    GraphRun,
    GraphRunStatus,
    run_graph,
)

__all__ = ["GraphCacheStats", "GraphCacheSubdomain", "GraphRun", "GraphRunStatus", "run_graph"]

warn_moved(__name__, "nexus_cache.device.graph.cache")
