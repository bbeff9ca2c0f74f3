"""The main job: every cache at work on an embedded default, nothing to set up.

:func:`run_demo` writes an R-MAT edge table and a fact table as Parquet into
a directory that stands in for the remote lakehouse, starts a
:class:`QueryService` with a local lakehouse cache root beside it (policy
``fill_before_read``), warms it up (:meth:`QueryService.warm_up`: the
one-time GPU kernel compilation, timed on its own), and runs a query mix
(scan, count, PageRank, PageRank on a time window of the edges, BFS,
Jaccard) once cold and then warm (median of three runs). It returns a
:class:`DemoReport`: per query the cold and warm times, the cache statuses of
both, and whether every warm result equals the cold one; plus the device cache reports taken before
shutdown. The command ``nexus-cache demo`` prints it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nexus_cache._env import raw
from nexus_cache.backends import backend_kind
from nexus_cache.errors import ConfigError
from nexus_cache.graph import HOST_ENGINE_VARIABLE
from nexus_cache.graph.registry import ALGORITHMS
from nexus_cache.lakehouse import FillPolicy, LakehouseCacheConfig
from nexus_cache.service.config import ServiceConfig
from nexus_cache.service.datagen import EDGE_YEAR, fact_table, rmat_edges, write_parquet
from nexus_cache.service.queries import Count, GraphQuery, Query, Scan
from nexus_cache.service.result import QueryResult, tables_match
from nexus_cache.service.service import QueryService

__all__ = [
    "DEFAULT_SCALE",
    "QUICK_DEMO_S",
    "WINDOW",
    "WINDOW_QUERY",
    "DemoQuery",
    "DemoReport",
    "demo_config",
    "demo_queries",
    "estimate_demo_seconds",
    "run_demo",
]

#: R-MAT scale of the default demo (2**12 vertices, 2**16 edges): seconds on a laptop
DEFAULT_SCALE = 12

#: the estimated run time (seconds) above which ``nexus-cache demo`` asks first
QUICK_DEMO_S = 180.0

# (scale, seconds, factor per scale step) of the whole command (start-up, data
# generation, warm-up, the cold pass and three warm runs of the mix), measured
# on the 2-core CI machine on 2026-12-04. host with Numba (the host extra): 5 s
# at scale 16, 21 s at 18; host with NumPy alone: 3 s at 12, 19 s at 14
# (Jaccard is most of it and grows faster than the edge count). A device
# backend (cuda): the H200's scale-16 run (about 1.5 s of queries) with the
# edge count's factor.
_COST = {
    "host-numba": (18, 21.0, 2.1),
    "host-numpy": (14, 19.0, 2.6),
    "device": (16, 1.5, 2.0),
}


def _host_engine() -> str:
    """Which host graph engine a query will use: ``numba`` when it imports and
    ``NEXUS_GRAPH_HOST_ENGINE`` does not say ``numpy``, else ``numpy``."""
    choice = (raw(HOST_ENGINE_VARIABLE) or "").strip().lower()
    if choice == "numpy" or importlib.util.find_spec("numba") is None:
        return "numpy"
    return "numba"


def estimate_demo_seconds(scale: int, backend: str) -> float:
    """A rough estimate of the demo's run time at ``scale`` on the backend named
    ``backend`` (``host``, with the host graph engine that will run, or
    ``cuda``); a guide for a prompt, not a promise. Raises
    :class:`ConfigError` for a name that is not a registered backend."""
    key = f"host-{_host_engine()}" if backend_kind(backend).host_memory else "device"
    at, seconds, factor = _COST[key]
    return float(seconds * factor ** (scale - at))


#: called as progress(phase, done, total) with phase in "generate", "warm-up", "cold", "warm"
Progress = Callable[[str, int, int], None]
#: called with a short line saying what runs now ("cold run: jaccard (query 5 of 5)")
Status = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class DemoQuery:
    """One query of the mix: both timings, both runs' statuses, and the equality check."""

    name: str
    query: dict[str, Any]
    rows: int
    cold_s: float
    warm_s: float
    cold: dict[str, Any]
    warm: dict[str, Any]
    equal: bool
    #: earlier queries of the mix that read the same source: the caches they
    #: filled serve this query's cold run (empty when it starts on empty caches)
    warmed_by: tuple[str, ...] = ()

    @property
    def speedup(self) -> float:
        return self.cold_s / self.warm_s if self.warm_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["speedup"] = round(self.speedup, 2)
        return out


