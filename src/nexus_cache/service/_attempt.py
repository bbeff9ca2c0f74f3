"""One attempt: plan a query, then run it under an admitted grant.

A plan is made fresh for every attempt (lakehouse plans, cache keys, the grant
to ask for), so a retry after a stale plan or an exhausted grant never reuses
what went wrong. Running charges what the attempt materializes to an
:class:`AttemptBudget`; going past the grant raises
:class:`GrantExhaustedError`, which the service retries with a larger grant.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.backends import AllocationDomain
from nexus_cache.device import Grant
from nexus_cache.errors import GrantExhaustedError
from nexus_cache.graph.memory import build_bytes, result_bytes
from nexus_cache.lakehouse import LakehouseCache, ReadDiagnostics, ReadPlan
from nexus_cache.service._graph_port import (
    NOT_APPLICABLE,
    GraphOutcome,
    GraphPort,
    graph_options,
)
from nexus_cache.service._lake import (
    SourcePlan,
    count_rows,
    decode_object,
    lakehouse_summary,
    plan_source,
)
from nexus_cache.service._source_port import BYPASS_COUNT, SourceLoad, SourceOutcome, SourcePort
from nexus_cache.service.queries import Count, GraphQuery, Query, Scan

__all__ = ["AttemptBudget", "AttemptOutcome", "AttemptPlan", "plan_attempt", "run_attempt"]

# A graph attempt holds the edge table plus the CSR, its transpose or
# symmetrized copy, and the algorithm's vectors: about twice a scan's bytes.
_GRAPH_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class AttemptPlan:
    """What one attempt will do: the query, its lakehouse plans and its grant size."""

    query: Query
    source: SourcePlan
    grant_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query.to_dict(),
            "source": self.source.to_dict(),
            "grant_bytes": self.grant_bytes,
        }


def _scan_of(query: Query) -> Scan | Count:
    return query.edges if isinstance(query, GraphQuery) else query


def plan_attempt(
    cache: LakehouseCache,
    query: Query,
    *,
    expansion: float,
    min_grant: int,
    floor: int = 0,
    storage_options: dict[str, Any] | None = None,
) -> AttemptPlan:
    """Plan ``query`` now; the grant is the decoded-size estimate, at least ``floor``."""
    source = plan_source(cache, _scan_of(query).source, storage_options)
    if isinstance(query, Count):
        estimate = min_grant
    elif isinstance(query, GraphQuery):
        estimate = _graph_estimate(query, source, expansion)
    else:
        estimate = math.ceil(source.total_bytes * expansion)
    return AttemptPlan(query, source, max(estimate, min_grant, floor))


@dataclasses.dataclass(frozen=True)
class _EdgeFacts:
    """What the edge objects' Parquet footers say: rows, columns, the id range."""

    rows: int
    columns: int
    #: max - min + 1 over both id columns (None: no statistics to bound it)
    id_span: int | None


def _graph_estimate(query: GraphQuery, source: SourcePlan, expansion: float) -> int:
    """The decoded edges, the uncached build and the result, from the footers' edge
    count; without footers, a multiple of the Parquet bytes.

    The uncached path charges about 72 B per edge for the build alone, more
    than any multiple of well-compressed ids: a grant sized from the bytes
    ran the whole query, ran out, and ran it again.
    """
    options = graph_options(query)
    weighted = query.weight is not None
    facts = _edge_facts(source, query.src, query.dst)
    if facts is None:
        return math.ceil(source.total_bytes * expansion * _GRAPH_FACTOR) + build_bytes(
            0, options, weighted
        )
    columns = len(query.edges.columns) if query.edges.columns is not None else facts.columns
    # ids and weights decode to at most 8 B a value; other columns: the bytes' share
    decoded = max(math.ceil(source.total_bytes * expansion), facts.rows * 8 * columns)
    vertices = 2 * facts.rows if facts.id_span is None else min(2 * facts.rows, facts.id_span)
    return (
        decoded
        + build_bytes(facts.rows, options, weighted)
        + result_bytes(query.algorithm, facts.rows, vertices)
    )


def _edge_facts(source: SourcePlan, src: str, dst: str) -> _EdgeFacts | None:
    """Rows, columns and id range of the source's objects from their footers; None
    when one cannot be read (the attempt then reports what is wrong with it)."""
    rows, columns = 0, 0
    low: int | None = None
    high: int | None = None
    spanned = True
    for plan in source.plans:
        try:
            meta = _footer(plan.fs, plan.path)
        except (OSError, ValueError, pa.ArrowException):
            return None
        if meta is None:
            return None
        rows += meta.num_rows
        columns = max(columns, meta.num_columns)
        names = [meta.schema.column(j).path for j in range(meta.num_columns)]
        if src not in names or dst not in names:
            spanned = False
            continue
        for group in range(meta.num_row_groups):
            for name in (src, dst):
                stats = meta.row_group(group).column(names.index(name)).statistics
                if stats is None or not stats.has_min_max:
                    spanned = False
                    continue
                lo, hi = stats.min, stats.max
                if not (isinstance(lo, int) and isinstance(hi, int)):
                    spanned = False
                    continue
                low = lo if low is None else min(low, lo)
                high = hi if high is None else max(high, hi)
    span = high - low + 1 if spanned and low is not None and high is not None else None
    return _EdgeFacts(rows, columns, span)


