"""The service's one door to the graph layer and the resident-graph cache.

``GraphPort.run`` builds the graph of a :class:`~nexus_cache.service.Graph`
query with :mod:`nexus_cache.graph` (on the backend's array module), runs
the algorithm and returns its Arrow table with how the graph cache answered:
``hit`` (a parked graph was reused), ``miss`` (built, run, parked),
``bypass`` with a reason (no stable key, no headroom, ``cache_cap_bytes=0``),
or ``unavailable`` when this build has no resident-graph cache (the graph is
then built for the attempt and dropped with it).

Construction contract per algorithm: PageRank pulls along in-edges, so its
graph is stored ``transposed``; BFS and the similarities use ``as_stored``.
Duplicate edges merge (weights summed), self loops stay, as in NetworkX.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from nexus_cache.backends import AllocationDomain
from nexus_cache.device import DeviceResidentCaches
from nexus_cache.frames import DeviceFrame
from nexus_cache.graph import GraphOptions, bfs, build_graph, pagerank, similarity
from nexus_cache.service.queries import SIMILARITIES, Graph

__all__ = ["GraphOutcome", "GraphPort", "edge_input", "graph_options"]


@dataclasses.dataclass(frozen=True)
class GraphOutcome:
    """How the resident-graph cache answered one algorithm run."""

    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason}


NOT_APPLICABLE = GraphOutcome("not_applicable")


def graph_options(query: Graph) -> GraphOptions:
    """The construction contract of ``query``'s graph (part of its cache key)."""
    orientation = "transposed" if query.algorithm == "pagerank" else "as_stored"
    return GraphOptions(
        directed=query.directed,
        orientation=orientation,
        weight_dtype="float64",
        vertex_dtype="int32",
    )


def run_algorithm(graph: Any, query: Graph) -> Any:
    """Run ``query``'s algorithm on a built graph; returns a GraphResult."""
    params = dict(query.params)
    if query.algorithm == "pagerank":
        return pagerank(
            graph, alpha=params["alpha"], tol=params["tol"], max_iter=params["max_iter"]
        )
    if query.algorithm == "bfs":
        return bfs(graph, params["source"], depth_limit=params["depth_limit"])
    assert query.algorithm in SIMILARITIES
    return similarity(graph, query.algorithm)


def on_device(backend: str, device_id: int) -> contextlib.AbstractContextManager[Any]:
    """Make ``device_id`` current for CuPy work (nothing to do on the host backend)."""
    if backend != "cuda":
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.Device(device_id)


def edge_input(frames: Sequence[DeviceFrame], names: Sequence[str], xp: Any) -> Any:
    """The edge columns of the scan's frames, as arrays on ``xp`` (no host round trip).

    Columns with nulls go through Arrow instead, so the graph layer can
    refuse them with its own message.
    """
    columns = [[frame.column(name) for frame in frames] for name in names]
    if any(c.validity is not None for group in columns for c in group):
        tables = [frame.select(list(names)).to_arrow() for frame in frames]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    out = {}
    for name, group in zip(names, columns, strict=True):
        parts = [c.data for c in group]
        out[name] = parts[0] if len(parts) == 1 else xp.concatenate(parts)
    return out


class GraphPort:
    """Runs graph queries through the graph cache of a device, where one exists."""

    def __init__(self, caches: DeviceResidentCaches) -> None:
        self._caches = caches

    def run(
        self, device_id: int, query: Graph, frames: Sequence[DeviceFrame], domain: AllocationDomain
    ) -> tuple[pa.Table, GraphOutcome, int]:
        """``(result table, outcome, bytes the attempt held for the graph)``.

        Device work runs inside ``domain.scope()``, so on CUDA every CuPy
        allocation of the build and the algorithm lands in the attempt's domain.
        """
        backend = self._caches.backend
        names = [n for n in (query.src, query.dst, query.weight) if n is not None]
        with on_device(backend.name, device_id), domain.scope():
            edges = edge_input(frames, names, backend.xp)
            graph = build_graph(
                edges,
                source=query.src,
                destination=query.dst,
                weight=query.weight,
                options=graph_options(query),
                xp=backend.xp,
            )
            del edges
            held = graph.nbytes
            result = run_algorithm(graph, query).to_arrow()
            del graph
        return result, GraphOutcome("unavailable", "this build has no resident graph cache"), held
