"""Persistent cache for compiled CUDA programs (``cuda.core`` ``Program.compile``).

Imports only the standard library; ``cuda.core`` is used when present.
"""

from __future__ import annotations

from nexus_cache.program._resource import CacheStats, ProgramCacheResource

__all__ = ["CacheStats", "ProgramCacheResource"]
