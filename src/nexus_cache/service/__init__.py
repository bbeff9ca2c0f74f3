"""The query service: the owner of every cache (see ``docs/service.md``).

:class:`QueryService` admits query attempts under immutable grants through the
device ledger and runs :class:`Scan`, :class:`Count` and :class:`GraphQuery`
queries through the lakehouse, decoded-source and resident-graph caches,
returning Arrow tables with diagnostics and sealed attempt evidence.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from nexus_cache._lazy import lazy_exports

# public name -> submodule that defines it; loaded on first access so that
# importing a light submodule (``queries``) does not load every layer
_EXPORTS: dict[str, str] = {
    "DEFAULT_CACHE_CAP_FRACTION": "config",
    "DeviceSettings": "config",
    "ServiceConfig": "config",
    "load_lakehouse_config": "config",
    "load_lakehouse_root": "config",
    "ADMISSION_COLUMNS": "evidence",
    "EVIDENCE_FORMAT": "evidence",
    "EvidenceReport": "evidence",
    "table_fingerprint": "evidence",
    "verify_evidence": "evidence",
    "ALGORITHMS": "queries",
    "Count": "queries",
    "GraphQuery": "queries",
    "Query": "queries",
    "Scan": "queries",
    "WEIGHTED": "queries",
    "graph_params": "queries",
    "query_from_dict": "queries",
    "query_from_json": "queries",
    "AttemptRecord": "result",
    "Diagnostics": "result",
    "QueryResult": "result",
    "tables_match": "result",
    "QueryService": "service",
    "DeviceWarmUp": "warmup",
    "WarmUpReport": "warmup",
}

__all__ = sorted(_EXPORTS)


_lazy_getattr, __dir__ = lazy_exports(
    __name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}, globals()
)
# Deprecated names -> their new names. Never cached in the namespace, so each
# access passes here; each name warns once per process.
_DEPRECATED = {"Graph": "GraphQuery"}
_warned: set[str] = set()
_warned_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    new = _DEPRECATED.get(name)
    if new is None:
        return _lazy_getattr(name)
    with _warned_lock:
        first = name not in _warned
        _warned.add(name)
    if first:
        warnings.warn(
            f"nexus_cache.service.{name} is deprecated; use nexus_cache.service.{new} "
            "(the same class, renamed)",
            DeprecationWarning,
            stacklevel=2,
        )
    return _lazy_getattr(new)
