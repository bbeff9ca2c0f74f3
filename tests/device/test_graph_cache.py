"""The resident graph cache on the host backend: keys, miss/hit, fallbacks, drift."""

from __future__ import annotations

import dataclasses
import importlib
import threading
import traceback
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.device import (
    DeviceProfile,
    DeviceResidentCaches,
    GraphRunStatus,
    GraphUncachedReason,
    ResidencyState,
    ResidentGraphKey,
    SourceFrameKey,
    plan_graph_run,
    run_graph,
)
from nexus_cache.errors import GraphConvergenceError, GraphInputError
from nexus_cache.graph import GraphOptions, build_graph, pagerank

from ._graph_checks import check_empty_edge_table, check_vertices_without_arcs, empty_edges

csr = importlib.import_module("nexus_cache.graph.csr")
edges_module = importlib.import_module("nexus_cache.graph.edges")
ranking = importlib.import_module("nexus_cache.graph.ranking")

MIB = 1 << 20
SOURCE = SourceFrameKey(("local", "/data/edges.parquet", "etag-1"), columns=("src", "dst", "w"))
RUNS: list[tuple[str, dict[str, Any]]] = [
    ("bfs", {"sources": [10**12 + 3]}),
    ("pagerank", {"alpha": 0.9}),
    ("jaccard", {}),
    ("sorensen", {"pairs": ([10**12 + 1, 10**12 + 2], [10**12 + 3, 10**12 + 4])}),
    ("overlap", {}),
    ("cosine", {}),
]


def _edges(seed: int = 0, m: int = 400) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = 10**12 + rng.integers(0, 60, (m, 2))
    return pa.table({"src": ids[:, 0], "dst": ids[:, 1], "w": rng.random(m)})


@pytest.fixture
def caches() -> Any:
    backend = HostBackend(device_total_bytes=512 * MIB)
    with DeviceResidentCaches([DeviceProfile(0, 64 * MIB, 256 * MIB)], backend=backend) as c:
        yield c


def _plan(algorithm: str = "pagerank", **kw: Any) -> Any:
    kw.setdefault("source", SOURCE)
    kw.setdefault("options", GraphOptions(directed=False))
    return plan_graph_run(algorithm, weight_column="w", **kw)


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = csr.build_graph

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(csr, "build_graph", counted)
    return calls


@pytest.mark.parametrize(("algorithm", "params"), RUNS)
def test_hit_after_miss_is_identical_and_does_not_build(
    caches: Any, monkeypatch: pytest.MonkeyPatch, algorithm: str, params: dict[str, Any]
) -> None:
    cache = caches.graph_cache(0)
    edges = _edges()
    plan = _plan(algorithm)
    builds = _count_builds(monkeypatch)
    miss = cache.run(plan, edges, **params)
    assert miss.status is GraphRunStatus.MISS
    assert builds == [1]
    hit = cache.run(plan, edges, **params)
    assert hit.status is GraphRunStatus.HIT
    assert builds == [1], "a hit must not build the graph again"
    assert hit.build_seconds == 0.0
    assert hit.result.to_arrow().equals(miss.result.to_arrow())
    uncached = run_graph(None, plan, edges, **params)
    assert uncached.status is GraphRunStatus.UNCACHED
    assert uncached.reason is GraphUncachedReason.NO_CACHE
    assert hit.result.to_arrow().equals(uncached.result.to_arrow())
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)


