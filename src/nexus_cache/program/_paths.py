"""Default on-disk locations of the persistent program caches."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_filestream_root", "default_sqlite_path"]


def _cache_home() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    return Path.home() / ".cache"


def default_filestream_root() -> Path:
    """``$NEXUS_PROGRAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/nexus-cache/program-cache``."""
    # A blank value counts as unset (docs/configuration.md): Path("  ") would
    # be a directory named by two spaces in the working directory.
    env = os.environ.get("NEXUS_PROGRAM_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    return _cache_home() / "nexus-cache" / "program-cache"


def default_sqlite_path() -> Path:
    """``$NEXUS_PROGRAM_CACHE_DB``, else ``$XDG_CACHE_HOME/nexus-cache/program-cache.sqlite``."""
    env = os.environ.get("NEXUS_PROGRAM_CACHE_DB", "").strip()
    if env:
        return Path(env).expanduser()
    return _cache_home() / "nexus-cache" / "program-cache.sqlite"
