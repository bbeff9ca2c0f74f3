"""nexus-cache: caches for GPU data work.

The facade is lazy: ``import nexus_cache`` loads nothing heavy, and each public
name is imported from its home module on first access.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # program cache
    "ProgramCacheResource": "nexus_cache.program",
    "InMemoryProgramCache": "nexus_cache.program",
    "FileStreamProgramCache": "nexus_cache.program",
    "SQLiteProgramCache": "nexus_cache.program",
    "RedisProgramCache": "nexus_cache.program",
    "TieredProgramCache": "nexus_cache.program",
    "make_program_cache_key": "nexus_cache.program",
    "cached_compile": "nexus_cache.program",
    "CompileInputs": "nexus_cache.program",
    "CacheableProgram": "nexus_cache.program",
    # lakehouse byte cache
    "LakehouseCache": "nexus_cache.lakehouse",
    "LakehouseCacheConfig": "nexus_cache.lakehouse",
    "LakehouseFile": "nexus_cache.lakehouse",
    "NexusCacheFileSystem": "nexus_cache.lakehouse",
    "ReadDiagnostics": "nexus_cache.lakehouse",
    # GPU-resident caches
    "DeviceProfile": "nexus_cache.device",
    "DeviceResidentCaches": "nexus_cache.device",
    "DeviceLedger": "nexus_cache.device",
    "DeviceCacheAllocationFactory": "nexus_cache.device",
    "DeviceCacheReport": "nexus_cache.device",
    "Grant": "nexus_cache.device",
    "PinHandle": "nexus_cache.device",
    "ResidencyState": "nexus_cache.device",
    "ResidentEntry": "nexus_cache.device",
    "select_backend": "nexus_cache.backends",
    # device frames
    "DeviceFrame": "nexus_cache.frames",
    # query service
    "QueryService": "nexus_cache.service",
    "ServiceConfig": "nexus_cache.service",
    # query services on Dask workers (the cluster extra)
    "ClusterQueryClient": "nexus_cache.cluster",
    # graphs and the resident graph cache
    "GraphOptions": "nexus_cache.graph",
    "build_graph": "nexus_cache.graph",
    "ResidentGraphKey": "nexus_cache.device",
    "plan_graph_run": "nexus_cache.device",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
