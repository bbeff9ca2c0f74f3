"""Lakehouse byte cache: a local filesystem cache of remote Parquet objects.

See ``docs/lakehouse.md``. Importing this package registers the fsspec protocol
``nexus`` (``nexus::s3://bucket/key.parquet``). Everything a user may import is
exported here; the underscored modules are internal.
"""

from __future__ import annotations

import importlib
import sys

from nexus_cache.lakehouse._cache import LakehouseCache, default_cache
from nexus_cache.lakehouse._config import (
    ENV_BYPASS_BYTES,
    ENV_FILL_EXIT_WAIT_S,
    ENV_FILL_MAX_CONCURRENCY,
    ENV_FILL_MAX_HOST_BYTES,
    ENV_IDENTITY_TTL,
    ENV_LOG_READS,
    ENV_MAX_BYTES,
    ENV_POLICY,
    ENV_READ,
    ENV_ROOT,
    FillPolicy,
    LakehouseCacheConfig,
    ReadPolicy,
)
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog, ReadDiagnostics
from nexus_cache.lakehouse._fs import NexusCacheFileSystem
from nexus_cache.lakehouse._identity import ContentIdentity, SourceIdentity, StorageDomain
from nexus_cache.lakehouse._limits import FillLimits
from nexus_cache.lakehouse._maintenance import RetentionResult
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse._readlog import read_stats
from nexus_cache.lakehouse._scan import ReadPlan
from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode

# Transitional: the command line still imports three internal
# modules by their former names, and installs made before the fsspec entry point
# moved to this package name ``nexus_cache.lakehouse.fs``. Aliases, not files, so
# that no public-looking module exists; removed once those callers (and
# reinstalls) use the names exported here.
for _old in ("config", "fs", "maintenance", "store"):
    sys.modules.setdefault(f"{__name__}.{_old}", importlib.import_module(f"{__name__}._{_old}"))
del _old

__all__ = [
    "ENV_BYPASS_BYTES",
    "ENV_FILL_EXIT_WAIT_S",
    "ENV_FILL_MAX_CONCURRENCY",
    "ENV_FILL_MAX_HOST_BYTES",
    "ENV_IDENTITY_TTL",
    "ENV_LOG_READS",
    "ENV_MAX_BYTES",
    "ENV_POLICY",
    "ENV_READ",
    "ENV_ROOT",
    "CacheEvent",
    "CacheStatus",
    "ContentIdentity",
    "EventKind",
    "EventLog",
    "FillLimits",
    "FillMode",
    "FillPolicy",
    "LakehouseCache",
    "LakehouseCacheConfig",
    "LakehouseFile",
    "NexusCacheFileSystem",
    "ReadDiagnostics",
    "ReadMode",
    "ReadPlan",
    "ReadPolicy",
    "RetentionResult",
    "SourceIdentity",
    "StorageDomain",
    "default_cache",
    "read_stats",
]
