"""The query service: the owner of every cache (see ``docs/service.md``).

:class:`QueryService` admits query attempts under immutable grants through the
device ledger and runs :class:`Scan`, :class:`Count` and :class:`Graph`
queries through the lakehouse, decoded-source and resident-graph caches,
returning Arrow tables with diagnostics and sealed attempt evidence.
"""

from __future__ import annotations

from nexus_cache.service.config import DEFAULT_CACHE_CAP_FRACTION, DeviceSettings, ServiceConfig
from nexus_cache.service.evidence import (
    ADMISSION_COLUMNS,
    EVIDENCE_FORMAT,
    EvidenceReport,
    table_fingerprint,
    verify_evidence,
)
from nexus_cache.service.queries import (
    ALGORITHMS,
    Count,
    Graph,
    Query,
    Scan,
    query_from_dict,
    query_from_json,
)
from nexus_cache.service.result import AttemptRecord, Diagnostics, QueryResult
from nexus_cache.service.service import QueryService

__all__ = [
    "ADMISSION_COLUMNS",
    "ALGORITHMS",
    "DEFAULT_CACHE_CAP_FRACTION",
    "EVIDENCE_FORMAT",
    "AttemptRecord",
    "Count",
    "DeviceSettings",
    "Diagnostics",
    "EvidenceReport",
    "Graph",
    "Query",
    "QueryResult",
    "QueryService",
    "Scan",
    "ServiceConfig",
    "query_from_dict",
    "query_from_json",
    "table_fingerprint",
    "verify_evidence",
]
