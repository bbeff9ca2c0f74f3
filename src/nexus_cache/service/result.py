"""What :meth:`QueryService.execute` returns: an Arrow table plus diagnostics."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

__all__ = ["AttemptRecord", "Diagnostics", "QueryResult"]


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a query: its grant, how it ended, its sealed evidence digest."""

    attempt_id: str
    device_id: int | None
    grant_bytes: int
    used_bytes: int
    outcome: str  # ok | retried | refused | failed
    error: str | None
    evidence_digest: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Diagnostics:
    """How a query ran, taken from its last attempt (``attempts`` lists them all).

    ``lakehouse``: ``status`` (hit, miss, bypass, stale, or ``mixed(...)`` over
    several objects), ``read_mode``, ``fill_mode``, ``objects`` and ``read``
    (False when the source cache served the scan, so no byte was read).
    ``source_cache`` and ``graph_cache``: ``status`` and ``reason``.
    ``timings``: seconds per step and ``total_s``.
    """

    query_id: str
    query: dict[str, Any]
    device_id: int
    attempts: tuple[AttemptRecord, ...]
    lakehouse: dict[str, Any]
    source_cache: dict[str, Any]
    graph_cache: dict[str, Any]
    timings: dict[str, float]
    rows: int
    result_fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out


@dataclasses.dataclass(frozen=True)
class QueryResult:
    """The result table and how it was produced."""

    table: pa.Table
    diagnostics: Diagnostics
