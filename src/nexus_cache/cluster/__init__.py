"""Query services on Dask workers: one per worker, queries routed to their caches.

Needs the ``cluster`` extra (``distributed``); see ``docs/cluster.md``.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports

_EXPORTS = {
    "ENV_REDIS_URL": "nexus_cache.cluster.client",
    "ClusterDiagnostics": "nexus_cache.cluster.client",
    "ClusterQueryClient": "nexus_cache.cluster.client",
    "PLUGIN_NAME": "nexus_cache.cluster.plugin",
    "SHUTDOWN_RECORD": "nexus_cache.cluster.plugin",
    "QueryServicePlugin": "nexus_cache.cluster.plugin",
    "cluster_report": "nexus_cache.cluster.plugin",
    "worker_program_cache": "nexus_cache.cluster.plugin",
    "worker_report": "nexus_cache.cluster.plugin",
    "worker_service": "nexus_cache.cluster.plugin",
    "rendezvous_order": "nexus_cache.cluster._routing",
    "routing_key": "nexus_cache.cluster._routing",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