def _footer(fs: Any, path: str) -> pq.FileMetaData | None:
    """The Parquet footer of one object; None for anything but a regular local file
    (a FIFO would block the read)."""
    if fs is None:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return pq.read_metadata(path)
    with fs.open(path, "rb") as handle:
        return pq.ParquetFile(handle).metadata


class AttemptBudget:
    """The bytes an attempt materialized, checked against its immutable grant."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.used = 0
        self.peak_step: str | None = None

    def charge(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.grant.nbytes:
            exc = GrantExhaustedError(
                f"attempt {self.grant.attempt_id} needed {self.used} B after {what}, over its "
                f"grant of {self.grant.nbytes} B on device {self.grant.device_id}; "
                "it is retried with a larger grant (raise NEXUS_SERVICE_GRANT_EXPANSION "
                "to ask for more up front)"
            )
            exc.needed_bytes = self.used  # type: ignore[attr-defined]
            raise exc


@dataclasses.dataclass
class AttemptOutcome:
    """What one attempt produced and how every cache answered."""

    table: pa.Table | None = None
    reads: list[ReadDiagnostics] = dataclasses.field(default_factory=list)
    source: SourceOutcome | None = None
    graph: GraphOutcome | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    used_bytes: int = 0

    def statuses(self, plan: AttemptPlan) -> dict[str, Any]:
        return {
            "lakehouse": lakehouse_summary(self.reads, plan.source),
            "source_cache": None if self.source is None else self.source.to_dict(),
            "graph_cache": None if self.graph is None else self.graph.to_dict(),
        }


def run_attempt(
    plan: AttemptPlan,
    grant: Grant,
    domain: AllocationDomain,
    cache: LakehouseCache,
    sources: SourcePort,
    graphs: GraphPort,
    outcome: AttemptOutcome,
) -> pa.Table:
    """Run ``plan`` under ``grant`` with device work in ``domain`` (the attempt's),
    filling ``outcome`` as it goes (also on failure). Every frame and pin the
    attempt took is released before this returns."""
    budget = AttemptBudget(grant)
    query = plan.query
    timings = outcome.timings
    load = SourceLoad()
    try:
        if isinstance(query, Count):
            t0 = time.perf_counter()
            rows = count_rows(cache, plan.source, outcome.reads)
            timings["read_s"] = time.perf_counter() - t0
            outcome.source, outcome.graph = BYPASS_COUNT, NOT_APPLICABLE
            table = pa.table({"rows": pa.array([rows], pa.int64())})
            budget.charge(table.nbytes, "the count")
            outcome.table = table
            return table
        scan = _scan_of(query)
        assert isinstance(scan, Scan)

        decoded = [0]

        def decode(read_plan: ReadPlan) -> Any:
            t = time.perf_counter()
            frame = decode_object(cache, read_plan, scan.columns, domain, outcome.reads)
            timings["read_decode_s"] = timings.get("read_decode_s", 0.0) + time.perf_counter() - t
            decoded[0] += int(frame.nbytes)
            try:
                budget.charge(int(frame.nbytes), "decoding the scan")
            except BaseException:
                frame.release()  # the traceback must not keep device memory alive
                raise
            return frame

        t0 = time.perf_counter()
        try:
            sources.load(
                grant.device_id, plan.source, scan.columns, scan.batch_rows, domain, decode, load
            )
        finally:
            outcome.source = load.outcome
        timings["source_s"] = time.perf_counter() - t0
        budget.charge(load.nbytes - decoded[0], "copying cached frames")
        if isinstance(query, Scan):
            outcome.graph = NOT_APPLICABLE
            t0 = time.perf_counter()
            table = load.table(detach=domain.host_memory)
            timings["to_arrow_s"] = time.perf_counter() - t0
            budget.charge(table.nbytes, "the result table")
            outcome.table = table
            return table
        t0 = time.perf_counter()
        result, outcome.graph, graph_bytes = graphs.run(
            grant.device_id,
            query,
            load.frames,
            plan.source.identity_keys,
            domain,
            objects=[p.source for p in plan.source.plans],
        )
        if outcome.graph.reason == "unstable_source" and plan.source.identity_problems:
            # say why the edge objects have no identity, and what to change
            outcome.graph = dataclasses.replace(
                outcome.graph, reason=f"unstable_source: {plan.source.identity_problems}"
            )
        timings["graph_s"] = time.perf_counter() - t0
        budget.charge(graph_bytes + result.nbytes, "the graph build and algorithm")
        outcome.table = result
        return result
    finally:
        load.release()
        outcome.used_bytes = budget.used
