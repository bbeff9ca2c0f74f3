"""Persistent cache for compiled CUDA programs (``cuda.core`` ``Program.compile``).

Imports only the standard library; ``cuda.core`` is used when present.
"""

from __future__ import annotations

from nexus_cache.program._filestream import FileStreamProgramCache
from nexus_cache.program._memory import InMemoryProgramCache
from nexus_cache.program._resource import CacheStats, ProgramCacheResource
from nexus_cache.program._sqlite import SQLiteProgramCache

__all__ = [
    "CacheStats",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "ProgramCacheResource",
    "SQLiteProgramCache",
]
