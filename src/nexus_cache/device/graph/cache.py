"""The resident graph cache of one device: parked graphs reused across attempts.

* **Miss**: reserve the build estimate in the ledger, copy the attempt's edge
  columns into the cache domain, build the graph there and park a copy,
  attach it, and publish: the charge is reconciled to the measured
  parked-graph allocation (the build's transients are gone by then). Then
  run as on a hit.
* **Hit**: pin the parked graph, reserve the algorithm's transient headroom
  (a temporary ledger reservation), note the domain's live bytes (the
  baseline), run inside the cache domain, copy the result out to the
  attempt, and check that the domain is back at its baseline. If it is, the
  pin is released (the graph is parked again); if not, the graph is not
  re-parked: it is destroyed safely and the drift reported.
* **Uncached**: without a key (see :mod:`nexus_cache.device.graph.key`), a
  graph cache, ledger headroom or an available entry, the attempt builds and
  runs on its own memory; :class:`GraphRun` records the reason.

No LRU eviction: a parked graph stays until shutdown, unless a run on the
same source location with a newer source identity retires it (the data was
rewritten; see :meth:`GraphCacheSubdomain.retire_superseded`). A build's
reservation and its run's headroom may evict unpinned source frames (through
the ledger's evictors: the ledger stays the one byte authority). Concurrent
builds of one key are reconciled at publication: the first published graph
wins, the other is torn down and its charge released.

After each build and run the domain's freed blocks go back to the device,
so the memory it holds stays what the ledger charges.

Every graph-cache step that allocates or frees in the cache domain (build,
park, publish, run, drift teardown) is serialized per device, so a run's
baseline check sees only that run. Source-cache fills share the domain, so
one that overlaps a run can be reported as drift (the graph is then rebuilt
by the next miss: wasteful, never unsafe). Thread-safe.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache.device.graph.key import GraphPlan, GraphUncachedReason, ResidentGraphKey
from nexus_cache.device.residency import PinHandle, ResidentEntry
from nexus_cache.device.subdomain import CacheSubdomain, EntryView
from nexus_cache.errors import (
    AdmissionClosedError,
    CapacityError,
    ConfigError,
    LifecycleError,
    UnsafeTeardownError,
)
from nexus_cache.graph.registry import get_spec

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain
    from nexus_cache.device.domain import DeviceCacheAllocationFactory
    from nexus_cache.device.ledger import DeviceLedger
    from nexus_cache.graph import Graph, GraphResult

__all__ = [
    "GraphCacheStats",
    "GraphCacheSubdomain",
    "GraphRun",
    "GraphRunStatus",
    "run_graph",
]

#: Seconds a drifted graph's teardown waits for other pins to be released.
DRIFT_TEARDOWN_TIMEOUT_S = 10.0


class GraphRunStatus(enum.Enum):
    #: ran on a parked graph (no build)
    HIT = "hit"
    #: built and parked the graph, then ran on it
    MISS = "miss"
    #: built and ran on the attempt's own memory (see ``GraphRun.reason``)
    UNCACHED = "uncached"


#: ``on_ready(status, reason, detail)``: the run's graph is in hand and its
#: algorithm starts next (``reason`` and ``detail``: why the run goes
#: uncached, as :class:`GraphRun` will say; None and ``"parked"`` otherwise)
_OnReady = Callable[[GraphRunStatus, GraphUncachedReason | None, str], None]


@dataclass(frozen=True)
class GraphRun:
    """How one graph run was served. ``result`` is attempt-owned."""

    result: GraphResult
    status: GraphRunStatus
    fingerprint: str | None
    reason: GraphUncachedReason | None = None
    detail: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    #: live domain bytes above the baseline after the run (the graph was destroyed)
    drift_bytes: int = 0


@dataclass(frozen=True)
class GraphCacheStats:
    """Graph-specific activity (the base subdomain stats hold hits, misses, duplicates)."""

    builds: int
    drifts: int
    drift_bytes: int
    uncached: dict[str, int] = field(default_factory=dict)
    #: graphs retired because their source location was seen with a newer identity
    retired: int = 0
    retired_bytes: int = 0


class GraphCacheSubdomain(CacheSubdomain):
    """Parked graphs on one device; resident until their source is superseded or the
    cache shuts down. Thread-safe."""

    kind = "graph"
    # Parked graphs are never evicted for room (a rebuild costs far more than a
    # decode), but a build may evict unpinned source frames: else frames that
    # fill the cap would keep every graph out although nothing is in use.
    evicts_lru = False
    evict_on_reserve = True

    def __init__(self, ledger: DeviceLedger, factory: DeviceCacheAllocationFactory) -> None:
        super().__init__(ledger, factory)
        # Held by every step that allocates or frees in the cache domain (build,
        # park, publish, run, drift teardown), so a run's baseline check sees
        # only that run.
        self._domain_lock = threading.Lock()
        self._builds = 0
        self._drifts = 0
        self._drift_bytes = 0
        self._uncached_counts: dict[str, int] = {}
        self._retired = 0
        self._retired_bytes = 0
        # key -> (vertices, input edges) of the graphs built, for entries()
        self._shapes: dict[Hashable, tuple[int, int]] = {}

    def graph_stats(self) -> GraphCacheStats:
        with self._lock:
            return GraphCacheStats(
                self._builds,
                self._drifts,
                self._drift_bytes,
                dict(self._uncached_counts),
                self._retired,
                self._retired_bytes,
            )

    def entries(self) -> list[EntryView]:
        """The parked graphs, most recently used first; ``detail`` holds their
        ``vertices`` and ``edges`` (input edges)."""
        views = super().entries()
        with self._lock:
            live = {view.key for view in views}
            for key in [k for k in self._shapes if k not in live]:
                del self._shapes[key]
            shapes = dict(self._shapes)
        out = []
        for view in views:
            vertices, edges = shapes.get(view.key, (None, None))
            out.append(replace(view, detail={"vertices": vertices, "edges": edges}))
        return out

    # -- the front door ------------------------------------------------------------------

    def run(
        self, plan: GraphPlan, edges: Any, *, on_ready: _OnReady | None = None, **params: Any
    ) -> GraphRun:
        """Run ``plan.algorithm`` on the graph of ``edges`` (the attempt's edge frame).

        ``params`` go to the algorithm (``sources=`` for BFS, ``alpha=`` for
        PageRank, ``pairs=`` for similarities...). Errors of the algorithm or
        of the edges (``GraphInputError``) reach the caller; capacity
        refusals never do (the run goes uncached). ``on_ready(status, reason,
        detail)`` is called once the graph is in hand, just before the
        algorithm starts (``reason`` and ``detail``: why the run goes
        uncached, as the returned :class:`GraphRun` will say; None and
        ``"parked"`` otherwise), so a caller whose algorithm is then stopped
        (a cancel) still knows how the cache answered.
        """
        params = _checked_params(plan, params)
        if plan.key is None:
            return self._uncached(plan, edges, params, plan.uncached_reason, "", on_ready)
        if self._closed:
            return self._uncached(
                plan, edges, params, GraphUncachedReason.NO_CACHE, "closed", on_ready
            )
        if plan.key.location is not None:
            self.retire_superseded(plan.key)
        handle = self.checkout(plan.key)
        status, build_s = GraphRunStatus.HIT, 0.0
        if handle is None:
            status = GraphRunStatus.MISS
            started = time.perf_counter()
            outcome = self._build_and_park(plan, edges)
            build_s = time.perf_counter() - started
            if not isinstance(outcome, PinHandle):
                reason, detail = outcome
                return self._uncached(plan, edges, params, reason, detail, on_ready)
            handle = outcome
        return self._run_parked(handle, plan, edges, params, status, build_s, on_ready)

    def retire_superseded(self, key: ResidentGraphKey) -> int:
        """Destroy the parked graphs of ``key.location`` built from another source
        identity: that data was rewritten, so they can never be hit again. Returns
        the bytes freed. A graph pinned by a running query is retired by a later
        call, once that query is done.
        """
        location = key.location
        if location is None:
            return 0

        def superseded(other: Hashable) -> bool:
            return (
                isinstance(other, ResidentGraphKey)
                and other.location == location
                and other.source != key.source
            )

        with self._lock:  # the usual case: nothing to retire, no wait for a running graph
            if not any(superseded(other) for other in self._entries):
                return 0
        with self._domain_lock:  # teardown frees blocks in the cache domain
            gone = self._tear_down(self._take_unpinned(superseded, sys.maxsize))
        freed = sum(entry.nbytes for entry in gone)
        with self._lock:
            self._retired += len(gone)
            self._retired_bytes += freed
            self._counts["destroyed"] += len(gone)
        return freed

    # -- miss ----------------------------------------------------------------------------

    def _build_and_park(
        self, plan: GraphPlan, edges: Any
    ) -> PinHandle | tuple[GraphUncachedReason, str]:
        # the graph layer (NumPy, Arrow) loads when a graph is first built or run
        from nexus_cache.graph.csr import build_graph
        from nexus_cache.graph.edges import edge_columns
        from nexus_cache.graph.memory import build_bytes

        src, dst, weights, _ = edge_columns(
            edges, plan.source_column, plan.destination_column, plan.weight_column, None
        )
        estimate = build_bytes(int(src.size), plan.options, weights is not None)
        domain = self._factory.domain
        try:
            entry = self.reserve(plan.key, estimate)
        except (CapacityError, AdmissionClosedError) as exc:
            return GraphUncachedReason.NO_HEADROOM, f"build not reserved: {exc}"
        except LifecycleError as exc:
            return GraphUncachedReason.NO_CACHE, str(exc)
        try:
            self._domain_lock.acquire()
        except BaseException:  # interrupted while waiting for the lock
            self.abandon(entry)
            raise
        try:
            try:
                with domain.scope():
                    # keyed by the plan's column names, so errors about weights
                    # name the edge frame's column (a weight column that is also
                    # an id column holds the same values: one copy serves both)
                    columns = {
                        plan.source_column: domain.copy_in(src),
                        plan.destination_column: domain.copy_in(dst),
                    }
                    if weights is not None and plan.weight_column is not None:
                        columns[plan.weight_column] = domain.copy_in(weights)
                    del src, dst, weights
                    built = build_graph(
                        columns,
                        source=plan.source_column,
                        destination=plan.destination_column,
                        weight=plan.weight_column,
                        options=plan.options,
                        xp=domain.xp,
                    )
                    del columns
                    parked = built.copy_into(domain)
                    del built
                entry.attach(parked, parked.device_arrays())
                with self._lock:
                    self._shapes[plan.key] = (parked.n_vertices, int(parked.input_edges))
                del parked
                domain.release_unused()  # the build's transient blocks go back to the device
                with self._lock:
                    self._builds += 1
            except MemoryError as exc:  # the domain ran out while building
                self.abandon(entry)
                return GraphUncachedReason.NO_HEADROOM, f"build ran out of memory: {exc}"
            except BaseException:  # Ctrl-C included: the reservation never outlives the build
                self.abandon(entry)
                raise
            try:
                winner = self.publish(entry)  # a duplicate is torn down here
            except (CapacityError, AdmissionClosedError) as exc:
                return GraphUncachedReason.NO_HEADROOM, f"parked graph not charged: {exc}"
            except LifecycleError as exc:
                return GraphUncachedReason.NO_CACHE, str(exc)
        finally:
            self._domain_lock.release()
        try:
            return winner.pin()
        except LifecycleError as exc:
            return GraphUncachedReason.UNAVAILABLE, str(exc)

    # -- hit (and the run half of a miss) --------------------------------------------------

    def _run_parked(
        self,
        handle: PinHandle,
        plan: GraphPlan,
        edges: Any,
        params: dict[str, Any],
        status: GraphRunStatus,
        build_s: float,
        on_ready: _OnReady | None = None,
    ) -> GraphRun:
        from nexus_cache.graph.memory import transient_bytes

        entry = handle.entry
        fingerprint = plan.key.fingerprint if plan.key is not None else None
        graph: Graph | None = handle.value
        assert graph is not None
        domain = self._factory.domain
        released = False
        torn_down: str | None = None
        try:
            headroom = self._ledger.reserve(
                transient_bytes(graph, plan.algorithm, params),
                key=("headroom", fingerprint),
                evict=self.evict_on_reserve,
            )
        except (CapacityError, AdmissionClosedError) as exc:
            graph = None
            drop_frame_locals(exc)
            handle.release()
            return self._uncached(
                plan,
                edges,
                params,
                GraphUncachedReason.NO_HEADROOM,
                f"no run headroom: {exc}",
                on_ready,
            )
        except BaseException as exc:
            # an estimate that fails, or Ctrl-C: the pin must not outlive the run,
            # or the graph could never be evicted, retired or drained
            graph = None
            drop_frame_locals(exc)
            handle.release()
            raise
        try:
            if on_ready is not None:
                on_ready(status, None, "parked")
            with self._domain_lock:
                baseline = domain.used_bytes()
                started = time.perf_counter()
                owned = _run_owned(plan.algorithm, graph, params, domain)
                graph = None
                run_s = time.perf_counter() - started
                drift = domain.used_bytes() - baseline
                if drift > 0:
                    handle.release()
                    released = True
                    torn_down = self._teardown_now(entry)
                domain.release_unused()  # so the domain holds no more than the ledger charges
        except BaseException as exc:
            # The error's traceback keeps the frames it passed through: whoever keeps
            # the error (a caller, Dask's failed task) would keep the graph's arrays
            # past the pin, and its eviction would be unsafe (admission would close).
            graph = None
            drop_frame_locals(exc)
            raise
        finally:
            headroom.destroy()
            if not released:
                handle.release()
        if drift > 0:
            detail = self._retire(entry, drift, torn_down)
            return GraphRun(
                owned, status, fingerprint, None, detail, build_s, run_s, drift_bytes=drift
            )
        return GraphRun(owned, status, fingerprint, None, "parked", build_s, run_s)

    def _teardown_now(self, entry: ResidentEntry) -> str | None:
        """Tear a drifted graph down if nobody else holds a pin (domain lock held).

        Returns what happened, or None when other pins hold it (then
        :meth:`_retire` waits for them outside the domain lock).
        """
        if not entry.begin_eviction():
            return None
        with self._lock:
            self._tearing_down += 1
        try:
            entry.teardown()
        except UnsafeTeardownError as exc:
            self._record_unsafe(entry)
            return f"teardown unsafe: {exc}"
        finally:
            with self._lock:
                self._tearing_down -= 1
                self._settled.notify_all()
        return "destroyed"

    def _retire(self, entry: ResidentEntry, drift: int, torn_down: str | None) -> str:
        """Account a drifted graph and finish its teardown (no domain lock held)."""
        with self._lock:
            self._drifts += 1
            self._drift_bytes += drift
        outcome = torn_down
        if outcome is None:  # other pins: block new ones and wait for them
            with self._lock:
                self._tearing_down += 1
            try:
                entry.destroy(DRIFT_TEARDOWN_TIMEOUT_S, owner=self)
                outcome = "destroyed"
            except UnsafeTeardownError as exc:
                self._record_unsafe(entry)
                outcome = f"teardown unsafe: {exc}"
            except LifecycleError as exc:  # pins outlived the wait; they stay blocked
                outcome = f"teardown pending: {exc}"
            finally:
                with self._lock:
                    self._tearing_down -= 1
                    self._settled.notify_all()
        if outcome == "destroyed":
            with self._lock:
                self._remove_published(entry)
                self._counts["destroyed"] += 1
        return f"drift: {drift} B above the baseline after the run; the graph: {outcome}"

    # -- uncached ----------------------------------------------------------------------------

    def _uncached(
        self,
        plan: GraphPlan,
        edges: Any,
        params: dict[str, Any],
        reason: GraphUncachedReason | None,
        detail: str,
        on_ready: _OnReady | None = None,
    ) -> GraphRun:
        if reason is not None:
            with self._lock:
                self._uncached_counts[reason.value] = (
                    self._uncached_counts.get(reason.value, 0) + 1
                )
        return _run_uncached(plan, edges, params, reason, detail, on_ready)


def _checked_params(plan: GraphPlan, params: Mapping[str, Any]) -> dict[str, Any]:
    params = dict(params)
    if "include_edges" in params and params["include_edges"] != plan.include_edges:
        raise ConfigError(
            f"include_edges={params['include_edges']!r} differs from the plan's "
            f"{plan.include_edges!r}; plan the run with the include_edges it uses"
        )
    if plan.include_edges and get_spec(plan.algorithm).include_edges:
        params["include_edges"] = True
    return params


def _run_uncached(
    plan: GraphPlan,
    edges: Any,
    params: dict[str, Any],
    reason: GraphUncachedReason | None,
    detail: str,
    on_ready: _OnReady | None = None,
) -> GraphRun:
    from nexus_cache.graph.csr import build_graph

    started = time.perf_counter()
    graph = build_graph(
        edges,
        source=plan.source_column,
        destination=plan.destination_column,
        weight=plan.weight_column,
        options=plan.options,
    )
    built = time.perf_counter()
    text = detail or (reason.value if reason is not None else "")
    if on_ready is not None:
        on_ready(GraphRunStatus.UNCACHED, reason, text)
    result = get_spec(plan.algorithm).run(graph, **params)
    done = time.perf_counter()
    return GraphRun(
        result, GraphRunStatus.UNCACHED, None, reason, text, built - started, done - built
    )


def _run_owned(
    algorithm: str, graph: Graph, params: dict[str, Any], domain: AllocationDomain
) -> GraphResult:
    """``algorithm`` on a parked ``graph``, working in the cache's ``domain``; its
    result copied out into the current scope (the attempt's), holding no array of
    the graph (a result column may be one of the graph's, such as its vertex ids)."""
    with domain.scope():
        result = get_spec(algorithm).run(graph, **params)
    return result.copy()


def run_graph(
    cache: GraphCacheSubdomain | None,
    plan: GraphPlan,
    edges: Any,
    *,
    on_ready: _OnReady | None = None,
    **params: Any,
) -> GraphRun:
    """Run ``plan`` through ``cache``, or uncached when the device has none (cap 0);
    ``on_ready`` as in :meth:`GraphCacheSubdomain.run`."""
    if cache is None:
        params = _checked_params(plan, params)
        return _run_uncached(
            plan, edges, params, GraphUncachedReason.NO_CACHE, "no graph cache", on_ready
        )
    return cache.run(plan, edges, on_ready=on_ready, **params)
