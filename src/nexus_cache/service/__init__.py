"""The query service: the owner of every cache (see ``docs/service.md``).

:class:`QueryService` admits query attempts under immutable grants through the
device ledger and runs :class:`Scan`, :class:`Count` and :class:`Graph`
queries through the lakehouse, decoded-source and resident-graph caches,
returning Arrow tables with diagnostics and sealed attempt evidence.
"""

from __future__ import annotations

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
    "Graph": "queries",
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


__getattr__, __dir__ = lazy_exports(
    __name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}, globals()
)
