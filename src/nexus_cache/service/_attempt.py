"""One attempt: plan a query, then run it under an admitted grant.

A plan is made fresh for every attempt (lakehouse plans, cache keys, the grant
to ask for), so a retry after a stale plan or an exhausted grant never reuses
what went wrong. Running charges what the attempt materializes to an
:class:`AttemptBudget`; going past the grant raises
:class:`GrantExhaustedError`, which the service retries with a larger grant.

A scan run with ``device_result`` returns its result as a
:class:`~nexus_cache.frames.DeviceFrame` of the attempt's domain instead of a
host table: built by the same one-pass gather (or copied from the attempt's
own frames where the gather does not apply), sharing no buffer with a cache
entry, and released by the caller.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache.backends import AllocationDomain
from nexus_cache.device import Grant
from nexus_cache.errors import GrantExhaustedError
from nexus_cache.frames import DeviceFrame
from nexus_cache.frames.gather import gather_table, gatherable
from nexus_cache.graph.stopping import stop_check
from nexus_cache.lakehouse import LakehouseCache, ReadDiagnostics, ReadPlan
from nexus_cache.service._graph_port import (
    NOT_APPLICABLE,
    GraphOutcome,
    GraphPort,
)
from nexus_cache.service._lake import (
    OpenedObject,
    SourcePlan,
    count_rows,
    decode_object,
    lakehouse_summary,
    plan_source,
)
from nexus_cache.service._source_port import BYPASS_COUNT, SourceLoad, SourceOutcome, SourcePort
from nexus_cache.service._table_filter import (
    FilterCounts,
    count_table,
    filter_frames,
    scan_table,
)
from nexus_cache.service._table_scan import (
    RowGroupChoice,
    TableRead,
    choose_row_groups,
    decode_table_object,
    is_table_read,
    needs_no_mask,
    plan_table,
)
from nexus_cache.service.admission import Attempt, estimate_grant
from nexus_cache.service.queries import Count, GraphQuery, Query, Scan

__all__ = [
    "AttemptBudget",
    "AttemptOutcome",
    "AttemptPlan",
    "AttemptPorts",
    "plan_attempt",
    "run_attempt",
]


@dataclasses.dataclass(frozen=True)
class AttemptPlan:
    """What one attempt will do: the query, its lakehouse plans and its grant size."""

    query: Query
    source: SourcePlan
    grant_bytes: int

    def to_dict(self, *, query: bool = True) -> dict[str, Any]:
        """The plan as JSON values; without ``query``, less the query's dict (a
        caller that holds it adds it)."""
        out: dict[str, Any] = {"query": self.query.to_dict()} if query else {}
        out["source"] = self.source.to_dict()
        out["grant_bytes"] = self.grant_bytes
        return out


def plan_attempt(
    cache: LakehouseCache,
    query: Query,
    *,
    expansion: float,
    min_grant: int,
    floor: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    allowed_roots: Sequence[str] | None = None,
) -> AttemptPlan:
    """Plan ``query`` now; the grant is admission's estimate
    (:func:`~nexus_cache.service.admission.estimate_grant`), at least ``floor``.
    With ``allowed_roots``, the source and every object it lists (every data file of a
    table's snapshot) must lie under one."""
    scan = query.scan
    if is_table_read(scan, storage_options):
        source = plan_table(cache, scan, storage_options, allowed_roots)
    else:
        source = plan_source(cache, scan.source, storage_options, allowed_roots)
    nbytes = estimate_grant(query, source, expansion=expansion, min_grant=min_grant, floor=floor)
    return AttemptPlan(query, source, nbytes)


@dataclasses.dataclass(frozen=True)
class AttemptPorts:
    """What an attempt runs through: the lakehouse cache and the device caches' ports."""

    lakehouse: LakehouseCache
    sources: SourcePort
    graphs: GraphPort


class AttemptBudget:
    """The bytes an attempt materialized, checked against its immutable grant."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.used = 0
        self.peak_step: str | None = None

    def charge(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.grant.nbytes:
            raise GrantExhaustedError(
                f"attempt {self.grant.attempt_id} needed {self.used} B after {what}, over its "
                f"grant of {self.grant.nbytes} B on device {self.grant.device_id}; "
                "it is retried with a larger grant (raise NEXUS_SERVICE_GRANT_EXPANSION "
                "to ask for more up front)",
                needed_bytes=self.used,
            )


@dataclasses.dataclass
class AttemptOutcome:
    """What one attempt produced and how every cache answered."""

    table: pa.Table | None = None
    reads: list[ReadDiagnostics] = dataclasses.field(default_factory=list)
    source: SourceOutcome | None = None
    graph: GraphOutcome | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    used_bytes: int = 0
    #: rows before and after a table read's filter (None: no table read)
    rows: FilterCounts | None = None
    #: a table read's objects: the row groups each frame holds, and what the
    #: footer's statistics pruned (and proved wholly kept) where it was read
    #: (None: no table read)
    entries: list[dict[str, Any]] | None = None

    def statuses(self, plan: AttemptPlan) -> dict[str, Any]:
        return {
            "lakehouse": lakehouse_summary(self.reads, plan.source),
            "source_cache": None if self.source is None else self.source.to_dict(),
            "graph_cache": None if self.graph is None else self.graph.to_dict(),
            "table": self.table_summary(plan),
        }

    def table_summary(self, plan: AttemptPlan) -> dict[str, Any] | None:
        """A table read's snapshot, canonical filter and pruning counts, and the rows
        before and after its filter (None: not a table read)."""
        read = plan.source.table
        if read is None:
            return None
        rows = self.rows
        entries = self.entries or []
        return {
            **read.to_dict(),
            "row_groups_total": sum(e["row_groups_total"] or 0 for e in entries),
            "row_groups_pruned": sum(e["row_groups_pruned"] or 0 for e in entries),
            "row_groups_all_true": sum(e["row_groups_all_true"] or 0 for e in entries),
            "objects_mask_skipped": sum(bool(e["mask_skipped"]) for e in entries),
            "rows_before_filter": None if rows is None else rows.rows_before,
            "rows_after_filter": None if rows is None else rows.rows_after,
            "entries": entries,
        }


def run_attempt(
    plan: AttemptPlan,
    attempt: Attempt,
    grant: Grant,
    domain: AllocationDomain,
    ports: AttemptPorts,
    outcome: AttemptOutcome,
    *,
    device_result: bool = False,
) -> pa.Table | DeviceFrame:
    """Run ``plan`` as ``attempt`` under ``grant`` with device work in ``domain``
    (the attempt's), filling ``outcome`` as it goes (also on failure). Every frame
    and pin it took is released before it returns (an error keeps no cached array
    alive in its frames), except a ``device_result`` (a scan's): a frame of
    ``domain`` holding no pin nor cache buffer, which the caller releases. Its
    cancel event is looked at before the run, each object's decode and the graph
    algorithm, and between the algorithm's iterations (:mod:`nexus_cache.graph.stopping`):
    once set, the run stops with :class:`QueryCancelledError`.
    """
    budget = AttemptBudget(grant)
    run = _Run(plan, attempt, grant, domain, ports, outcome, budget, SourceLoad(), device_result)
    try:
        attempt.check_cancelled("before it ran")
        if device_result and not isinstance(plan.query, Scan):
            raise TypeError(f"a device result is built for a Scan only, not {plan.query.kind}")
        if isinstance(plan.query, Count):
            table = _run_count(run, plan.query)
        elif isinstance(plan.query, Scan):
            table = _run_scan(run, plan.query)
        else:
            table = _run_graph(run, plan.query)
        if isinstance(table, pa.Table):
            outcome.table = table
        return table
    except BaseException as exc:  # before the pins go (see drop_frame_locals)
        drop_frame_locals(exc)
        raise
    finally:
        run.load.release()
        outcome.used_bytes = run.budget.used


@dataclasses.dataclass(frozen=True)
class _Run:
    """The frame every kind of query runs in: one attempt's plan, grant, domain,
    ports, outcome, byte budget and source load (released by :func:`run_attempt`)."""

    plan: AttemptPlan
    attempt: Attempt
    grant: Grant
    domain: AllocationDomain
    ports: AttemptPorts
    outcome: AttemptOutcome
    budget: AttemptBudget
    load: SourceLoad
    #: a scan's result stays in ``domain`` as a frame (no host table)
    device_result: bool = False
    #: a table read's frames whose every row the statistics prove kept: no mask
    unmasked: list[bool] = dataclasses.field(default_factory=list)


def _run_count(run: _Run, query: Count) -> pa.Table:
    """The rows of the source: from the Parquet footers (no decode, no device cache),
    or with a filter the rows its mask keeps over the filter's decoded columns. A
    filter the footers' statistics prove true for every row of each kept row group
    is counted from those row groups' row counts, with no decode either."""
    read = run.plan.source.table
    if read is not None and not _footers_count(read):
        choices: dict[int, RowGroupChoice] = {}
        rows_proven = _statistics_count(run, read, choices)
        if rows_proven is not None:
            run.outcome.source, run.outcome.graph = BYPASS_COUNT, NOT_APPLICABLE
            run.outcome.rows = FilterCounts(rows_proven, rows_proven)
            rows = rows_proven
        else:
            _load_source(run, query.scan, filter=False, choices=choices)
            run.outcome.graph = NOT_APPLICABLE
            t0 = time.perf_counter()
            run.outcome.rows = count_table(run.load.frames, read, run.domain, run.unmasked)
            run.outcome.timings["filter_s"] = time.perf_counter() - t0
            rows = run.outcome.rows.rows_after
    else:
        t0 = time.perf_counter()
        rows = count_rows(run.ports.lakehouse, run.plan.source, run.outcome.reads)
        run.outcome.timings["read_s"] = time.perf_counter() - t0
        run.outcome.source, run.outcome.graph = BYPASS_COUNT, NOT_APPLICABLE
    table = pa.table({"rows": pa.array([rows], pa.int64())})
    run.budget.charge(table.nbytes, "the count")
    return table


def _statistics_count(
    run: _Run, read: TableRead, choices: dict[int, RowGroupChoice]
) -> int | None:
    """A filtered count from the kept objects' footers alone: the rows of their kept
    row groups, when the statistics prove that every row of each satisfies the
    filter (:func:`needs_no_mask`); None otherwise. Each footer read is left in
    ``choices`` (its object open, for its decode) either way."""
    from nexus_cache.tables.pruning import may_prove_all_true

    assert read.filter is not None
    if not may_prove_all_true(read.filter, read.snapshot.partition_schema.names):
        return None
    plans = run.plan.source.plans
    t0 = time.perf_counter()
    try:
        for read_plan, file in zip(plans, read.files, strict=True):
            run.attempt.check_cancelled("while reading its source's footers")
            choice = choose_row_groups(
                run.ports.lakehouse, read_plan, file, read, run.outcome.reads
            )
            choices[id(read_plan)] = choice
            if not needs_no_mask(choice.groups, choice):
                return None  # the objects left open are decoded from, or closed
    except BaseException:
        _close_opened(choices)
        raise
    finally:
        run.outcome.timings["footer_s"] = time.perf_counter() - t0
    _close_opened(choices)
    run.outcome.entries = _entries(
        plans, [c.groups for c in choices.values()], choices, [True] * len(plans)
    )
    rows = 0
    for choice in choices.values():
        assert choice.footer is not None
        rows += sum(choice.footer.row_group(i).num_rows for i in choice.kept)
    return rows


def _close_opened(choices: Mapping[int, RowGroupChoice]) -> None:
    for choice in choices.values():
        if choice.opened is not None:
            choice.opened.close()


def _footers_count(read: TableRead) -> bool:
    """Whether the footers of the kept files count a table read's rows: no filter, or
    one on Hive or Delta partition columns only (pruning by partition values is then
    exact: every row of a kept file satisfies it)."""
    if read.filter is None:
        return True
    partitions = set(read.snapshot.partition_schema.names)
    return read.snapshot.kind in ("hive", "delta") and set(read.filter.columns) <= partitions


def _run_scan(run: _Run, query: Scan) -> pa.Table | DeviceFrame:
    """The scanned columns as one Arrow table in host memory (with
    ``run.device_result``: as one frame of the attempt's domain). A table read's
    result is built once from the frames (:func:`scan_table`) where its columns
    allow it."""
    read = run.plan.source.table
    _load_source(run, query, filter=False)
    run.outcome.graph = NOT_APPLICABLE
    if read is not None:
        t0 = time.perf_counter()
        built = scan_table(  # the frames of run.domain are its own: released after
            run.load.frames,
            read,
            run.domain,
            on_device=run.device_result,
            unmasked=run.unmasked,
            own=True,
        )
        if built is not None:
            table, run.outcome.rows = built
            run.outcome.timings["filter_s"] = time.perf_counter() - t0
            if isinstance(table, DeviceFrame):
                return _charged(run, table)
            if not run.domain.host_memory:  # gathered on the device first, as large
                run.budget.charge(table.nbytes, "filtering the scan")
            run.budget.charge(table.nbytes, "the result table")
            return table
        _filter_frames(run, read)
    columns = query.columns if read is None else None
    if run.device_result:
        return _device_frame(run, columns)
    t0 = time.perf_counter()
    table = run.load.table(detach=run.domain.host_memory, columns=columns)
    run.outcome.timings["to_arrow_s"] = time.perf_counter() - t0
    run.budget.charge(table.nbytes, "the result table")
    return table


def _device_frame(run: _Run, columns: Sequence[str] | None) -> DeviceFrame:
    """The attempt's frames as one new frame of its domain, holding no pin: one frame
    copied; several gathered whole in one pass where they hold the same columns and
    their columns allow it, else combined as Arrow (types widened and a column an
    object lacks null there, as a host result's are) and copied in. ``columns``: the
    scan's projection, in its order (None: every column)."""
    run.load.check_columns(columns)
    frames = run.load.frames
    names = frames[0].column_names if frames else []
    t0 = time.perf_counter()
    if len(frames) == 1:
        frame = frames[0].copy_into(run.domain)
    elif all(f.column_names == names for f in frames) and gatherable(frames, names):
        rows = [None] * len(frames)
        frame = gather_table(frames, rows, names, run.domain, on_device=True)
    else:
        table = run.load.table(detach=False, columns=columns)
        frame = DeviceFrame.from_arrow(table, domain=run.domain)
    run.outcome.timings["to_device_s"] = time.perf_counter() - t0
    return _charged(run, frame)


def _charged(run: _Run, frame: DeviceFrame) -> DeviceFrame:
    """``frame`` (a device result) charged to the budget; released when it does not fit."""
    try:
        run.budget.charge(int(frame.nbytes), "the device result")
    except BaseException:
        frame.release()
        raise
    return frame


def _run_graph(run: _Run, query: GraphQuery) -> pa.Table:
    """The algorithm's result on the graph of the edges ``query.edges`` reads."""
    _load_source(run, query.edges, whole=True)
    attempt, plan, outcome = run.attempt, run.plan, run.outcome
    attempt.check_cancelled("before its graph algorithm")

    def record(graph: GraphOutcome) -> None:
        if graph.reason == "unstable_source" and plan.source.identity_problems:
            # say why the edge objects have no identity, and what to change
            graph = dataclasses.replace(
                graph, reason=f"unstable_source: {plan.source.identity_problems}"
            )
        outcome.graph = graph

    t0 = time.perf_counter()
    with stop_check(lambda: attempt.check_cancelled("during its graph algorithm")):
        # recorded once the graph is in hand too, so an attempt cancelled
        # inside its algorithm still says how the graph cache answered
        identity, location = plan.source.identity_keys, None
        if plan.source.table is not None:
            # the graph depends on the filter and the version too; one graph per
            # filter and version at a location, so one does not retire another
            extra = plan.source.table.graph_identity
            identity = None if identity is None else (*identity, *extra)
            location = "#".join((query.edges.source, *extra))
        result, answered, graph_bytes = run.ports.graphs.run(
            run.grant.device_id,
            query,
            run.load.frames,
            identity,
            run.domain,
            objects=[p.source for p in plan.source.plans],
            on_ready=record,
            location=location,
        )
    record(answered)
    outcome.timings["graph_s"] = time.perf_counter() - t0
    run.budget.charge(graph_bytes + result.nbytes, "the graph build and algorithm")
    return result


def _load_source(
    run: _Run,
    scan: Scan,
    *,
    whole: bool = False,
    filter: bool = True,
    choices: Mapping[int, RowGroupChoice] | None = None,
) -> None:
    """Fill ``run.load`` with the frames of ``scan``: copies of cached frames (a
    table read borrows them: its filter builds its own), or each object decoded
    (charged to the budget as it lands). A filtered table read decodes only the
    row groups its filter may need, unless ``whole`` (a graph's edges) or the
    object's whole entry is resident. With ``filter``, a table read's frames are
    then filtered (:func:`_filter_frames`). ``choices``: footers already read, by
    ``id`` of the object's read plan (an object left open in one is decoded from it,
    or closed). Sets ``run.unmasked``: the frames that need no mask
    (:func:`needs_no_mask`)."""
    attempt, timings, budget = run.attempt, run.outcome.timings, run.budget
    table = run.plan.source.table
    files = (
        {}
        if table is None
        else dict(zip(map(id, run.plan.source.plans), table.files, strict=True))
    )
    decoded = 0
    read_before = dict(choices or {})
    choices = dict(read_before)  # a whole entry's hit has its footer's proof too
    opened: dict[int, OpenedObject] = {}  # footers read, not yet decoded
    for name, choice in read_before.items():
        if choice.opened is not None:
            opened[name] = choice.opened

    def narrow(read_plan: ReadPlan) -> tuple[int, ...] | None:
        assert table is not None
        choice = read_before.get(id(read_plan))
        if choice is not None:
            return choice.groups
        attempt.check_cancelled("while reading its source's footers")
        t = time.perf_counter()
        choice = choose_row_groups(
            run.ports.lakehouse, read_plan, files[id(read_plan)], table, run.outcome.reads
        )
        choices[id(read_plan)] = choice
        if choice.opened is not None:
            opened[id(read_plan)] = choice.opened
        timings["footer_s"] = timings.get("footer_s", 0.0) + time.perf_counter() - t
        return choice.groups

    def present(schema: pa.Schema) -> list[str]:
        return [c for c in scan.columns or () if c in schema.names]

    def decode(read_plan: ReadPlan, groups: tuple[int, ...] | None) -> Any:
        nonlocal decoded
        attempt.check_cancelled("while decoding its source")
        t = time.perf_counter()
        if table is None:
            frame = decode_object(
                run.ports.lakehouse,
                read_plan,
                scan.columns,
                run.domain,
                run.outcome.reads,
                # objects of a directory whose schemas drifted: each decodes the
                # asked columns it holds; those it lacks are null in the result
                present if scan.columns is not None and len(run.plan.source.plans) > 1 else None,
            )
        else:
            choice = choices.get(id(read_plan))
            frame = decode_table_object(
                run.ports.lakehouse,
                read_plan,
                files[id(read_plan)],
                table,
                run.domain,
                run.outcome.reads,
                row_groups=groups,
                opened=opened.pop(id(read_plan), None),
                footer=None if choice is None else choice.footer,
            )
        timings["read_decode_s"] = timings.get("read_decode_s", 0.0) + time.perf_counter() - t
        decoded += int(frame.nbytes)
        try:
            budget.charge(int(frame.nbytes), "decoding the scan")
        except BaseException:
            frame.release()  # the traceback must not keep device memory alive
            raise
        return frame

    t0 = time.perf_counter()
    try:
        run.ports.sources.load(
            run.grant.device_id,
            run.plan.source,
            scan.columns if table is None else table.columns,
            scan.batch_rows,
            run.domain,
            decode,
            run.load,
            stop=None
            if attempt.cancel is None
            else lambda: attempt.check_cancelled("while waiting for another query's decode"),
            decode_options=() if table is None else table.decode_options,
            narrow=None if table is None or table.filter is None or whole else narrow,
            borrow=table is not None,  # its filter gathers from the entry into run.domain
        )
    finally:
        run.outcome.source = run.load.outcome
        for left in opened.values():  # a footer read, then a hit on the narrowed entry
            left.close()
        if table is not None:
            plans = run.plan.source.plans
            run.unmasked[:] = [  # a whole entry's hit reads no footer: its mask runs
                needs_no_mask(held, choices.get(id(p)))
                for p, held in zip(plans, run.load.holds, strict=False)
            ]
            run.outcome.entries = _entries(plans, run.load.holds, choices, run.unmasked)
    timings["source_s"] = time.perf_counter() - t0
    own = [f for f in run.load.frames if f.domain is run.domain]  # not borrowed
    budget.charge(sum(int(f.nbytes) for f in own) - decoded, "copying cached frames")
    if table is not None and filter:
        _filter_frames(run, table)


def _filter_frames(run: _Run, read: TableRead) -> None:
    """Replace ``run.load``'s frames by their rows ``read``'s filter keeps, in
    ``run.domain`` (:func:`filter_frames`), charged to the budget."""
    borrowed = any(f.domain is not run.domain for f in run.load.frames)
    t0 = time.perf_counter()
    unmasked = run.unmasked if len(run.unmasked) == len(run.load.frames) else None
    run.outcome.rows = filter_frames(run.load.frames, read, run.domain, unmasked)
    run.outcome.timings["filter_s"] = time.perf_counter() - t0
    if read.filter is not None or borrowed:  # the gathered rows are new buffers
        run.budget.charge(run.load.nbytes, "filtering the scan")


def _entries(
    plans: Sequence[ReadPlan],
    holds: Sequence[tuple[int, ...] | None],
    choices: Mapping[int, RowGroupChoice],
    unmasked: Sequence[bool],
) -> list[dict[str, Any]]:
    """Per object of a table read: the row groups its frame holds (``all``, or the
    list the filter kept); where its footer was read, its row groups, how many the
    statistics pruned and how many of those kept they prove wholly kept (None: not
    read, its whole entry served); and whether its rows needed no mask."""
    out = []
    for i, (read_plan, held) in enumerate(zip(plans, holds, strict=False)):  # loaded so far
        choice = choices.get(id(read_plan))
        out.append(
            {
                "object": read_plan.identity.location if read_plan.identity else read_plan.source,
                "row_groups": "all" if held is None else list(held),
                "row_groups_total": None if choice is None else choice.total,
                "row_groups_pruned": None if choice is None else choice.total - len(choice.kept),
                "row_groups_all_true": None if choice is None else len(choice.all_true),
                "mask_skipped": i < len(unmasked) and unmasked[i],
            }
        )
    return out
