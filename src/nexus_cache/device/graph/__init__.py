"""The resident graph cache: keys and plans (``key``), the cache itself (``cache``).

:func:`plan_graph_run` decides whether a run may use a parked graph (a
:class:`ResidentGraphKey` only when the edges and the construction contract
are proven equal); :class:`GraphCacheSubdomain` parks built graphs in the
device's cache domain and runs algorithms on them; :func:`run_graph` is the
front door. Every name here is also importable from ``nexus_cache.device``.
"""

from __future__ import annotations

from nexus_cache.device.graph.cache import (
    GraphCacheStats,
    GraphCacheSubdomain,
    GraphRun,
    GraphRunStatus,
    run_graph,
)
from nexus_cache.device.graph.key import (
    ALGORITHMS,
    GraphPlan,
    GraphUncachedReason,
    ResidentGraphKey,
    plan_graph_run,
)

__all__ = [
    "ALGORITHMS",
    "GraphCacheStats",
    "GraphCacheSubdomain",
    "GraphPlan",
    "GraphRun",
    "GraphRunStatus",
    "GraphUncachedReason",
    "ResidentGraphKey",
    "plan_graph_run",
    "run_graph",
]
