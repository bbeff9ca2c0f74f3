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
    config_errors_from_env,
    resolve_root,
)
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog, ReadDiagnostics
from nexus_cache.lakehouse._fs import NexusCacheFileSystem
from nexus_cache.lakehouse._identity import ContentIdentity, SourceIdentity, StorageDomain
from nexus_cache.lakehouse._limits import FillLimits
from nexus_cache.lakehouse._maintenance import (
    EntryListing,
    LakehouseRoot,
    RetentionResult,
    RootSummary,
    VerifyResult,
)
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse._readlog import read_stats
from nexus_cache.lakehouse._scan import ReadPlan, resolve_source
from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode

# Transitional: installs made before the fsspec entry point moved to this
# package name ``nexus_cache.lakehouse.fs``. An alias, not a file, so that no
# public-looking module exists; removed once those installs are redone.
sys.modules.setdefault(f"{__name__}.fs", importlib.import_module(f"{__name__}._fs"))

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
    "resolve_source",
    # maintenance of a root (the CLI's API)
    "EntryListing",
    "LakehouseRoot",
    "RootSummary",
    "VerifyResult",
    "config_errors_from_env",
    "resolve_root",
]
