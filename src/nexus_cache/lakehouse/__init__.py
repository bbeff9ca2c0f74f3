"""Lakehouse byte cache: a local filesystem cache of remote Parquet objects.

See ``docs/lakehouse.md``. Importing this package registers the fsspec protocol
``nexus`` (``nexus::s3://bucket/key.parquet``). Everything a user may import is
exported here, each name loading its module on first access; the underscored
modules are internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.lakehouse._cache import LakehouseCache as LakehouseCache
    from nexus_cache.lakehouse._cache import default_cache as default_cache
    from nexus_cache.lakehouse._config import ENV_BYPASS_BYTES as ENV_BYPASS_BYTES
    from nexus_cache.lakehouse._config import ENV_FILL_EXIT_WAIT_S as ENV_FILL_EXIT_WAIT_S
    from nexus_cache.lakehouse._config import ENV_FILL_MAX_CONCURRENCY as ENV_FILL_MAX_CONCURRENCY
    from nexus_cache.lakehouse._config import ENV_FILL_MAX_HOST_BYTES as ENV_FILL_MAX_HOST_BYTES
    from nexus_cache.lakehouse._config import ENV_IDENTITY_TTL as ENV_IDENTITY_TTL
    from nexus_cache.lakehouse._config import ENV_LOG_READS as ENV_LOG_READS
    from nexus_cache.lakehouse._config import ENV_MAX_BYTES as ENV_MAX_BYTES
    from nexus_cache.lakehouse._config import ENV_POLICY as ENV_POLICY
    from nexus_cache.lakehouse._config import ENV_READ as ENV_READ
    from nexus_cache.lakehouse._config import ENV_ROOT as ENV_ROOT
    from nexus_cache.lakehouse._config import VARIABLES as VARIABLES
    from nexus_cache.lakehouse._config import FillPolicy as FillPolicy
    from nexus_cache.lakehouse._config import LakehouseCacheConfig as LakehouseCacheConfig
    from nexus_cache.lakehouse._config import ReadPolicy as ReadPolicy
    from nexus_cache.lakehouse._config import config_errors_from_env as config_errors_from_env
    from nexus_cache.lakehouse._config import resolve_root as resolve_root
    from nexus_cache.lakehouse._events import CacheEvent as CacheEvent
    from nexus_cache.lakehouse._events import EventKind as EventKind
    from nexus_cache.lakehouse._events import EventLog as EventLog
    from nexus_cache.lakehouse._events import ReadDiagnostics as ReadDiagnostics
    from nexus_cache.lakehouse._fs import NexusCacheFileSystem as NexusCacheFileSystem
    from nexus_cache.lakehouse._reader import LakehouseFile as LakehouseFile
    from nexus_cache.lakehouse._readlog import read_stats as read_stats
    from nexus_cache.lakehouse._scan import ReadPlan as ReadPlan
    from nexus_cache.lakehouse._scan import resolve_source as resolve_source
    from nexus_cache.lakehouse._vocabulary import CacheStatus as CacheStatus
    from nexus_cache.lakehouse._vocabulary import FillMode as FillMode
    from nexus_cache.lakehouse._vocabulary import ReadMode as ReadMode
    from nexus_cache.lakehouse.fill._limits import FillLimits as FillLimits
    from nexus_cache.lakehouse.identity._identity import ContentIdentity as ContentIdentity
    from nexus_cache.lakehouse.identity._identity import SourceIdentity as SourceIdentity
    from nexus_cache.lakehouse.identity._identity import StorageDomain as StorageDomain
    from nexus_cache.lakehouse.store._maintenance import EntryListing as EntryListing
    from nexus_cache.lakehouse.store._maintenance import LakehouseRoot as LakehouseRoot
    from nexus_cache.lakehouse.store._maintenance import RetentionResult as RetentionResult
    from nexus_cache.lakehouse.store._maintenance import RootSummary as RootSummary
    from nexus_cache.lakehouse.store._maintenance import VerifyResult as VerifyResult

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "LakehouseCache": "nexus_cache.lakehouse._cache",
    "default_cache": "nexus_cache.lakehouse._cache",
    "ENV_BYPASS_BYTES": "nexus_cache.lakehouse._config",
    "ENV_FILL_EXIT_WAIT_S": "nexus_cache.lakehouse._config",
    "ENV_FILL_MAX_CONCURRENCY": "nexus_cache.lakehouse._config",
    "ENV_FILL_MAX_HOST_BYTES": "nexus_cache.lakehouse._config",
    "ENV_IDENTITY_TTL": "nexus_cache.lakehouse._config",
    "ENV_LOG_READS": "nexus_cache.lakehouse._config",
    "ENV_MAX_BYTES": "nexus_cache.lakehouse._config",
    "ENV_POLICY": "nexus_cache.lakehouse._config",
    "ENV_READ": "nexus_cache.lakehouse._config",
    "ENV_ROOT": "nexus_cache.lakehouse._config",
    "VARIABLES": "nexus_cache.lakehouse._config",
    "FillPolicy": "nexus_cache.lakehouse._config",
    "LakehouseCacheConfig": "nexus_cache.lakehouse._config",
    "ReadPolicy": "nexus_cache.lakehouse._config",
    "config_errors_from_env": "nexus_cache.lakehouse._config",
    "resolve_root": "nexus_cache.lakehouse._config",
    "CacheEvent": "nexus_cache.lakehouse._events",
    "EventKind": "nexus_cache.lakehouse._events",
    "EventLog": "nexus_cache.lakehouse._events",
    "ReadDiagnostics": "nexus_cache.lakehouse._events",
    "NexusCacheFileSystem": "nexus_cache.lakehouse._fs",
    "ContentIdentity": "nexus_cache.lakehouse.identity._identity",
    "SourceIdentity": "nexus_cache.lakehouse.identity._identity",
    "StorageDomain": "nexus_cache.lakehouse.identity._identity",
    "FillLimits": "nexus_cache.lakehouse.fill._limits",
    "EntryListing": "nexus_cache.lakehouse.store._maintenance",
    "LakehouseRoot": "nexus_cache.lakehouse.store._maintenance",
    "RetentionResult": "nexus_cache.lakehouse.store._maintenance",
    "RootSummary": "nexus_cache.lakehouse.store._maintenance",
    "VerifyResult": "nexus_cache.lakehouse.store._maintenance",
    "LakehouseFile": "nexus_cache.lakehouse._reader",
    "read_stats": "nexus_cache.lakehouse._readlog",
    "ReadPlan": "nexus_cache.lakehouse._scan",
    "resolve_source": "nexus_cache.lakehouse._scan",
    "CacheStatus": "nexus_cache.lakehouse._vocabulary",
    "FillMode": "nexus_cache.lakehouse._vocabulary",
    "ReadMode": "nexus_cache.lakehouse._vocabulary",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

# Importing ``_fs`` registers the ``nexus`` protocol with fsspec: the one
# import-time effect of this package.
from nexus_cache.lakehouse._fs import NexusCacheFileSystem as _registered  # noqa: E402, F401
