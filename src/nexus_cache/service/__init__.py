"""The query service: the owner of every cache (see ``docs/service.md``).

:class:`QueryService` admits query attempts under immutable grants through the
device ledger and runs :class:`Scan`, :class:`Count` and :class:`GraphQuery`
queries through the lakehouse, decoded-source and resident-graph caches,
returning Arrow tables (or, for a scan, a :class:`DeviceQueryResult` in device
memory) with diagnostics and sealed attempt evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.service._admission_tsv import ADMISSION_COLUMNS as ADMISSION_COLUMNS
    from nexus_cache.service.config import DEFAULT_CACHE_CAP_FRACTION as DEFAULT_CACHE_CAP_FRACTION
    from nexus_cache.service.config import DeviceSettings as DeviceSettings
    from nexus_cache.service.config import ServiceConfig as ServiceConfig
    from nexus_cache.service.config import load_lakehouse_config as load_lakehouse_config
    from nexus_cache.service.config import load_lakehouse_root as load_lakehouse_root
    from nexus_cache.service.device_result import DeviceQueryResult as DeviceQueryResult
    from nexus_cache.service.evidence import EVIDENCE_FORMAT as EVIDENCE_FORMAT
    from nexus_cache.service.evidence import EvidenceReport as EvidenceReport
    from nexus_cache.service.evidence import verify_evidence as verify_evidence
    from nexus_cache.service.fingerprint import table_fingerprint as table_fingerprint
    from nexus_cache.service.queries import WEIGHTED as WEIGHTED
    from nexus_cache.service.queries import Count as Count
    from nexus_cache.service.queries import GraphQuery as GraphQuery
    from nexus_cache.service.queries import Query as Query
    from nexus_cache.service.queries import Scan as Scan
    from nexus_cache.service.queries import as_query as as_query
    from nexus_cache.service.queries import as_request as as_request
    from nexus_cache.service.queries import graph_params as graph_params
    from nexus_cache.service.result import AttemptRecord as AttemptRecord
    from nexus_cache.service.result import Diagnostics as Diagnostics
    from nexus_cache.service.result import QueryResult as QueryResult
    from nexus_cache.service.result import tables_match as tables_match
    from nexus_cache.service.service import QueryService as QueryService
    from nexus_cache.service.warmup import DeviceWarmUp as DeviceWarmUp
    from nexus_cache.service.warmup import WarmUpReport as WarmUpReport

# public name -> submodule that defines it; loaded on first access so that
# importing a light submodule (``queries``) does not load every layer
_EXPORTS: dict[str, str] = {
    "DEFAULT_CACHE_CAP_FRACTION": "nexus_cache.service.config",
    "DeviceSettings": "nexus_cache.service.config",
    "ServiceConfig": "nexus_cache.service.config",
    "load_lakehouse_config": "nexus_cache.service.config",
    "load_lakehouse_root": "nexus_cache.service.config",
    "DeviceQueryResult": "nexus_cache.service.device_result",
    "ADMISSION_COLUMNS": "nexus_cache.service._admission_tsv",
    "EVIDENCE_FORMAT": "nexus_cache.service.evidence",
    "EvidenceReport": "nexus_cache.service.evidence",
    "table_fingerprint": "nexus_cache.service.fingerprint",
    "verify_evidence": "nexus_cache.service.evidence",
    "Count": "nexus_cache.service.queries",
    "GraphQuery": "nexus_cache.service.queries",
    "Query": "nexus_cache.service.queries",
    "Scan": "nexus_cache.service.queries",
    "WEIGHTED": "nexus_cache.service.queries",
    "as_query": "nexus_cache.service.queries",
    "as_request": "nexus_cache.service.queries",
    "graph_params": "nexus_cache.service.queries",
    "AttemptRecord": "nexus_cache.service.result",
    "Diagnostics": "nexus_cache.service.result",
    "QueryResult": "nexus_cache.service.result",
    "tables_match": "nexus_cache.service.result",
    "QueryService": "nexus_cache.service.service",
    "DeviceWarmUp": "nexus_cache.service.warmup",
    "WarmUpReport": "nexus_cache.service.warmup",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
