"""Persistent cache for compiled CUDA programs (``cuda.core`` ``Program.compile``).

Imports the standard library and ``xxhash`` (the entries' integrity
checks); ``cuda.core`` is used when present, redis-py only by
:class:`RedisProgramCache`.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports
from nexus_cache.program._filestream import FileStreamProgramCache
from nexus_cache.program._interop import activate as _activate_interop
from nexus_cache.program._memory import InMemoryProgramCache
from nexus_cache.program._resource import CacheStats, ProgramCacheResource
from nexus_cache.program._sqlite import SQLiteProgramCache

# Key derivation and the compile wrapper load on first use (import cost);
# CacheableProgram imports cuda.core.
_LAZY = {
    "CacheableProgram": "nexus_cache.program._cacheable",
    "CompileInputs": "nexus_cache.program._compile",
    "cached_compile": "nexus_cache.program._compile",
    "make_program_cache_key": "nexus_cache.program.keys",
    "register_with_cuda_core": "nexus_cache.program._interop",
    # shared and stacked caches (redis-py is imported when one is opened)
    "RedisProgramCache": "nexus_cache.program._redis",
    "TieredProgramCache": "nexus_cache.program._tiered",
    # inspection and the demo (the CLI's needs, public for anyone)
    "CACHE_KINDS": "nexus_cache.program._identify",
    "ProgramEntry": "nexus_cache.program._catalog",
    "describe_entries": "nexus_cache.program._catalog",
    "identify_cache_path": "nexus_cache.program._identify",
    "default_filestream_root": "nexus_cache.program._paths",
    "default_sqlite_path": "nexus_cache.program._paths",
    "run_demo": "nexus_cache.program._demo",
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())[0]


# cuda.core's Program.compile(cache=...) accepts our caches once cuda.core loads.
_activate_interop()

__all__ = [
    "CacheStats",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "SQLiteProgramCache",
    "RedisProgramCache",
    "TieredProgramCache",
    "CacheableProgram",
    "CompileInputs",
    "cached_compile",
    "make_program_cache_key",
    "register_with_cuda_core",
    "CACHE_KINDS",
    "ProgramEntry",
    "describe_entries",
    "identify_cache_path",
    "default_filestream_root",
    "default_sqlite_path",
    "run_demo",
]