@dataclasses.dataclass(frozen=True)
class DemoReport:
    """The whole demo: settings, one row per query, device reports; ``ok`` when
    every warm result equals its cold result. ``warmup_s`` is the service's
    warm-up before the cold pass (kernel compilation, once per machine and
    process), which the cold times therefore exclude."""

    backend: str
    scale: int
    edges: int
    fact_rows: int
    queries: tuple[DemoQuery, ...]
    device_cache_reports: tuple[dict[str, Any], ...]
    workdir: str | None
    warmup_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(q.equal for q in self.queries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "backend": self.backend,
            "scale": self.scale,
            "edges": self.edges,
            "fact_rows": self.fact_rows,
            "workdir": self.workdir,
            "warmup_s": self.warmup_s,
            "queries": [q.to_dict() for q in self.queries],
            "device_cache_reports": list(self.device_cache_reports),
        }


#: the time window of the filtered query: the second quarter of the edges' year
WINDOW = (
    ("ts", ">=", f"{EDGE_YEAR}-04-01T00:00:00Z"),
    ("ts", "<", f"{EDGE_YEAR}-07-01T00:00:00Z"),
)
#: the algorithm the filtered query runs: the registry's first demo algorithm
#: (PageRank), so its cold run finds the columns that algorithm decoded
_WINDOWED = next(spec.name for spec in ALGORITHMS.values() if spec.demo)
#: the filtered query's name in the mix
WINDOW_QUERY = f"{_WINDOWED}-q2"


def demo_queries(edges: str, facts: str, start_vertex: int) -> list[tuple[str, Query]]:
    """The query mix, in run order: a scan, a count, and each algorithm whose spec
    is marked for the demo (directed or not as its spec says by default; a vertex
    it requires is ``start_vertex``); right after PageRank, PageRank on the edges of
    the time :data:`WINDOW` (:data:`WINDOW_QUERY`).

    Every graph query reads the same columns of the edges (``src``, ``dst`` and the
    window's ``ts``), so the filtered query's cold run finds the columns PageRank
    decoded (a source-cache hit) and builds a graph of its own (a graph-cache miss)."""
    edge_scan = Scan(edges, columns=("src", "dst", "ts"))
    mix: list[tuple[str, Query]] = [
        ("scan", Scan(facts, columns=("order_id", "amount", "region"))),
        ("count", Count(facts)),
    ]
    for spec in ALGORITHMS.values():
        if spec.demo:
            params = spec.sample_params(start_vertex)
            mix.append((spec.name, GraphQuery(edge_scan, "src", "dst", spec.name, params=params)))
            if spec.name == _WINDOWED:
                window = dataclasses.replace(edge_scan, filter=(WINDOW,))
                mix.append((WINDOW_QUERY, GraphQuery(window, "src", "dst", spec.name)))
    return mix


def _warmed_by(mix: list[tuple[str, Query]]) -> list[tuple[str, ...]]:
    """Per query, the earlier queries of the mix that read its source."""
    out = []
    for i, (_name, query) in enumerate(mix):
        out.append(tuple(n for n, q in mix[:i] if q.scan.source == query.scan.source))
    return out


def _without_root(value: Any, root: str) -> Any:
    """``value`` with the temporary directory's path cut from its strings: the
    report must not name files that are deleted when it is returned."""
    if isinstance(value, str):
        return value.replace(root + "/", "").replace(root, ".")
    if isinstance(value, dict):
        return {k: _without_root(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_root(v, root) for v in value)
    return value


def _statuses(result: QueryResult) -> dict[str, Any]:
    d = result.diagnostics
    return {
        "lakehouse": d.lakehouse["status"],
        "lakehouse_read": d.lakehouse["read"],
        "source_cache": d.source_cache["status"],
        "source_reason": d.source_cache["reason"],
        "graph_cache": d.graph_cache["status"],
        "graph_reason": d.graph_cache["reason"],
        "attempts": len(d.attempts),
    }


@contextlib.contextmanager
def _workdir(path: str | Path | None) -> Iterator[Path]:
    if path is not None and not str(path).strip():
        # Path("") is the working directory: the demo would fill it with its
        # lake, cache root and evidence
        raise ConfigError(
            f"workdir={str(path)!r} is empty; give a directory, or leave it out for a "
            "temporary one"
        )
    if path is not None:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"workdir={str(path)!r} cannot be used ({exc.strerror or exc}); "
                "give a directory you can write, or leave it out"
            ) from None
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="nexus-demo-") as tmp:
        yield Path(tmp)


