"""Factories for the three backends, shared by the program-cache tests."""

from __future__ import annotations

from nexus_cache.program import FileStreamProgramCache, InMemoryProgramCache, SQLiteProgramCache

BACKENDS = ("memory", "filestream", "sqlite")
PERSISTENT = ("filestream", "sqlite")


def open_cache(kind: str, base: str, **caps: int | None):  # type: ignore[no-untyped-def]
    if kind == "memory":
        return InMemoryProgramCache(**caps)
    if kind == "filestream":
        return FileStreamProgramCache(f"{base}/fs", **caps)
    if kind == "sqlite":
        return SQLiteProgramCache(f"{base}/cache.sqlite", **caps)
    raise ValueError(kind)
