"""Lakehouse byte cache: a local filesystem cache of remote Parquet objects.

See ``docs/lakehouse.md``. Importing this package registers the fsspec protocol
``nexus`` (``nexus::s3://bucket/key.parquet``).
"""

from __future__ import annotations

from nexus_cache.lakehouse.cache import LakehouseCache, default_cache
from nexus_cache.lakehouse.config import (
    FillPolicy,
    LakehouseCacheConfig,
    ReadPolicy,
    config_errors_from_env,
    resolve_root,
)
from nexus_cache.lakehouse.events import (
    CacheEvent,
    CacheStatus,
    EventKind,
    EventLog,
    FillMode,
    ReadDiagnostics,
    ReadMode,
)
from nexus_cache.lakehouse.fs import NexusCacheFileSystem
from nexus_cache.lakehouse.identity import ContentIdentity, SourceIdentity, StorageDomain
from nexus_cache.lakehouse.limits import FillLimits
from nexus_cache.lakehouse.maintenance import (
    EntryListing,
    LakehouseRoot,
    RetentionResult,
    RootSummary,
    VerifyResult,
)
from nexus_cache.lakehouse.reader import LakehouseFile
from nexus_cache.lakehouse.scan import ReadPlan

__all__ = [
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
    "SourceIdentity",
    "StorageDomain",
    "default_cache",
    # maintenance of a root (the CLI's API)
    "EntryListing",
    "LakehouseRoot",
    "RetentionResult",
    "RootSummary",
    "VerifyResult",
    "config_errors_from_env",
    "resolve_root",
]