def run_demo(
    *,
    scale: int | None = None,
    fact_rows: int | None = None,
    workdir: str | Path | None = None,
    backend: str = "auto",
    cache_cap_bytes: int | None = None,
    warm_runs: int = 3,
    progress: Progress | None = None,
    status: Status | None = None,
) -> DemoReport:
    """Generate the data, run the mix cold then warm, shut the service down.

    ``workdir`` keeps the lake, the cache root and the evidence (default: a
    temporary directory, removed afterwards). ``fact_rows`` defaults to
    ``2**(scale+4)`` (as many rows as edges). The service is warmed up
    first (timed apart as ``warmup_s``), so the cold time is one run on
    empty caches with the kernels already compiled; the warm time is the
    median of ``warm_runs`` runs, each of which must match the cold result
    (:func:`tables_match`: identical but for the last bits of floats, which
    GPU reductions do not fix).

    The caches start empty once, before the cold pass: a query whose source
    an earlier query of the mix read finds it cached (``DemoQuery.warmed_by``
    names those queries). ``status`` is told what runs before each step.
    With a temporary ``workdir`` the report names files relative to it
    (``lake/edges.parquet``): the directory is gone when the report returns.
    """
    tick = progress or (lambda phase, done, total: None)
    say = status or (lambda line: None)
    scale = DEFAULT_SCALE if scale is None else scale
    rows = fact_rows if fact_rows is not None else 16 << scale
    with _workdir(workdir) as root:
        lake = root / "lake"
        lake.mkdir(exist_ok=True)
        tick("generate", 0, 2)
        say(f"generating {16 << scale} R-MAT edges")
        edge_table = rmat_edges(scale, timestamps=True)
        write_parquet(edge_table, lake / "edges.parquet")
        tick("generate", 1, 2)
        say(f"generating {rows} fact rows")
        write_parquet(fact_table(rows), lake / "facts.parquet")
        tick("generate", 2, 2)
        start_vertex = int(edge_table.column("src")[0].as_py())
        config = demo_config(root, backend, cache_cap_bytes)
        mix = demo_queries(str(lake / "edges.parquet"), str(lake / "facts.parquet"), start_vertex)
        with QueryService(config) as service:
            tick("warm-up", 0, 1)
            say("warm-up: every query path once, outside the caches")
            warmup_s = service.warm_up()
            tick("warm-up", 1, 1)
            cold = _run_pass(service, mix, "cold", tick, 1, say)
            warm = _run_pass(service, mix, "warm", tick, warm_runs, say)
            reports = tuple(r.to_dict() for r in service.device_cache_reports())
            backend_name = service.backend.name
        queries = tuple(
            DemoQuery(
                name=name,
                query=query.to_dict(),
                rows=c_results[0].table.num_rows,
                cold_s=c_time,
                warm_s=w_time,
                cold=_statuses(c_results[0]),
                warm=_statuses(w_results[-1]),
                equal=all(tables_match(c_results[0].table, w.table) for w in w_results),
                warmed_by=warmed,
            )
            for (name, query), (c_results, c_time), (w_results, w_time), warmed in zip(
                mix, cold, warm, _warmed_by(mix), strict=True
            )
        )
        if workdir is None:
            queries = tuple(
                dataclasses.replace(
                    q,
                    query=_without_root(q.query, str(root)),
                    cold=_without_root(q.cold, str(root)),
                    warm=_without_root(q.warm, str(root)),
                )
                for q in queries
            )
            reports = _without_root(reports, str(root))
        return DemoReport(
            backend=backend_name,
            scale=scale,
            edges=edge_table.num_rows,
            fact_rows=rows,
            queries=queries,
            device_cache_reports=reports,
            workdir=None if workdir is None else str(root),
            warmup_s=warmup_s,
        )


def demo_config(root: Path, backend: str, cache_cap_bytes: int | None = None) -> ServiceConfig:
    """The demo's service settings: evidence and a ``fill_before_read`` lakehouse
    cache root under ``root``."""
    return ServiceConfig(
        backend=backend,
        cache_cap_bytes=cache_cap_bytes,
        evidence_dir=root / "evidence",
        lakehouse=LakehouseCacheConfig(
            root=root / "cache",
            policy=FillPolicy.FILL_BEFORE_READ,
            max_bytes=4 << 30,
            # the demo wrote and closed its files itself: they are complete
            local_min_age_s=0.0,
        ),
    )


def _run_pass(
    service: QueryService,
    mix: list[tuple[str, Query]],
    phase: str,
    tick: Progress,
    runs: int,
    say: Status,
) -> list[tuple[list[QueryResult], float]]:
    """Each query ``runs`` times in a row: its results and its median time."""
    out = []
    tick(phase, 0, len(mix) * runs)
    done = 0
    for number, (name, query) in enumerate(mix, start=1):
        results, times = [], []
        for run in range(1, runs + 1):
            if runs == 1:
                say(f"{phase} run: {name} (query {number} of {len(mix)})")
            else:
                say(f"{phase} runs: {name} (query {number} of {len(mix)}, run {run} of {runs})")
            start = time.perf_counter()
            results.append(service.execute(query))
            times.append(time.perf_counter() - start)
            done += 1
            tick(phase, done, len(mix) * runs)
        out.append((results, statistics.median(times)))
    return out
