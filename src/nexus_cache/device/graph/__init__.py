"""The resident graph cache: keys and plans (``key``), the cache itself (``cache``).

:func:`plan_graph_run` decides whether a run may use a parked graph (a
:class:`ResidentGraphKey` only when the edges and the construction contract
are proven equal); :class:`GraphCacheSubdomain` parks built graphs in the
device's cache domain and runs algorithms on them; :func:`run_graph` is the
front door. ``docs/graph.md`` ("Resident graph cache") describes the cache;
every name here is also exported by ``nexus_cache.device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.device.graph.cache import GraphCacheStats as GraphCacheStats
    from nexus_cache.device.graph.cache import GraphCacheSubdomain as GraphCacheSubdomain
    from nexus_cache.device.graph.cache import GraphRun as GraphRun
    from nexus_cache.device.graph.cache import GraphRunStatus as GraphRunStatus
    from nexus_cache.device.graph.cache import run_graph as run_graph
    from nexus_cache.device.graph.key import GraphPlan as GraphPlan
    from nexus_cache.device.graph.key import GraphUncachedReason as GraphUncachedReason
    from nexus_cache.device.graph.key import ResidentGraphKey as ResidentGraphKey
    from nexus_cache.device.graph.key import plan_graph_run as plan_graph_run

# public name -> module that defines it (the imports above, for type checkers)
_EXPORTS: dict[str, str] = {
    "GraphCacheStats": "nexus_cache.device.graph.cache",
    "GraphCacheSubdomain": "nexus_cache.device.graph.cache",
    "GraphRun": "nexus_cache.device.graph.cache",
    "GraphRunStatus": "nexus_cache.device.graph.cache",
    "run_graph": "nexus_cache.device.graph.cache",
    "GraphPlan": "nexus_cache.device.graph.key",
    "GraphUncachedReason": "nexus_cache.device.graph.key",
    "ResidentGraphKey": "nexus_cache.device.graph.key",
    "plan_graph_run": "nexus_cache.device.graph.key",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