def test_one_parked_graph_serves_every_keyable_algorithm(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(1)
    statuses = [cache.run(_plan(a), edges, **p).status for a, p in RUNS]
    assert statuses == [GraphRunStatus.MISS] + [GraphRunStatus.HIT] * (len(RUNS) - 1)
    assert cache.graph_stats().builds == 1


def test_only_the_measured_parked_graph_stays_charged(caches: Any) -> None:
    cache = caches.graph_cache(0)
    cache.run(_plan(), _edges(2))
    snap = caches.ledger(0).snapshot()
    domain = caches.factory(0).domain
    with cache.checkout(_plan().key) as handle:
        graph = handle.value
        measured = domain.measured_bytes(graph.device_arrays())
        assert handle.entry.nbytes == measured
        del graph
    assert snap.cache_evictable_resident_bytes == measured
    assert snap.cache_reserved_bytes == snap.cache_pinned_in_use_bytes == 0
    assert snap.cache_charged_bytes == measured  # no build or headroom charge left
    assert domain.used_bytes() == measured  # the build's transients are gone


def test_the_key_changes_with_every_contract_field() -> None:
    base = ResidentGraphKey(SOURCE, "src", "dst", "w", GraphOptions())
    assert base == ResidentGraphKey(SOURCE, "src", "dst", "w", GraphOptions())
    assert (
        base.fingerprint == ResidentGraphKey(SOURCE, "src", "dst", "w", GraphOptions()).fingerprint
    )
    other_source = dataclasses.replace(SOURCE, source=("local", "/data/edges.parquet", "etag-2"))
    variants = [
        ResidentGraphKey(other_source, "src", "dst", "w", GraphOptions()),
        ResidentGraphKey(("proven", "identity"), "src", "dst", "w", GraphOptions()),
        ResidentGraphKey(SOURCE, "a", "dst", "w", GraphOptions()),
        ResidentGraphKey(SOURCE, "src", "b", "w", GraphOptions()),
        ResidentGraphKey(SOURCE, "src", "dst", None, GraphOptions()),
        ResidentGraphKey(SOURCE, "src", "dst", "w2", GraphOptions()),
    ]
    changed = {
        "directed": False,
        "drop_self_loops": True,
        "duplicates": "max",
        "vertex_dtype": "int64",
        "weight_dtype": "float64",
        "orientation": "transposed",
    }
    assert set(changed) == {f.name for f in dataclasses.fields(GraphOptions)}
    for name, value in changed.items():
        options = GraphOptions(**{name: value})
        variants.append(ResidentGraphKey(SOURCE, "src", "dst", "w", options))
    for variant in variants:
        assert variant != base
        assert variant.fingerprint != base.fingerprint
    assert len({v.fingerprint for v in variants}) == len(variants)
    assert "etag" not in repr(base)  # only the fingerprint is shown


@pytest.mark.parametrize(
    ("kwargs", "algorithm", "reason"),
    [
        ({"source": None}, "pagerank", GraphUncachedReason.UNSTABLE_SOURCE),
        ({"source": ()}, "jaccard", GraphUncachedReason.UNSTABLE_SOURCE),
        (
            {"source": dataclasses.replace(SOURCE, empty_chunk=True)},
            "pagerank",
            GraphUncachedReason.SOURCE_BYPASS,
        ),
        ({"edge_id_column": "edge_id"}, "cosine", GraphUncachedReason.EDGE_ID_BINDING),
        ({"include_edges": True}, "bfs", GraphUncachedReason.INCLUDE_EDGES),
    ],
)
def test_unkeyable_plans_never_create_entries(
    caches: Any, kwargs: dict[str, Any], algorithm: str, reason: GraphUncachedReason
) -> None:
    cache = caches.graph_cache(0)
    plan = _plan(algorithm, **kwargs)
    assert plan.key is None
    assert plan.uncached_reason is reason
    params = {"sources": [10**12 + 3]} if algorithm == "bfs" else {}
    run = cache.run(plan, _edges(3), **params)
    assert run.status is GraphRunStatus.UNCACHED
    assert run.reason is reason
    stats = cache.stats()
    assert (stats.entries, stats.reservations, stats.hits, stats.misses) == (0, 0, 0, 0)
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    assert cache.graph_stats().uncached == {reason.value: 1}
    if kwargs.get("include_edges"):
        assert run.result.info["tree_edges"].num_rows > 0


def test_concurrent_duplicate_builds_reconcile_with_exact_charges(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches.graph_cache(0)
    both_missed = threading.Barrier(2, timeout=30)
    real = edges_module.edge_columns

    def read_together(*args: Any, **kwargs: Any) -> Any:
        both_missed.wait()  # both threads missed the same key and start to build it
        return real(*args, **kwargs)

    monkeypatch.setattr(edges_module, "edge_columns", read_together)
    edges = _edges(4)
    runs: list[Any] = []
    threads = [
        threading.Thread(target=lambda: runs.append(cache.run(_plan(), edges))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.status for r in runs] == [GraphRunStatus.MISS] * 2
    assert runs[0].result.to_arrow().equals(runs[1].result.to_arrow())
    stats = cache.stats()
    assert (stats.entries, stats.publishes, stats.duplicates) == (1, 1, 1)
    assert cache.graph_stats().builds == 2
    snap = caches.ledger(0).snapshot()
    with cache.checkout(_plan().key) as handle:
        kept = handle.entry.nbytes
    assert snap.cache_charged_bytes == snap.cache_evictable_resident_bytes == kept
    assert caches.factory(0).domain.used_bytes() == kept  # the loser's graph was freed


def test_no_headroom_on_a_hit_falls_back_uncached(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(5)
    parked = cache.run(_plan(), edges)
    ledger = caches.ledger(0)
    before = ledger.snapshot()
    grant = ledger.admit_grant("other-attempt", before.free_managed_bytes - 1024)
    run = cache.run(_plan(), edges)
    assert run.status is GraphRunStatus.UNCACHED
    assert run.reason is GraphUncachedReason.NO_HEADROOM
    assert run.result.to_arrow().equals(parked.result.to_arrow())
    after = ledger.snapshot()
    assert after.cache_evictable_resident_bytes == before.cache_evictable_resident_bytes
    assert after.cache_reserved_bytes == 0
    assert cache.stats().entries == 1  # still parked for later attempts
    ledger.release_grant(grant)
    assert cache.run(_plan(), edges).status is GraphRunStatus.HIT


def test_no_room_to_build_falls_back_and_keeps_nothing() -> None:
    backend = HostBackend(device_total_bytes=64 * MIB)
    with DeviceResidentCaches([DeviceProfile(0, 64 * 1024, 32 * MIB)], backend=backend) as c:
        run = c.graph_cache(0).run(_plan(), _edges(6))
        assert run.status is GraphRunStatus.UNCACHED
        assert run.reason is GraphUncachedReason.NO_HEADROOM
        assert "build not reserved" in run.detail
        assert c.graph_cache(0).stats().entries == 0
        assert c.ledger(0).snapshot().cache_charged_bytes == 0


def test_baseline_drift_destroys_the_graph_and_is_reported(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(7)
    first = cache.run(_plan(), edges)
    domain = caches.factory(0).domain
    leaked: list[Any] = []

    def leaky_pagerank(graph: Any, **params: Any) -> Any:
        leaked.append(domain.empty(4096, np.uint8))  # injected leak in the cache domain
        return pagerank(graph, **params)

    monkeypatch.setattr(ranking, "pagerank", leaky_pagerank)
    run = cache.run(_plan(), edges)
    assert run.status is GraphRunStatus.HIT
    assert run.drift_bytes == 4096
    assert "destroyed" in run.detail
    assert run.result.to_arrow().equals(first.result.to_arrow())
    assert cache.graph_stats().drifts == 1
    stats = cache.stats()
    assert (stats.entries, stats.destroyed) == (0, 1)
    snap = caches.ledger(0).snapshot()
    assert snap.cache_charged_bytes == 0  # the destroyed graph's charge is released
    assert snap.admission_open
    leaked.clear()
    monkeypatch.setattr(ranking, "pagerank", pagerank)
    assert cache.run(_plan(), edges).status is GraphRunStatus.MISS


def test_algorithm_errors_reach_the_caller_and_the_graph_stays_parked(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(8)
    cache.run(_plan("bfs"), edges, sources=[10**12 + 1])
    with pytest.raises(GraphInputError, match="not vertices"):
        cache.run(_plan("bfs"), edges, sources=[42])
    with cache.checkout(_plan().key) as handle:
        assert handle.entry.pins == 1
    assert caches.ledger(0).snapshot().cache_reserved_bytes == 0  # headroom released
    assert cache.run(_plan("bfs"), edges, sources=[10**12 + 1]).status is GraphRunStatus.HIT


@pytest.mark.parametrize(
    ("algorithm", "params", "error"),
    [
        ("bfs", {"sources": [42]}, GraphInputError),
        (
            "pagerank",
            {"max_iter": 1, "tol": 1e-30, "fail_on_nonconvergence": True},
            GraphConvergenceError,
        ),
    ],
)
def test_a_kept_error_of_a_parked_run_leaves_the_graph_free_to_tear_down(
    caches: Any, algorithm: str, params: dict[str, Any], error: type[Exception]
) -> None:
    # The error passed through the algorithm's frames, which held the parked graph.
    # Kept by the caller (a log, Dask's failed task, a REPL's last error), it used
    # to keep the graph's arrays alive past the pin: the teardown was then unsafe,
    # the graph stayed charged and admission on the device closed.
    cache = caches.graph_cache(0)
    edges = _edges(15)
    assert cache.run(_plan("bfs"), edges, sources=[10**12 + 1]).status is GraphRunStatus.MISS
    with pytest.raises(error) as kept:
        cache.run(_plan(algorithm), edges, **params)
    (shutdown,) = caches.shutdown(timeout=5.0)
    assert shutdown.graph is not None
    assert (shutdown.graph.destroyed, shutdown.graph.quarantined) == (1, 0)
    assert shutdown.complete, shutdown
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    # its traceback still says where it was raised (only the frames' locals went)
    assert "nexus_cache/graph/" in traceback.extract_tb(kept.tb)[-1].filename


def test_shutdown_drains_parked_graphs(caches: Any) -> None:
    cache = caches.graph_cache(0)
    cache.run(_plan(), _edges(9))
    results = caches.shutdown()
    assert all(r.complete for r in results)
    assert results[0].graph is not None
    assert results[0].graph.destroyed == 1
    run = cache.run(_plan(), _edges(9))
    assert run.reason is GraphUncachedReason.NO_CACHE


def test_parked_graph_matches_an_uncached_build(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(10)
    cache.run(_plan(), edges)
    reference = build_graph(edges, weight="w", options=GraphOptions(directed=False))
    with cache.checkout(_plan().key) as handle:
        for got, want in zip(handle.value.arrays(), reference.arrays(), strict=True):
            assert np.array_equal(got, want)
        assert handle.entry.state is ResidencyState.PINNED


def test_build_and_run_blocks_go_back_to_the_device(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(11)
    cache.run(_plan(), edges)
    cache.run(_plan("jaccard"), edges)
    counters = caches.factory(0).counters()
    charged = caches.ledger(0).snapshot().cache_charged_bytes
    assert counters.used_bytes == counters.held_bytes == charged


def test_many_threads_leave_exact_charges_and_a_clean_shutdown(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edge_sets = [_edges(20), _edges(21)]
    sources = [("proven", 20), ("proven", 21)]
    expected = {
        (i, a): run_graph(None, _plan(a, source=sources[i]), edge_sets[i], **p).result.to_arrow()
        for i in range(2)
        for a, p in RUNS
    }
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(6):
                i = int(rng.integers(2))
                algorithm, params = RUNS[int(rng.integers(len(RUNS)))]
                run = cache.run(_plan(algorithm, source=sources[i]), edge_sets[i], **params)
                assert run.status is not GraphRunStatus.UNCACHED
                assert run.result.to_arrow().equals(expected[(i, algorithm)])
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    stats = cache.stats()
    assert stats.entries == 2
    assert stats.publishes == 2
    assert cache.graph_stats().builds == 2 + stats.duplicates
    snap = caches.ledger(0).snapshot()
    assert snap.cache_reserved_bytes == snap.cache_pinned_in_use_bytes == 0
    assert caches.factory(0).domain.used_bytes() == snap.cache_charged_bytes
    results = caches.shutdown()
    assert all(r.complete for r in results)
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0


def test_drift_waits_for_other_pins_before_destroying(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(12)
    cache.run(_plan(), edges)
    domain = caches.factory(0).domain
    leaked: list[Any] = []

    def leaky_pagerank(graph: Any, **params: Any) -> Any:
        leaked.append(domain.empty(512, np.uint8))
        return pagerank(graph, **params)

    monkeypatch.setattr(ranking, "pagerank", leaky_pagerank)
    reader = cache.checkout(_plan().key)  # another attempt still reads the graph
    assert reader is not None
    runs: list[Any] = []
    worker = threading.Thread(target=lambda: runs.append(cache.run(_plan(), edges)))
    worker.start()
    for _ in range(2000):  # until the drifted run blocked new pins and waits for ours
        if reader.entry.pins_blocked:
            break
        threading.Event().wait(0.005)
    assert reader.entry.pins_blocked
    assert cache.checkout(_plan().key) is None  # no new pins on a graph being destroyed
    reader.release()
    worker.join(30)
    assert runs[0].drift_bytes == 512
    assert runs[0].detail.endswith("the graph: destroyed")
    assert reader.entry.state is ResidencyState.DESTROYED
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    leaked.clear()


def _interrupt(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, interrupted)


def test_an_interrupt_before_a_run_releases_the_pin(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(13)
    cache.run(_plan(), edges)
    memory = importlib.import_module("nexus_cache.graph.memory")
    real = memory.transient_bytes
    _interrupt(monkeypatch, memory, "transient_bytes")  # Ctrl-C while sizing the headroom
    with pytest.raises(KeyboardInterrupt):
        cache.run(_plan(), edges)
    snap = caches.ledger(0).snapshot()
    assert snap.cache_pinned_in_use_bytes == 0
    assert snap.cache_reserved_bytes == 0
    monkeypatch.setattr(memory, "transient_bytes", real)
    assert cache.run(_plan(), edges).status is GraphRunStatus.HIT  # still parked
    (shutdown,) = caches.shutdown(timeout=5.0)
    assert shutdown.complete


def test_an_interrupt_during_a_build_abandons_the_reservation(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = caches.graph_cache(0)
    _interrupt(monkeypatch, csr, "build_graph")
    with pytest.raises(KeyboardInterrupt):
        cache.run(_plan(), _edges(14))
    stats = cache.stats()
    assert (stats.in_flight, stats.entries, stats.abandoned) == (0, 0, 1)
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    (shutdown,) = caches.shutdown(timeout=5.0)
    assert shutdown.complete


def test_a_newer_identity_at_a_location_retires_the_older_graphs(caches: Any) -> None:
    cache = caches.graph_cache(0)
    edges = _edges(15)

    def plan(identity: str, location: str) -> Any:
        return _plan(source=(identity,), source_location=location)

    assert cache.run(plan("v1", "/lake/a"), edges).status is GraphRunStatus.MISS
    assert cache.run(plan("other", "/lake/b"), edges).status is GraphRunStatus.MISS
    pinned = cache.checkout(plan("v1", "/lake/a").key)  # a query still runs on v1
    assert pinned is not None
    assert cache.run(plan("v2", "/lake/a"), edges).status is GraphRunStatus.MISS
    assert cache.stats().entries == 3  # v1 is in use: it stays for now
    pinned.release()
    assert cache.run(plan("v2", "/lake/a"), edges).status is GraphRunStatus.HIT
    assert cache.stats().entries == 2  # v1 retired; /lake/b untouched
    assert cache.checkout(plan("v1", "/lake/a").key) is None
    with cache.checkout(plan("other", "/lake/b").key) as handle:
        assert handle is not None
    stats = cache.graph_stats()
    assert stats.retired == 1
    assert stats.retired_bytes > 0
    snap = caches.ledger(0).snapshot()
    assert snap.cache_charged_bytes == cache.resident_bytes()  # v1's bytes went back


def test_an_empty_edge_table_runs_cached_like_uncached(caches: Any) -> None:
    check_empty_edge_table(caches, empty_edges(), SOURCE)


def test_a_graph_of_vertices_without_arcs_is_parked(caches: Any) -> None:
    loops = pa.table({"src": pa.array([5, 9]), "dst": pa.array([5, 9])})
    check_vertices_without_arcs(caches, loops, SOURCE)


def test_on_ready_says_how_the_cache_answered_before_the_algorithm_runs(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Miss, hit and uncached: ``on_ready`` is called once, before the
    algorithm (which here fails, as a cancel would stop it)."""
    cache = caches.graph_cache(0)
    edges = _edges(2)
    seen: list[tuple[GraphRunStatus, Any, str]] = []

    def ready(status: GraphRunStatus, reason: Any, detail: str) -> None:
        seen.append((status, reason, detail))

    def stopped(*args: Any, **kwargs: Any) -> Any:
        assert len(seen) == 1, "the algorithm ran before on_ready"
        raise KeyboardInterrupt

    monkeypatch.setattr(ranking, "pagerank", stopped)  # the registry looks it up per run
    expected = [
        (GraphRunStatus.MISS, None, "parked"),
        (GraphRunStatus.HIT, None, "parked"),
        (GraphRunStatus.UNCACHED, GraphUncachedReason.NO_CACHE, "no graph cache"),
    ]
    for graph_cache, want in zip([cache, cache, None], expected, strict=True):
        seen.clear()
        with pytest.raises(KeyboardInterrupt):
            run_graph(graph_cache, _plan(), edges, on_ready=ready, alpha=0.9)
        assert seen == [want]
    assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes == 0


# What a cached run hands back is copied out of the cache's memory. CuPy serves
# ndarray.copy() and astype() with its element-copy kernel, compiled per dtype and
# layout on first use: BFS's bool validity masks met it first in a real query (the
# warm-up runs uncached), so a fresh machine compiled it there.
_ELEMENT_COPIES: list[tuple[str, str]] = []


class _CountedArray(np.ndarray):
    """A NumPy array that records the calls CuPy serves with its element-copy kernel."""

    def copy(self, order: Any = "C") -> Any:
        _ELEMENT_COPIES.append(("copy", self.dtype.name))
        return super().copy(order)

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> Any:
        _ELEMENT_COPIES.append(("astype", self.dtype.name))
        return super().astype(dtype, *args, **kwargs)


def test_a_cached_run_hands_its_result_over_with_no_element_copy(
    caches: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ELEMENT_COPIES.clear()
    traversal = importlib.import_module("nexus_cache.graph.traversal")
    real = traversal.bfs
    returned: list[Any] = []

    def counted_bfs(graph: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(graph, *args, **kwargs)
        columns = {name: result[name].view(_CountedArray) for name in result}
        masks = {
            name: m.view(_CountedArray) for name in result if (m := result.valid(name)) is not None
        }
        assert {m.dtype.name for m in masks.values()} == {"bool"}
        returned.append(type(result)(columns, valid=masks, info=result.info))
        return returned[-1]

    monkeypatch.setattr(traversal, "bfs", counted_bfs)
    cache = caches.graph_cache(0)
    plan = _plan("bfs")
    runs = [cache.run(plan, _edges(), sources=[10**12 + 3]) for _ in range(2)]
    assert [r.status for r in runs] == [GraphRunStatus.MISS, GraphRunStatus.HIT]
    assert _ELEMENT_COPIES == []
    monkeypatch.undo()
    expected = run_graph(None, plan, _edges(), sources=[10**12 + 3]).result.to_arrow()
    for run, ran in zip(runs, returned, strict=True):
        assert run.result.to_arrow().equals(expected)
        handed = [run.result[n] for n in run.result] + [
            m for n in run.result if (m := run.result.valid(n)) is not None
        ]
        inside = [ran[n] for n in ran] + [m for n in ran if (m := ran.valid(n)) is not None]
        assert len(handed) == len(inside) == 5  # vertex, distance, predecessor, two masks
        assert not any(np.shares_memory(a, b) for a in handed for b in inside)
