"""The service's one door to the graph layer and the resident-graph cache.

``GraphPort.run`` plans a :class:`~nexus_cache.service.GraphQuery` query's run
(:func:`~nexus_cache.device.plan_graph_run`: a resident-graph key only when
the edge rowset's identity is proven), runs it through the device's graph
cache and returns the result's Arrow table with how the cache answered:
``hit`` (a parked graph was reused: no build), ``miss`` (built, parked, run),
or ``bypass`` with the reason the run went uncached (``unstable_source``: an
edge object without a proven identity; ``no_cache``: ``cache_cap_bytes=0``;
``no_headroom``: the ledger refused the build or the run's headroom). A hit
whose run left the cache domain above its baseline reports the drift in the
reason; that graph was destroyed rather than parked again.

Construction contract per algorithm, as its spec in
:mod:`nexus_cache.graph.registry` says: PageRank pulls along in-edges, so its
graph is stored ``transposed``; the others use ``as_stored``. Self loops
stay, as in NetworkX. A repeated edge counts as often as it appears in
PageRank, with or without a weight column (its weights add up; an unweighted
copy weighs 1: NetworkX's multigraph); the others see neighbour sets, where
a repeat is the same neighbour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache.backends import AllocationDomain
from nexus_cache.device import (
    DeviceResidentCaches,
    GraphRunStatus,
    GraphUncachedReason,
    plan_graph_run,
    run_graph,
)
from nexus_cache.errors import GraphInputError
from nexus_cache.frames import DeviceFrame
from nexus_cache.graph import GraphOptions
from nexus_cache.graph.edges import vertex_array
from nexus_cache.graph.memory import build_bytes
from nexus_cache.graph.registry import get_spec
from nexus_cache.service._source_port import concat_objects
from nexus_cache.service.queries import GraphQuery

__all__ = ["GraphOutcome", "GraphPort", "algorithm_params", "edge_input", "graph_options"]


@dataclasses.dataclass(frozen=True)
class GraphOutcome:
    """How the resident-graph cache answered one algorithm run, and the
    algorithm's own facts (``algorithm``: PageRank's ``iterations``,
    ``converged``, ``error`` and ``threshold``; BFS's ``levels``)."""

    status: str
    reason: str | None = None
    algorithm: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason}


NOT_APPLICABLE = GraphOutcome("not_applicable")


def graph_options(query: GraphQuery) -> GraphOptions:
    """The construction contract of ``query``'s graph (part of its cache key): the
    orientation and duplicate rule its algorithm's spec names."""
    assert query.directed is not None  # resolved to the algorithm's default at construction
    return get_spec(query.algorithm).options(
        query.directed, weight_dtype="float64", vertex_dtype="int32"
    )


def algorithm_params(query: GraphQuery) -> dict[str, Any]:
    """The graph layer's keyword arguments for ``query``'s algorithm."""
    return get_spec(query.algorithm).arguments(query.params)


def edge_input(
    frames: Sequence[DeviceFrame], names: Sequence[str], xp: Any, objects: Sequence[str] = ()
) -> Any:
    """The edge columns of the scan's frames, as arrays on ``xp`` (no host round trip).

    ``names`` is ``(src, dst[, weight])``; ``objects`` names the object of
    each frame for messages. Id columns of different integer types across
    objects (int64 in one, uint64 in another) become int64, as a scan
    combines them; a uint64 id beyond int64 is refused, naming the object.
    Columns with nulls go through Arrow instead, so the graph layer can
    refuse them with its own message.
    """
    labels = (
        list(objects)
        if len(objects) == len(frames)
        else [f"#{i + 1} of {len(frames)}" for i in range(len(frames))]
    )
    columns = [
        [_column(frame, name, label) for frame, label in zip(frames, labels, strict=True)]
        for name in names
    ]
    for frame_columns in zip(*columns, strict=True):  # every object, not only the first
        _check_types(names, [c.type for c in frame_columns])
    if any(c.validity is not None for group in columns for c in group):
        tables = [frame.select(list(names)).to_arrow() for frame in frames]
        return tables[0] if len(tables) == 1 else concat_objects(tables)
    out = {}
    for position, (name, group) in enumerate(zip(names, columns, strict=True)):
        parts = [c.data for c in group]
        if position < 2 and len({p.dtype for p in parts}) > 1:
            # NumPy and CuPy promote int64 with uint64 to float64: unify as ids
            parts = [
                vertex_array(p, xp, f"column {name!r} of edge object {label!r}")
                for p, label in zip(parts, labels, strict=True)
            ]
        out[name] = parts[0] if len(parts) == 1 else xp.concatenate(parts)
    return out


def _column(frame: DeviceFrame, name: str, label: str) -> Any:
    """``frame``'s column ``name``; GraphInputError naming the object when it has none."""
    if name not in frame.column_names:
        raise GraphInputError(
            f"edge object {label!r} has no column {name!r} (its columns: "
            f"{', '.join(frame.column_names) or 'none'}); every object of the edge source "
            "needs the columns the query names: add it, or move the object out of the source"
        )
    return frame.column(name)


