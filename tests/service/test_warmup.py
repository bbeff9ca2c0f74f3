"""QueryService.warm_up on the host backend: every path runs once, nothing is left behind."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_cache.errors import LifecycleError
from nexus_cache.graph import ALGORITHMS
from nexus_cache.service import QueryService

from ._helpers import make_service

warmup = importlib.import_module("nexus_cache.service.warmup")
traversal = importlib.import_module("nexus_cache.graph.traversal")


def _leftovers(service: QueryService, root: Path) -> dict[str, object]:
    gc.collect()
    reports = [r.to_dict() for r in service.device_cache_reports()]
    return {
        "grants": [r["grant_count"] for r in reports],
        "charged": [r["cache_charged_bytes"] for r in reports],
        "source entries": [r["source_entries"] for r in reports],
        "graph entries": [r["graph_entries"] for r in reports],
        "cache domain used": [r["domain_used_bytes"] for r in reports],
        "work domain used": [service._work[d].used_bytes() for d in service.caches.device_ids],
        "lakehouse files": sorted(
            p.name for p in (root / "cache").rglob("*") if p.is_file() and "stats" not in p.parts
        ),
        "evidence": sorted(p.name for p in (root / "evidence").glob("*") if p.is_file()),
        "admission lines": len(service.admission_log.lines),
    }


_COUNTS = (
    "grants",
    "charged",
    "source entries",
    "graph entries",
    "cache domain used",
    "work domain used",
)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[QueryService]:
    with make_service(tmp_path) as svc:
        yield svc


def test_warm_up_returns_its_seconds_and_leaves_nothing(
    tmp_path: Path, service: QueryService
) -> None:
    before = _leftovers(service, tmp_path)
    seconds = service.warm_up()
    assert isinstance(seconds, float)
    assert seconds > 0
    after = _leftovers(service, tmp_path)
    assert after == before
    assert {k: after[k] for k in _COUNTS} == {key: [0] for key in _COUNTS}
    assert after["admission lines"] == 0


def test_warm_up_charges_nothing_on_two_devices(tmp_path: Path) -> None:
    from nexus_cache.backends import HostBackend

    from ._helpers import make_config

    backend = HostBackend(device_total_bytes=1 << 30, device_count=2)
    with QueryService(make_config(tmp_path), backend=backend) as svc:
        before = _leftovers(svc, tmp_path)
        report = svc.warm_up_report()
        assert [d.device_id for d in report.devices] == [0, 1]
        assert _leftovers(svc, tmp_path) == before
        assert before["grants"] == [0, 0]
        assert before["work domain used"] == [0, 0]


def test_every_algorithm_and_both_bfs_steps_run(
    service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The NumPy BFS steps are what is spied on (the Numba engine runs one loop).
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "numpy")
    calls = {"push": 0, "pull": 0}
    for step in calls:
        real = getattr(traversal, f"_{step}_step")

        def counted(*args: object, step: str = step, real: object = real) -> None:
            calls[step] += 1
            real(*args)  # type: ignore[operator]

        monkeypatch.setattr(traversal, f"_{step}_step", counted)
    report = service.warm_up_report()
    steps = report.devices[0].steps
    assert steps[:3] == ("decode", "scan result", "source copy")
    from nexus_cache.graph import ALGORITHMS as SPECS

    for algorithm in ALGORITHMS:
        assert f"{algorithm} (undirected)" in steps
        directed = f"{algorithm} (directed)" in steps
        assert directed is not SPECS[algorithm].undirected_only
    assert calls["push"] > 0
    assert calls["pull"] > 0
    assert report.backend == "host"
    assert report.devices[0].kernels == ()  # the host backend compiles nothing


def test_an_interrupted_warm_up_releases_what_it_allocated(
    tmp_path: Path, service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = []

    def interrupted(*args: object) -> None:
        ran.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(warmup, "_run_graph", interrupted)
    with pytest.raises(KeyboardInterrupt):
        service.warm_up()
    assert ran == [1]
    gc.collect()
    assert service._work[0].used_bytes() == 0
    assert service._work.borrowers(0) == 0
    monkeypatch.undo()
    assert service.warm_up() > 0  # the service is still usable


def test_a_query_after_warm_up_runs_cold(tmp_path: Path, service: QueryService) -> None:
    from nexus_cache.service import Scan

    from ._helpers import make_lake

    lake = make_lake(tmp_path)
    service.warm_up()
    result = service.execute(Scan(lake.facts))
    assert result.diagnostics.source_cache["status"] == "miss-led"
    assert result.diagnostics.lakehouse["status"] == "miss"


def test_warm_up_after_shutdown_is_refused(service: QueryService) -> None:
    service.shutdown()
    with pytest.raises(LifecycleError, match="shut down"):
        service.warm_up()


# R-MAT labels are a random permutation: at scale 8 (seed 1) vertex 0 has no edge,
# so a warm-up that made up vertex 0 for BFS fails there, as it did at scale 16.
_SMALL_SCALE = 8


class _Injected(Exception):
    """The failure a test injects into one warm-up step."""


def _large_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CUDA-only large-graph step on the host backend, at a small scale."""
    monkeypatch.setattr(warmup, "_large_scale", lambda backend: _SMALL_SCALE)


