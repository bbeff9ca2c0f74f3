"""What :meth:`QueryService.execute` returns: an Arrow table plus diagnostics."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["AttemptRecord", "Diagnostics", "QueryResult", "tables_match"]


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
    ``timings``: seconds per step and ``total_s``. ``algorithm``: a graph
    query's run facts (PageRank: ``iterations``, ``converged``, ``error``,
    the last L1 change, and ``threshold``, what it had to drop below; BFS:
    ``levels``); empty for scans and counts.
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
    algorithm: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out


@dataclasses.dataclass(frozen=True)
class QueryResult:
    """The result table and how it was produced."""

    table: pa.Table
    diagnostics: Diagnostics


# Relative tolerance per floating type, scaled by the column's largest magnitude.
_FLOAT_RTOL = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-9}


def tables_match(a: pa.Table, b: pa.Table) -> bool:
    """True when two results are the same answer.

    Schemas, row counts, nulls and every non-floating column must be identical.
    Floating columns may differ in their last bits: GPU reductions (cuSPARSE,
    CUB, atomics) do not fix the order in which they add, so two runs of one
    PageRank on one graph can differ by a few ulps. They must agree within a
    relative tolerance of the column's largest magnitude (float32: 1e-4,
    float64: 1e-9). On the host backend results are bit-identical anyway.
    """
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for left, right in zip(a.columns, b.columns, strict=True):
        if not pa.types.is_floating(left.type):
            if not left.equals(right):
                return False
            continue
        if left.null_count != right.null_count:
            return False
        x = left.to_numpy(zero_copy_only=False)
        y = right.to_numpy(zero_copy_only=False)
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return False
        finite = ~np.isnan(x)
        x, y = x[finite], y[finite]
        if x.size == 0:
            continue
        scale = float(np.max(np.abs(x))) or 1.0
        if not np.allclose(x, y, rtol=0.0, atol=_FLOAT_RTOL[x.dtype] * scale):
            return False
    return True
