"""The FileStream program cache: a directory of raw compiled binaries.

:class:`FileStreamProgramCache` (``_cache``: reads and writes) is the only
public name; the rest are its parts: the walk of ``entries/`` (``_scan``),
eviction (``_evict``, with the bounded candidate list of ``_evictq``),
``verify`` (``_verify``), the LRU stamps written off the read path
(``_stamps``), the byte counter every process shares (``_usage``) and the
memo of verified bytes (``_readmemo``). ``docs/program-cache.md`` describes
the layout and its guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.program.filestream._cache import (
        FileStreamProgramCache as FileStreamProgramCache,
    )

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "FileStreamProgramCache": "nexus_cache.program.filestream._cache",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
