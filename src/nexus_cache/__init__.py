"""nexus-cache: caches for GPU data work.

The facade is lazy: ``import nexus_cache`` loads nothing heavy, and each public
name is imported from its home module on first access.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports

# Not typing's: importing typing takes ~10 ms, a window in which a Ctrl-C of the
# command line would end in a traceback before its entry point can catch it.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from nexus_cache._version import __version__ as __version__
    from nexus_cache.backends import select_backend as select_backend
    from nexus_cache.cluster import ClusterQueryClient as ClusterQueryClient
    from nexus_cache.device import DeviceCacheAllocationFactory as DeviceCacheAllocationFactory
    from nexus_cache.device import DeviceCacheReport as DeviceCacheReport
    from nexus_cache.device import DeviceLedger as DeviceLedger
    from nexus_cache.device import DeviceProfile as DeviceProfile
    from nexus_cache.device import DeviceResidentCaches as DeviceResidentCaches
    from nexus_cache.device import Grant as Grant
    from nexus_cache.device import PinHandle as PinHandle
    from nexus_cache.device import ResidencyState as ResidencyState
    from nexus_cache.device import ResidentEntry as ResidentEntry
    from nexus_cache.device import ResidentGraphKey as ResidentGraphKey
    from nexus_cache.device import plan_graph_run as plan_graph_run
    from nexus_cache.frames import DeviceFrame as DeviceFrame
    from nexus_cache.graph import GraphOptions as GraphOptions
    from nexus_cache.graph import build_graph as build_graph
    from nexus_cache.lakehouse import LakehouseCache as LakehouseCache
    from nexus_cache.lakehouse import LakehouseCacheConfig as LakehouseCacheConfig
    from nexus_cache.lakehouse import LakehouseFile as LakehouseFile
    from nexus_cache.lakehouse import NexusCacheFileSystem as NexusCacheFileSystem
    from nexus_cache.lakehouse import ReadDiagnostics as ReadDiagnostics
    from nexus_cache.program import CacheableProgram as CacheableProgram
    from nexus_cache.program import CompileInputs as CompileInputs
    from nexus_cache.program import FileStreamProgramCache as FileStreamProgramCache
    from nexus_cache.program import InMemoryProgramCache as InMemoryProgramCache
    from nexus_cache.program import ProgramCacheResource as ProgramCacheResource
    from nexus_cache.program import RedisProgramCache as RedisProgramCache
    from nexus_cache.program import SQLiteProgramCache as SQLiteProgramCache
    from nexus_cache.program import TieredProgramCache as TieredProgramCache
    from nexus_cache.program import cached_compile as cached_compile
    from nexus_cache.program import make_program_cache_key as make_program_cache_key
    from nexus_cache.service import QueryService as QueryService
    from nexus_cache.service import ServiceConfig as ServiceConfig

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "__version__": "nexus_cache._version",
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

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
