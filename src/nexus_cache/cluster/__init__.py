"""Query services on Dask workers: one per worker, queries routed to their caches.

Needs the ``cluster`` extra (``distributed``); see ``docs/cluster.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.cluster._routing import rendezvous_order as rendezvous_order
    from nexus_cache.cluster._routing import routing_key as routing_key
    from nexus_cache.cluster.client import ENV_REDIS_URL as ENV_REDIS_URL
    from nexus_cache.cluster.client import ClusterDiagnostics as ClusterDiagnostics
    from nexus_cache.cluster.client import ClusterQueryClient as ClusterQueryClient
    from nexus_cache.cluster.plugin import PLUGIN_NAME as PLUGIN_NAME
    from nexus_cache.cluster.plugin import SHUTDOWN_RECORD as SHUTDOWN_RECORD
    from nexus_cache.cluster.plugin import QueryServicePlugin as QueryServicePlugin
    from nexus_cache.cluster.plugin import cluster_report as cluster_report
    from nexus_cache.cluster.plugin import worker_program_cache as worker_program_cache
    from nexus_cache.cluster.plugin import worker_report as worker_report
    from nexus_cache.cluster.plugin import worker_service as worker_service

_EXPORTS: dict[str, str] = {
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