def _check_types(names: Sequence[str], types: Sequence[pa.DataType]) -> None:
    """Refuse columns whose values buffer is not a vertex id (or weight).

    The raw buffer of a string, dictionary, timestamp or boolean column would
    otherwise pass as numbers (a string column's bytes as vertex ids).
    ``names`` is ``(src, dst[, weight])``.
    """
    for position, (name, type_) in enumerate(zip(names, types, strict=True)):
        if position < 2 and not pa.types.is_integer(type_):
            raise GraphInputError(
                f"column {name!r} has Arrow type {type_}; vertex ids must be an integer "
                "column (cast it, or pick another column)"
            )
        if position == 2 and not (pa.types.is_integer(type_) or pa.types.is_floating(type_)):
            raise GraphInputError(
                f"weight column {name!r} has Arrow type {type_}; use an integer or float "
                "column (cast it, or pick another column)"
            )


_STATUS = {GraphRunStatus.HIT: "hit", GraphRunStatus.MISS: "miss"}


def _ready(
    report: Callable[[GraphOutcome], None],
) -> Callable[[GraphRunStatus, GraphUncachedReason | None, str], None]:
    """The graph cache's ``on_ready``, reported as the :class:`GraphOutcome` the
    run would end with (without the algorithm's facts)."""

    def ready(status: GraphRunStatus, reason: GraphUncachedReason | None, detail: str) -> None:
        if status is GraphRunStatus.UNCACHED:
            report(GraphOutcome("bypass", _bypass_detail(reason, detail), {}))
        else:
            report(GraphOutcome(_STATUS[status], None, {}))

    return ready


def _bypass_detail(reason: GraphUncachedReason | None, detail: str) -> str:
    """What a bypassed run's outcome says: its reason, and the detail when it adds one."""
    shown = reason.value if reason is not None else "uncached"
    return f"{shown}: {detail}" if detail and detail != shown else shown


def _facts(algorithm: str, info: dict[str, Any]) -> dict[str, Any]:
    """The run facts the algorithm's spec reports in the diagnostics (plain JSON values)."""
    return {name: info[name] for name in get_spec(algorithm).facts if name in info}


class GraphPort:
    """Runs graph queries through the resident-graph cache of a device. Thread-safe."""

    def __init__(self, caches: DeviceResidentCaches) -> None:
        self._caches = caches

    def run(
        self,
        device_id: int,
        query: GraphQuery,
        frames: Sequence[DeviceFrame],
        source_identity: tuple[str, ...] | None,
        domain: AllocationDomain,
        objects: Sequence[str] = (),
        on_ready: Callable[[GraphOutcome], None] | None = None,
        location: str | None = None,
    ) -> tuple[pa.Table, GraphOutcome, int]:
        """``(result table, outcome, bytes the attempt held for the graph)``.

        ``on_ready`` gets the outcome as far as the cache goes (its status,
        no algorithm facts yet) once the graph is in hand, before the
        algorithm runs: an attempt stopped inside its algorithm still records
        how the graph cache answered.

        ``source_identity`` is the proven identity of the edge rowset (the
        lakehouse entry keys of its objects), or None when one object has
        none: the run then goes uncached. ``objects`` names the object of each
        frame, for messages. Device work runs inside
        ``domain.scope()``, so on CUDA what the attempt allocates (its edge
        columns, an uncached graph, the result) lands in the attempt's domain;
        a cached build happens in the cache domain. ``location`` is where the
        graph's source lives for retiring older graphs (default: the edge
        scan's source; a table read names its filter and version too).
        """
        backend = self._caches.backend
        options = graph_options(query)
        plan = plan_graph_run(
            query.algorithm,
            source=source_identity,
            source_column=query.src,
            destination_column=query.dst,
            weight_column=query.weight,
            options=options,
            source_location=location or query.edges.source,  # a rewrite retires older graphs
        )
        names = [n for n in (query.src, query.dst, query.weight) if n is not None]
        with backend.device_scope(device_id), domain.scope():
            edges = edge_input(frames, names, backend.xp, objects)
            n_edges = sum(f.num_rows for f in frames)
            run = run_graph(
                self._caches.graph_cache(device_id),
                plan,
                edges,
                on_ready=None if on_ready is None else _ready(on_ready),
                **algorithm_params(query),
            )
            del edges
            table = run.result.to_arrow()
        facts = _facts(query.algorithm, run.result.info)
        held = 0
        if run.status is GraphRunStatus.UNCACHED:  # the attempt built the graph itself
            held = build_bytes(n_edges, options, query.weight is not None)
            return (
                table,
                GraphOutcome("bypass", _bypass_detail(run.reason, run.detail), facts),
                held,
            )
        drift = run.detail if run.drift_bytes else None
        return table, GraphOutcome(_STATUS[run.status], drift, facts), held
