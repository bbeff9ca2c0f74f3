"""The service's one door to the graph layer and the resident-graph cache.

``GraphPort.run`` returns the algorithm's result and how the graph cache
answered: ``hit`` (a parked graph was reused), ``miss`` (built, run, parked),
``bypass`` with a reason (no stable key, no headroom, ``cache_cap_bytes=0``),
or ``unavailable`` when this build has no resident graph cache (the algorithm
then runs uncached on NumPy/SciPy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from nexus_cache.device import DeviceResidentCaches
from nexus_cache.service import _graph_fallback
from nexus_cache.service.queries import Graph

__all__ = ["GraphOutcome", "GraphPort"]


@dataclasses.dataclass(frozen=True)
class GraphOutcome:
    """How the resident-graph cache answered one algorithm run."""

    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason}


NOT_APPLICABLE = GraphOutcome("not_applicable")


class GraphPort:
    """Runs graph queries through the graph cache of a device, where one exists."""

    def __init__(self, caches: DeviceResidentCaches) -> None:
        self._caches = caches

    def run(
        self, device_id: int, query: Graph, edges: pa.Table, source_key: Any
    ) -> tuple[pa.Table, GraphOutcome]:
        table = _graph_fallback.run_algorithm(
            edges,
            query.src,
            query.dst,
            query.weight,
            query.directed,
            query.algorithm,
            dict(query.params),
        )
        return table, GraphOutcome("unavailable", "this build has no resident graph cache")
