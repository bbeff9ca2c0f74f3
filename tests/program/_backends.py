"""Factories for the program cache backends, shared by the program-cache tests."""

from __future__ import annotations

import os

from nexus_cache.program import FileStreamProgramCache, InMemoryProgramCache, SQLiteProgramCache

BACKENDS = ("memory", "filestream", "sqlite", "redis", "tiered")
PERSISTENT = ("filestream", "sqlite")
#: backends that several processes share (the multi-process tests)
SHARED = ("filestream", "sqlite", "redis")
#: backends on the test Redis server (its URL is in REDIS_URL_ENV, set by a fixture)
ON_REDIS = ("redis", "tiered")
REDIS_URL_ENV = "NEXUS_TEST_REDIS_URL"


def open_cache(kind: str, base: str, **caps: int | None):  # type: ignore[no-untyped-def]
    if kind == "memory":
        return InMemoryProgramCache(**caps)
    if kind == "filestream":
        return FileStreamProgramCache(f"{base}/fs", **caps)
    if kind == "sqlite":
        return SQLiteProgramCache(f"{base}/cache.sqlite", **caps)
    if kind == "redis":
        from nexus_cache.program import RedisProgramCache

        # One namespace per test directory: tests never see each other's keys.
        return RedisProgramCache(os.environ[REDIS_URL_ENV], namespace=f"test:{base}", **caps)
    if kind == "tiered":
        from nexus_cache.program import RedisProgramCache, TieredProgramCache

        return TieredProgramCache(
            [
                InMemoryProgramCache(**caps),
                FileStreamProgramCache(f"{base}/tiered-fs", **caps),
                RedisProgramCache(
                    os.environ[REDIS_URL_ENV], namespace=f"test-tiered:{base}", **caps
                ),
            ]
        )
    raise ValueError(kind)
