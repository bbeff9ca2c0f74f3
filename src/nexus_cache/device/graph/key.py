"""``ResidentGraphKey`` and the planning step that decides whether a graph run may use it.

A parked graph is reused only when the edges it was built from and the way
it was built are proven equal. :func:`plan_graph_run` creates a key only
when all of this holds, and otherwise records why the run goes uncached:

* a stable source identity: a :class:`SourceFrameKey` without a bypass
  flag, or another non-empty hashable identity tuple the scan layer proved
  (``None`` means the edge rowset is not proven stable);
* no edge-ID binding (results keyed by edge need the attempt's own rows);
* a keyable algorithm (its spec in :mod:`nexus_cache.graph.registry` says
  ``keyable``), run without ``include_edges`` (tree edges are keyed by the
  attempt's edges).

The key covers the source identity, the column bindings (source,
destination, weight) and :class:`~nexus_cache.graph.GraphOptions` (graph
options, edge preparation, dtypes, orientation). It does not name the
algorithm: one parked graph serves every keyable algorithm. It also carries
the source's location, outside its identity, so that a graph cache can
retire the graphs of a location whose data was rewritten.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Hashable
from dataclasses import dataclass, field

from nexus_cache.device.source.key import SourceFrameKey
from nexus_cache.errors import ConfigError
from nexus_cache.graph.options import GraphOptions
from nexus_cache.graph.registry import get_spec

__all__ = [
    "GraphPlan",
    "GraphUncachedReason",
    "ResidentGraphKey",
    "plan_graph_run",
]


class GraphUncachedReason(enum.Enum):
    """Why a graph run went the attempt-owned uncached path."""

    #: no proven source identity (the edge rowset may change between attempts)
    UNSTABLE_SOURCE = "unstable_source"
    #: the source key carries a bypass flag (its frame is never cached)
    SOURCE_BYPASS = "source_bypass"
    #: the plan binds an edge-ID column
    EDGE_ID_BINDING = "edge_id_binding"
    #: BFS with include_edges (tree edges are keyed by the attempt's edges)
    INCLUDE_EDGES = "include_edges"
    #: the algorithm's spec says its runs are not keyable
    NOT_KEYABLE = "not_keyable"
    #: the device has no graph cache (cache_cap_bytes = 0) or it is closed
    NO_CACHE = "no_cache"
    #: the ledger refused the build or the transient headroom
    NO_HEADROOM = "no_headroom"
    #: the parked graph could not be checked out (being torn down)
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, repr=False)
class ResidentGraphKey:
    """The construction contract of one parked graph. Immutable, hashable.

    ``fingerprint`` (16 hex digits of a BLAKE2b digest of every field) is the
    only form diagnostics show: the source identity may hold paths.
    """

    source: Hashable
    source_column: str
    destination_column: str
    weight_column: str | None
    options: GraphOptions
    #: where the source lives (a URL or path), or None: not part of the key's
    #: identity; a newer ``source`` seen at the same location supersedes this graph
    location: Hashable = field(compare=False, default=None)
    fingerprint: str = field(init=False, compare=False, default="")

    def __post_init__(self) -> None:
        for name in ("source_column", "destination_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"ResidentGraphKey.{name} must be a column name")
        if self.weight_column is not None and not isinstance(self.weight_column, str):
            raise ConfigError("ResidentGraphKey.weight_column must be a column name or None")
        if not isinstance(self.options, GraphOptions):
            raise ConfigError("ResidentGraphKey.options must be a GraphOptions")
        hash(self.source)  # refuse an unhashable identity here, not at lookup
        hash(self.location)
        text = repr(
            (
                self.source,
                self.source_column,
                self.destination_column,
                self.weight_column,
                self.options,
            )
        )
        digest = hashlib.blake2b(text.encode("utf-8", "backslashreplace"), digest_size=8)
        object.__setattr__(self, "fingerprint", digest.hexdigest())

    def __repr__(self) -> str:
        return f"ResidentGraphKey(fingerprint={self.fingerprint})"


@dataclass(frozen=True)
class GraphPlan:
    """One planned graph run: what to build, what to run, and the key or the reason."""

    algorithm: str
    source_column: str
    destination_column: str
    weight_column: str | None
    options: GraphOptions
    include_edges: bool
    key: ResidentGraphKey | None
    uncached_reason: GraphUncachedReason | None

    @property
    def keyable(self) -> bool:
        return self.key is not None


def plan_graph_run(
    algorithm: str,
    *,
    source: Hashable | None,
    source_column: str = "src",
    destination_column: str = "dst",
    weight_column: str | None = None,
    options: GraphOptions | None = None,
    include_edges: bool = False,
    edge_id_column: str | None = None,
    source_location: Hashable = None,
) -> GraphPlan:
    """Plan a graph run; the plan has a :class:`ResidentGraphKey` only when reuse is proven.

    ``source`` is the proven identity of the edge rowset: a
    :class:`SourceFrameKey`, another non-empty identity tuple, or None when
    no stable identity exists. ``source_location`` names where the rowset
    lives (its URL): a graph cache retires parked graphs of that location
    whose identity differs (the data was rewritten; they can never be hit
    again). Pure function: thread-safe.
    """
    spec = get_spec(algorithm, "graph algorithm")
    options = options or GraphOptions()
    reason: GraphUncachedReason | None = None
    if source is None or (isinstance(source, tuple) and not source):
        reason = GraphUncachedReason.UNSTABLE_SOURCE
    elif isinstance(source, SourceFrameKey) and source.bypass is not None:
        reason = GraphUncachedReason.SOURCE_BYPASS
    elif edge_id_column is not None:
        reason = GraphUncachedReason.EDGE_ID_BINDING
    elif spec.include_edges and include_edges:
        reason = GraphUncachedReason.INCLUDE_EDGES
    elif not spec.keyable:
        reason = GraphUncachedReason.NOT_KEYABLE
    key = None
    if reason is None:
        key = ResidentGraphKey(
            source,
            source_column,
            destination_column,
            weight_column,
            options,
            location=source_location,
        )
    return GraphPlan(
        algorithm=algorithm,
        source_column=source_column,
        destination_column=destination_column,
        weight_column=weight_column,
        options=options,
        include_edges=include_edges,
        key=key,
        uncached_reason=reason,
    )