def test_the_large_graph_step_runs_on_the_host_from_a_vertex_of_its_graph(
    tmp_path: Path, service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.service.datagen import rmat_edges

    table = rmat_edges(_SMALL_SCALE)
    assert 0 not in set(table["src"].to_pylist()) | set(table["dst"].to_pylist())
    _large_on_the_host(monkeypatch)
    ran: list[tuple[str, ...]] = []
    real = warmup._warm_large

    def spied(*args: object) -> tuple[str, ...]:
        ran.append(real(*args))  # type: ignore[arg-type]
        return ran[-1]

    monkeypatch.setattr(warmup, "_warm_large", spied)
    before = _leftovers(service, tmp_path)
    report = service.warm_up_report()
    assert report.devices[0].steps[-1] == f"graph algorithms at scale {_SMALL_SCALE}"
    from nexus_cache.graph import ALGORITHMS as SPECS

    expected = {f"{name} (undirected)" for name in SPECS} | {
        f"{name} (directed)" for name, spec in SPECS.items() if not spec.undirected_only
    }
    assert len(ran) == 1
    assert set(ran[0]) == expected
    assert _leftovers(service, tmp_path) == before


def _fail_in_pagerank(monkeypatch: pytest.MonkeyPatch) -> None:
    """PageRank fails after its graph was built (on the tiny table)."""

    def failing(graph: object, **kwargs: object) -> None:
        raise _Injected("pagerank")

    monkeypatch.setattr(importlib.import_module("nexus_cache.graph.ranking"), "pagerank", failing)


def _fail_after_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The source copy fails after the copy was allocated."""
    from nexus_cache.frames import DeviceFrame

    real = DeviceFrame.copy_into

    def failing(self: DeviceFrame, *args: object, **kwargs: object) -> None:
        copy = real(self, *args, **kwargs)  # type: ignore[arg-type]
        raise _Injected(f"copy of {copy.nbytes} B")

    monkeypatch.setattr(DeviceFrame, "copy_into", failing)


def _fail_in_the_large_graph_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cosine fails on the large graph only (the tiny table's runs pass)."""
    similarities = importlib.import_module("nexus_cache.graph.similarities")
    real = similarities.cosine

    def failing(graph: object, **kwargs: object) -> object:
        if graph.n_vertices > 100:  # type: ignore[attr-defined]
            raise _Injected("cosine on the large graph")
        return real(graph, **kwargs)

    _large_on_the_host(monkeypatch)
    monkeypatch.setattr(similarities, "cosine", failing)


_FAILURES = {
    "graph run": _fail_in_pagerank,
    "source copy": _fail_after_the_copy,
    "large graph": _fail_in_the_large_graph_step,
}


@pytest.mark.parametrize("step", list(_FAILURES))
def test_a_failed_step_leaves_the_domain_as_lent(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the caller still holds the exception (as a handler that closes the
    domain does), every byte the failed step allocated is free again."""
    from nexus_cache.backends import HostBackend

    backend = HostBackend(device_total_bytes=1 << 30, device_count=1)
    domain = backend.create_domain(0)
    _FAILURES[step](monkeypatch)

    def warm_up_then_close() -> None:
        try:
            warmup.warm_up_device(backend, 0, domain)
        finally:  # the exception is in flight here
            assert domain.used_bytes() == 0
            domain.close()  # refused while bytes are live

    with pytest.raises(_Injected) as failed:
        warm_up_then_close()
    assert failed.value.__traceback__ is not None  # still held: its frames hold nothing
    assert backend.mem_info(0).free_bytes == backend.mem_info(0).total_bytes


@pytest.mark.parametrize("step", list(_FAILURES))
def test_a_failed_step_leaves_the_service_s_domain_and_ledger_as_they_were(
    step: str, tmp_path: Path, service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _leftovers(service, tmp_path)
    ledger = service.caches.ledger(0).snapshot()
    _FAILURES[step](monkeypatch)
    with pytest.raises(_Injected) as failed:
        service.warm_up()
    assert _leftovers(service, tmp_path) == before  # with the exception still held
    assert service.caches.ledger(0).snapshot() == ledger
    assert service._work.borrowers(0) == 0
    del failed
    monkeypatch.undo()
    assert service.warm_up() > 0  # the service is still usable


# The demo's first BFS (R-MAT scale 20, directed, from the source of the first
# edge): a frontier of 654 vertices there is a length class (513..1024) that no
# frontier of the warm-up's scale-16 BFS had, and CuPy compiled its reduction
# kernels on that first query.
_QUERY_SCALE = 20


@pytest.mark.slow
def test_the_warm_up_compiled_every_reduction_a_scale_20_bfs_runs(
    service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.graph import build_graph
    from nexus_cache.graph._reductions import recording
    from nexus_cache.graph.registry import get_spec
    from nexus_cache.service.datagen import rmat_edges

    # the NumPy BFS runs the CUDA path's loop (the Numba engine runs its own)
    monkeypatch.setenv("NEXUS_GRAPH_HOST_ENGINE", "numpy")
    # the warm-up as on CUDA (its large-graph step at its own scale), BFS only
    monkeypatch.setattr(warmup, "_large_scale", lambda backend: warmup._LARGE_SCALE)
    monkeypatch.setattr(warmup, "ALGORITHMS", {"bfs": get_spec("bfs")})
    with recording() as warmed:
        steps = service.warm_up_report().devices[0].steps
    assert f"graph algorithms at scale {warmup._LARGE_SCALE}" in steps
    table = rmat_edges(_QUERY_SCALE)
    edges = {"src": table["src"].to_numpy(), "dst": table["dst"].to_numpy()}
    source = int(table["src"][0].as_py())
    with recording() as queried:
        for directed in (True, False):
            options = get_spec("bfs").options(
                directed, weight_dtype="float64", vertex_dtype="int32"
            )
            traversal.bfs(build_graph(edges, options=options), source)
    assert queried - warmed == set()


def test_every_graph_run_hands_its_result_over_as_a_cached_run_does(
    service: QueryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query's graph run goes through the graph cache, which copies the result
    out of the cache's memory (GraphResult.copy); the warm-up runs uncached, so
    it makes that copy itself, or a first query would launch it first (on CUDA:
    kernels compiled in the query)."""
    from nexus_cache.graph import GraphResult

    copied: list[tuple[str, ...]] = []
    real = GraphResult.copy

    def spied(self: GraphResult) -> GraphResult:
        copied.append(tuple(self))
        return real(self)

    monkeypatch.setattr(GraphResult, "copy", spied)
    steps = service.warm_up_report().devices[0].steps
    graph_steps = [s for s in steps if s.split(" (")[0] in ALGORITHMS]
    assert len(graph_steps) > len(ALGORITHMS)
    assert len(copied) == len(graph_steps)
    assert ("vertex", "distance", "predecessor") in copied  # BFS's, with its masks
