"""Default on-disk locations of the persistent program caches."""

from __future__ import annotations

import os
from pathlib import Path

from nexus_cache._env import Variable, read

__all__ = [
    "REDIS_URL_VARIABLE",
    "VARIABLES",
    "default_filestream_root",
    "default_redis_url",
    "default_sqlite_path",
]

_DIR = Variable(
    "NEXUS_PROGRAM_CACHE_DIR",
    "path",
    "Directory of `FileStreamProgramCache()` when no path is given",
    unset="`$XDG_CACHE_HOME/nexus-cache/program-cache`",
)
_DB = Variable(
    "NEXUS_PROGRAM_CACHE_DB",
    "path",
    "Database file of `SQLiteProgramCache()` when no path is given",
    unset="`$XDG_CACHE_HOME/nexus-cache/program-cache.sqlite`",
)
REDIS_URL_VARIABLE = Variable(
    "NEXUS_PROGRAM_CACHE_REDIS_URL",
    "str",
    "Redis server whose program cache every worker of a Dask cluster shares",
    unset="unset (no Redis tier)",
)
# Not ours, but read here: the base of both default paths.
_XDG_CACHE_HOME = Variable(
    "XDG_CACHE_HOME",
    "str",
    "Base of both defaults above.",
    unset="`~/.cache`",
)
#: the variables of the program caches (the Redis URL is read by the cluster client)
VARIABLES = (_DIR, _DB, REDIS_URL_VARIABLE, _XDG_CACHE_HOME)


def _cache_home() -> Path:
    xdg = read(_XDG_CACHE_HOME)
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    return Path.home() / ".cache"


def default_filestream_root() -> Path:
    """``$NEXUS_PROGRAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/nexus-cache/program-cache``."""
    path: Path | None = read(_DIR)
    return path if path is not None else _cache_home() / "nexus-cache" / "program-cache"


def default_sqlite_path() -> Path:
    """``$NEXUS_PROGRAM_CACHE_DB``, else ``$XDG_CACHE_HOME/nexus-cache/program-cache.sqlite``."""
    path: Path | None = read(_DB)
    return path if path is not None else _cache_home() / "nexus-cache" / "program-cache.sqlite"


def default_redis_url() -> str | None:
    """``$NEXUS_PROGRAM_CACHE_REDIS_URL``, else None (no Redis tier)."""
    url: str | None = read(REDIS_URL_VARIABLE)
    return url
