"""The main job: every cache at work on an embedded default, nothing to set up.

:func:`run_demo` writes an R-MAT edge table and a fact table as Parquet into
a directory that stands in for the remote lakehouse, starts a
:class:`QueryService` with a local lakehouse cache root beside it (policy
``fill_before_read``), warms it up (:meth:`QueryService.warm_up`: the
one-time GPU kernel compilation, timed on its own), and runs a query mix
(scan, count, PageRank, BFS, Jaccard) once cold and then warm (median of
three runs). It returns a
:class:`DemoReport`: per query the cold and warm times, the cache statuses of
both, and whether every warm result equals the cold one; plus the device cache reports taken before
shutdown. The command ``nexus-cache demo`` prints it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import FillPolicy, LakehouseCacheConfig
from nexus_cache.service.config import ServiceConfig
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet
from nexus_cache.service.queries import Count, Graph, Query, Scan
from nexus_cache.service.result import QueryResult, tables_match
from nexus_cache.service.service import QueryService

__all__ = ["DEFAULT_SCALE", "DemoQuery", "DemoReport", "demo_config", "demo_queries", "run_demo"]

#: R-MAT scale of the default demo (2**12 vertices, 2**16 edges): seconds on a laptop
DEFAULT_SCALE = 12

#: called as progress(phase, done, total) with phase in "generate", "warm-up", "cold", "warm"
Progress = Callable[[str, int, int], None]


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


def demo_queries(edges: str, facts: str, bfs_source: int) -> list[tuple[str, Query]]:
    """The query mix, in run order."""
    edge_scan = Scan(edges, columns=("src", "dst"))
    return [
        ("scan", Scan(facts, columns=("order_id", "amount", "region"))),
        ("count", Count(facts)),
        ("pagerank", Graph(edge_scan, "src", "dst", "pagerank")),
        ("bfs", Graph(edge_scan, "src", "dst", "bfs", params={"source": bfs_source})),
        ("jaccard", Graph(edge_scan, "src", "dst", "jaccard", directed=False)),
    ]


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
    """
    tick = progress or (lambda phase, done, total: None)
    scale = DEFAULT_SCALE if scale is None else scale
    rows = fact_rows if fact_rows is not None else 16 << scale
    with _workdir(workdir) as root:
        lake = root / "lake"
        lake.mkdir(exist_ok=True)
        tick("generate", 0, 2)
        edge_table = rmat_edges(scale)
        write_parquet(edge_table, lake / "edges.parquet")
        tick("generate", 1, 2)
        write_parquet(fact_table(rows), lake / "facts.parquet")
        tick("generate", 2, 2)
        bfs_source = int(edge_table.column("src")[0].as_py())
        config = demo_config(root, backend, cache_cap_bytes)
        mix = demo_queries(str(lake / "edges.parquet"), str(lake / "facts.parquet"), bfs_source)
        with QueryService(config) as service:
            tick("warm-up", 0, 1)
            warmup_s = service.warm_up()
            tick("warm-up", 1, 1)
            cold = _run_pass(service, mix, "cold", tick, 1)
            warm = _run_pass(service, mix, "warm", tick, warm_runs)
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
            )
            for (name, query), (c_results, c_time), (w_results, w_time) in zip(
                mix, cold, warm, strict=True
            )
        )
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
    service: QueryService, mix: list[tuple[str, Query]], phase: str, tick: Progress, runs: int
) -> list[tuple[list[QueryResult], float]]:
    """Each query ``runs`` times in a row: its results and its median time."""
    out = []
    tick(phase, 0, len(mix) * runs)
    done = 0
    for _name, query in mix:
        results, times = [], []
        for _ in range(runs):
            start = time.perf_counter()
            results.append(service.execute(query))
            times.append(time.perf_counter() - start)
            done += 1
            tick(phase, done, len(mix) * runs)
        out.append((results, statistics.median(times)))
    return out
