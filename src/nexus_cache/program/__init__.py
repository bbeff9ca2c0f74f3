"""Persistent cache for compiled CUDA programs (``cuda.core`` ``Program.compile``).

Importing the package loads only the standard library and the registration
hook for ``cuda.core`` (see ``_interop``); each public name loads its module
on first access. The backends need ``xxhash`` (the entries' integrity
checks); ``cuda.core`` is used when present, redis-py only by
:class:`RedisProgramCache`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports
from nexus_cache.program._interop import activate as _activate_interop

if TYPE_CHECKING:
    from nexus_cache.program._cacheable import CacheableProgram as CacheableProgram
    from nexus_cache.program._catalog import ProgramEntry as ProgramEntry
    from nexus_cache.program._catalog import describe_entries as describe_entries
    from nexus_cache.program._compile import CompileInputs as CompileInputs
    from nexus_cache.program._compile import cached_compile as cached_compile
    from nexus_cache.program._demo import run_demo as run_demo
    from nexus_cache.program._identify import CACHE_KINDS as CACHE_KINDS
    from nexus_cache.program._identify import identify_cache_path as identify_cache_path
    from nexus_cache.program._interop import register_with_cuda_core as register_with_cuda_core
    from nexus_cache.program._memory import InMemoryProgramCache as InMemoryProgramCache
    from nexus_cache.program._paths import REDIS_URL_VARIABLE as REDIS_URL_VARIABLE
    from nexus_cache.program._paths import default_filestream_root as default_filestream_root
    from nexus_cache.program._paths import default_redis_url as default_redis_url
    from nexus_cache.program._paths import default_sqlite_path as default_sqlite_path
    from nexus_cache.program._redis import RedisProgramCache as RedisProgramCache
    from nexus_cache.program._resource import CacheStats as CacheStats
    from nexus_cache.program._resource import ProgramCacheResource as ProgramCacheResource
    from nexus_cache.program._sqlite import SQLiteProgramCache as SQLiteProgramCache
    from nexus_cache.program._tiered import TieredProgramCache as TieredProgramCache
    from nexus_cache.program.filestream._cache import (
        FileStreamProgramCache as FileStreamProgramCache,
    )
    from nexus_cache.program.keys._derive import make_program_cache_key as make_program_cache_key

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "CacheStats": "nexus_cache.program._resource",
    "ProgramCacheResource": "nexus_cache.program._resource",
    "InMemoryProgramCache": "nexus_cache.program._memory",
    "FileStreamProgramCache": "nexus_cache.program.filestream._cache",
    "SQLiteProgramCache": "nexus_cache.program._sqlite",
    "RedisProgramCache": "nexus_cache.program._redis",
    "TieredProgramCache": "nexus_cache.program._tiered",
    "CacheableProgram": "nexus_cache.program._cacheable",
    "CompileInputs": "nexus_cache.program._compile",
    "cached_compile": "nexus_cache.program._compile",
    "make_program_cache_key": "nexus_cache.program.keys._derive",
    "register_with_cuda_core": "nexus_cache.program._interop",
    "CACHE_KINDS": "nexus_cache.program._identify",
    "identify_cache_path": "nexus_cache.program._identify",
    "ProgramEntry": "nexus_cache.program._catalog",
    "describe_entries": "nexus_cache.program._catalog",
    "default_filestream_root": "nexus_cache.program._paths",
    "REDIS_URL_VARIABLE": "nexus_cache.program._paths",
    "default_redis_url": "nexus_cache.program._paths",
    "default_sqlite_path": "nexus_cache.program._paths",
    "run_demo": "nexus_cache.program._demo",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

# cuda.core's Program.compile(cache=...) accepts our caches once cuda.core
# loads: the one import-time effect of this package.
_activate_interop()
