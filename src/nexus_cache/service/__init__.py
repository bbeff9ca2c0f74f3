"""The query service: the owner of every cache (see ``docs/service.md``).

:class:`QueryService` admits query attempts under immutable grants through the
device ledger and runs :class:`Scan`, :class:`Count` and :class:`Graph`
queries through the lakehouse, decoded-source and resident-graph caches,
returning Arrow tables with diagnostics and sealed attempt evidence.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> submodule that defines it; loaded on first access so that
# importing a light submodule (``queries``) does not load every layer
_EXPORTS: dict[str, str] = {
    "DEFAULT_CACHE_CAP_FRACTION": "config",
    "DeviceSettings": "config",
    "ServiceConfig": "config",
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
    "query_from_dict": "queries",
    "query_from_json": "queries",
    "AttemptRecord": "result",
    "Diagnostics": "result",
    "QueryResult": "result",
    "tables_match": "result",
    "QueryService": "service",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
