#!/usr/bin/env python3
"""Graph algorithms on an R-MAT graph: ours against plain CuPy/SciPy baselines.

One run measures, on one graph (Graph500 R-MAT: a=0.57, b=0.19, c=0.19,
2**scale vertices, edge_factor * 2**scale edges, vertex labels permuted,
generated on the device, written to and read back from Parquet unless
``--no-parquet``):

* CSR build: ``build_graph`` from int64 id columns (renumbering and edge
  preparation included) against the sparse module's COO-to-CSR conversion of
  already dense int32 ids (``coo_matrix(...).tocsr()``); first call reported
  apart from the warm median. Target: >= 100x warm.
* PageRank edges/s per iteration (setup excluded: the difference of a 30- and
  a 10-iteration run, divided by 20) against a bare SpMV on the same
  matrix. Target: >= 0.8x.
* BFS TEPS as Graph500 counts them (input edges inside the reached
  component / time of the ``bfs()`` call) against a level-synchronous BFS
  with one SpMV per level. Target: >= 2x.
* Jaccard in edges/s over ``--jaccard-edges`` sampled edges (default
  2**24; 0 scores every edge).
* Each algorithm end to end through the resident graph cache (unless
  ``--no-cache``): miss (copy + build + park + run) against hit (run on the
  parked graph); similarities score 2**20 sampled edges there.
* ``--backend host``: the host side by side with NetworKit and igraph at each
  of ``--peer-scales`` (default 14, 16 and 18; ``benchmarks/_graph/peers.py``),
  peer time / ours per figure; a peer that is not installed is skipped.

Median of ``--repeats`` warm runs; ratio = ours / peer (higher is better
for rates, lower for times, as each line says). ``--backend host --scale 10``
is the CI smoke run.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _graph, when run as a script

from _graph.peers import compare_peers
from nexus_cache._sizes import format_size
from nexus_cache.graph import GraphOptions, bfs, build_graph, jaccard, pagerank
from nexus_cache.graph.arrays import is_device_module, sparse_module, to_numpy

RMAT = (0.57, 0.19, 0.19)


class Bench:
    """Timing helpers bound to one array module (device-synchronized on CuPy)."""

    def __init__(self, xp: Any, repeats: int) -> None:
        self.xp = xp
        self.repeats = repeats
        self.rows: list[tuple[str, str, str, str]] = []

    def sync(self) -> None:
        if is_device_module(self.xp):
            self.xp.cuda.Device().synchronize()

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def first_and_median(self, fn: Callable[[], Any], repeats: int | None = None) -> tuple:
        first, out = self.time(fn)
        warm = [self.time(fn)[0] for _ in range(repeats or self.repeats)]
        return first, statistics.median(warm), out

    def free(self) -> None:
        if is_device_module(self.xp):
            self.xp.get_default_memory_pool().free_all_blocks()

    def row(self, figure: str, ours: str, peer: str, ratio: str) -> None:
        self.rows.append((figure, ours, peer, ratio))
        print(f"RATIO {figure}: ours {ours} vs {peer} = {ratio}", flush=True)


def rmat_edges(xp: Any, scale: int, edge_factor: int, seed: int) -> tuple[Any, Any]:
    """Graph500 R-MAT endpoints as int64, labels permuted (one uniform per level)."""
    a, b, c = RMAT
    m = edge_factor << scale
    src = xp.zeros(m, dtype=np.int64)
    dst = xp.zeros(m, dtype=np.int64)
    if is_device_module(xp):
        rs = xp.random.RandomState(seed)

        def uniform() -> Any:
            return rs.random_sample(m, dtype=np.float32)

        perm = rs.permutation(1 << scale)
    else:
        rng = np.random.default_rng(seed)

        def uniform() -> Any:
            return rng.random(m, dtype=np.float32)

        perm = rng.permutation(1 << scale)
    for _ in range(scale):
        q = uniform()
        src <<= 1
        dst <<= 1
        src += q >= a + b
        dst += ((q >= a) & (q < a + b)) | (q >= a + b + c)
    return perm[src], perm[dst]


def spmv_bfs(matrix: Any, xp: Any, root: int) -> Any:
    """The baseline: one SpMV per level over the symmetric matrix, no predecessors."""
    n = matrix.shape[0]
    dist = xp.full(n, -1, dtype=np.int32)
    dist[root] = 0
    x = xp.zeros(n, dtype=np.float32)
    x[root] = 1
    level = 0
    while True:
        level += 1
        y = matrix @ x
        new = (y > 0) & (dist < 0)
        if not bool(new.any()):
            return dist
        dist[new] = level
        x = new.astype(np.float32)


def run(args: argparse.Namespace) -> Bench:
    if args.backend == "cuda":
        import cupy as xp
    else:
        xp = np
    bench = Bench(xp, args.repeats)
    sparse = sparse_module(xp)
    print(f"# backend={args.backend} scale={args.scale} edge_factor={args.edge_factor}")
    if is_device_module(xp):
        props = xp.cuda.runtime.getDeviceProperties(0)
        print(f"# device: {props['name'].decode()}, CuPy {xp.__version__}")
    t, (src, dst) = bench.time(lambda: rmat_edges(xp, args.scale, args.edge_factor, args.seed))
    m = int(src.size)
    print(f"# generated {m} edges in {t:.2f} s")
    if not args.no_parquet:
        with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
            path = Path(tmp) / "rmat.parquet"
            table = pa.table({"src": to_numpy(src), "dst": to_numpy(dst)})
            del src, dst
            bench.free()
            t0 = time.perf_counter()
            pq.write_table(table, path, compression="none")
            print(
                f"# wrote Parquet ({format_size(path.stat().st_size)}) in "
                f"{time.perf_counter() - t0:.2f} s"
            )
            del table
            t0 = time.perf_counter()
            table = pq.read_table(path)
            src = xp.asarray(table.column("src").to_numpy())
            dst = xp.asarray(table.column("dst").to_numpy())
            bench.sync()
            print(f"# read Parquet onto the device in {time.perf_counter() - t0:.2f} s")
            del table
    edges = {"src": src, "dst": dst}
    build_rows(bench, sparse, edges, args.scale, args.peer_repeats)
    undirected = GraphOptions(directed=False)
    t_build, graph = bench.time(lambda: build_graph(edges, options=undirected))
    print(
        f"# undirected CSR: {graph.n_vertices} vertices, {graph.n_arcs} arcs, "
        f"{format_size(graph.nbytes)}, built in {t_build:.3f} s"
    )
    matrix = pagerank_rows(bench, graph)
    bfs_rows(bench, graph, matrix, src, args)
    del matrix
    bench.free()
    jaccard_rows(bench, graph, src, dst, args)
    if not args.no_cache:
        cache_rows(bench, edges, args)
    return bench


def build_rows(
    bench: Bench, sparse: Any, edges: dict[str, Any], scale: int, peer_repeats: int
) -> None:
    """(1) CSR build: ours from int64 ids against COO->CSR of dense int32 ids."""
    xp = bench.xp
    directed = GraphOptions()
    first, warm, graph = bench.first_and_median(lambda: build_graph(edges, options=directed))
    print(f"# directed CSR: {graph.n_vertices} vertices, {graph.n_arcs} arcs")
    graph = None
    bench.free()
    dense_src = edges["src"].astype(np.int32)
    dense_dst = edges["dst"].astype(np.int32)
    ones = xp.ones(dense_src.size, dtype=np.float32)
    shape = (1 << scale, 1 << scale)

    def peer_build() -> Any:
        return sparse.coo_matrix((ones, (dense_src, dense_dst)), shape=shape).tocsr()

    peer_first, peer_warm, _ = bench.first_and_median(peer_build, peer_repeats)
    bench.row(
        "CSR build, first call",
        f"{first:.3f} s",
        f"COO->CSR {peer_first:.3f} s",
        f"{peer_first / first:.1f}x faster",
    )
    bench.row(
        "CSR build, warm",
        f"{warm:.4f} s",
        f"COO->CSR {peer_warm:.3f} s",
        f"{peer_warm / warm:.1f}x faster (target >= 100x)",
    )


def pagerank_rows(bench: Bench, graph: Any) -> Any:
    """(2) PageRank per iteration against a bare SpMV; returns the SpMV matrix."""
    xp = bench.xp
    arcs = graph.n_arcs

    def timed_pagerank(iterations: int) -> float:
        runs = [
            bench.time(lambda: pagerank(graph, max_iter=iterations, tol=1e-30))[0]
            for _ in range(bench.repeats)
        ]
        return statistics.median(runs)

    timed_pagerank(2)
    per_iter = max(timed_pagerank(30) - timed_pagerank(10), 1e-9) / 20
    matrix = graph.matrix(xp.ones(arcs, dtype=np.float32))
    x = xp.full(graph.n_vertices, 1.0 / graph.n_vertices, dtype=np.float32)
    bench.time(lambda: matrix @ x)
    spmv = statistics.median(bench.time(lambda: matrix @ x)[0] for _ in range(10 * bench.repeats))
    bench.row(
        "PageRank per iteration",
        f"{arcs / per_iter / 1e9:.2f} G edges/s",
        f"bare SpMV {arcs / spmv / 1e9:.2f} G edges/s",
        f"{spmv / per_iter:.2f}x (target >= 0.8x)",
    )
    return matrix


def bfs_rows(bench: Bench, graph: Any, matrix: Any, src: Any, args: argparse.Namespace) -> None:
    """(3) BFS TEPS (Graph500: input edges in the reached component / time)."""
    xp = bench.xp
    rng = np.random.default_rng(args.seed)
    degree = to_numpy(xp.diff(graph.indptr))
    roots = rng.choice(np.flatnonzero(degree > 0), args.bfs_roots, replace=False)
    root_ids = to_numpy(graph.vertex_ids)[roots]
    bfs(graph, [int(root_ids[0])])
    spmv_bfs(matrix, xp, int(roots[0]))
    src_dense = graph.dense(src)
    ours_teps, peer_teps = [], []
    for root, root_id in zip(roots.tolist(), root_ids.tolist(), strict=True):
        t_ours, result = bench.time(lambda r=root_id: bfs(graph, [r]))
        t_peer, peer_dist = bench.time(lambda r=root: spmv_bfs(matrix, xp, r))
        reached = result.valid("distance")
        if not bool((reached == (peer_dist >= 0)).all()):
            raise SystemExit(f"BFS from {root_id}: reached sets differ from the baseline")
        inside = int(reached[src_dense].sum())
        ours_teps.append(inside / t_ours)
        peer_teps.append(inside / t_peer)
    ours_m, peer_m = statistics.median(ours_teps), statistics.median(peer_teps)
    bench.row(
        f"BFS TEPS ({args.bfs_roots} roots)",
        f"{ours_m / 1e9:.2f} GTEPS",
        f"SpMV-frontier BFS {peer_m / 1e9:.2f} GTEPS",
        f"{ours_m / peer_m:.2f}x (target >= 2x)",
    )


def jaccard_rows(bench: Bench, graph: Any, src: Any, dst: Any, args: argparse.Namespace) -> None:
    """(4) Jaccard over every edge (or a sample of edges)."""
    xp = bench.xp
    m = int(src.size)
    pairs = None
    label = "every edge"
    if args.jaccard_edges:
        pick = xp.asarray(np.random.default_rng(args.seed).choice(m, min(args.jaccard_edges, m)))
        pairs = (src[pick], dst[pick])
        label = f"{int(pick.size)} sampled edges"
    t_j, result = bench.time(lambda: jaccard(graph, pairs))
    bench.row(
        f"Jaccard ({label})",
        f"{result.num_rows / t_j / 1e6:.1f} M edges/s",
        "no peer",
        f"{result.num_rows} pairs in {t_j:.2f} s",
    )


def cache_rows(bench: Bench, edges: dict[str, Any], args: argparse.Namespace) -> None:
    """(5) Each algorithm end to end through the resident graph cache: miss vs hit.

    A miss copies the edges into the cache domain, builds, parks and runs; a
    hit runs on the parked graph. Each algorithm gets its own source identity
    (so its first run is a miss) and a fresh cache (so parked graphs of the
    previous one do not accumulate).
    """
    from nexus_cache._sizes import parse_size
    from nexus_cache.backends import select_backend
    from nexus_cache.device import DeviceProfile, DeviceResidentCaches, plan_graph_run

    xp = bench.xp
    src = edges["src"]
    rng = np.random.default_rng(args.seed + 1)
    pick = xp.asarray(rng.choice(int(src.size), min(1 << 20, int(src.size)), replace=False))
    pairs = (src[pick], edges["dst"][pick])
    root = int(src[0])
    runs: list[tuple[str, dict[str, Any]]] = [
        ("bfs", {"sources": [root]}),
        ("pagerank", {"max_iter": 20, "tol": 1e-30}),
        *((metric, {"pairs": pairs}) for metric in ("jaccard", "sorensen", "overlap", "cosine")),
    ]
    backend = select_backend("cuda" if is_device_module(xp) else "host")
    total = backend.mem_info(0).total_bytes
    cap = min(parse_size(args.cache_cap, name="--cache-cap"), int(total * 0.8))
    options = GraphOptions(directed=False)
    for algorithm, params in runs:
        profile = DeviceProfile(0, cap)
        with DeviceResidentCaches([profile], backend=backend) as caches:
            cache = caches.graph_cache(0)
            source = ("benchmark-rmat", args.scale, args.seed, algorithm)
            plan = plan_graph_run(algorithm, source=source, options=options)
            t_miss, miss = bench.time(lambda p=plan, kw=params, c=cache: c.run(p, edges, **kw))
            hits = [
                bench.time(lambda p=plan, kw=params, c=cache: c.run(p, edges, **kw))
                for _ in range(bench.repeats)
            ]
            t_hit = statistics.median(t for t, _ in hits)
            statuses = {run.status.value for _, run in hits}
            if miss.status.value != "miss" or statuses != {"hit"}:
                raise SystemExit(
                    f"{algorithm}: expected a miss then hits, got {miss.status.value} "
                    f"({miss.detail}) then {sorted(statuses)}"
                )
            build = hits[-1][1].build_seconds
            bench.row(
                f"cache {algorithm}, end to end",
                f"hit {t_hit:.4f} s (build {build:.1f} s)",
                f"miss {t_miss:.4f} s (build {miss.build_seconds:.4f} s)",
                f"{t_miss / t_hit:.1f}x faster on a hit",
            )
            del miss, hits
        bench.free()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    parser.add_argument("--scale", type=int, default=24, help="log2 of vertices (default 24)")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats (median)")
    parser.add_argument(
        "--peer-repeats",
        type=int,
        default=1,
        help="warm repeats of the slow COO->CSR peer (default 1)",
    )
    parser.add_argument("--bfs-roots", type=int, default=8)
    parser.add_argument(
        "--jaccard-edges",
        type=int,
        default=1 << 24,
        help="score this many sampled edges (default 2**24; 0: every edge)",
    )
    parser.add_argument(
        "--no-parquet", action="store_true", help="skip the Parquet write/read round trip"
    )
    parser.add_argument("--workdir", default=None, help="where the Parquet file goes")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="skip the resident graph cache rows (miss vs hit per algorithm)",
    )
    parser.add_argument(
        "--peer-scales",
        default="14,16,18",
        help="host only: scales of the NetworKit / igraph side by side (default 14,16,18; "
        "empty: none)",
    )
    parser.add_argument(
        "--peers-only", action="store_true", help="host only: run the side by side alone"
    )
    parser.add_argument(
        "--cache-cap",
        default="96G",
        help="cache_cap_bytes for the cache rows (default 96G; capped at 80%% of the device)",
    )
    args = parser.parse_args(argv)
    if args.peers_only and args.backend != "host":
        # the side by side runs on the host only: without this, nothing ran and nothing said so
        parser.error("--peers-only runs the host side by side: add --backend host")
    if args.backend == "cuda" and not args.peers_only and importlib.util.find_spec("cupy") is None:
        parser.error(
            "--backend cuda (the default) needs CuPy (nexus-cache[gpu]); "
            "on a machine without a GPU use --backend host"
        )
    if args.workdir is not None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    bench = Bench(np, args.repeats) if args.peers_only else run(args)
    peer_rows: list[tuple[str, ...]] = []
    scales = [int(s) for s in args.peer_scales.split(",") if s.strip()]
    if args.backend == "host" and scales:
        peer_rows = compare_peers(rmat_edges, scales, 8, args.seed, max(args.repeats, 1))
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # rich is optional for the benchmark's summary only
        return 0
    table = Table(title=f"graph benchmark, scale {args.scale}, backend {args.backend}")
    for column in ("figure", "ours", "peer", "ratio"):
        table.add_column(column)
    for row in bench.rows:
        table.add_row(*map(escape, row))
    if bench.rows:
        Console().print(table)
    if peer_rows:
        table = Table(title="host side by side, edge factor 8, median seconds")
        for column in ("scale", "figure", "ours", "NetworKit", "igraph", "faster peer / ours"):
            table.add_column(column)
        for row in peer_rows:
            table.add_row(*map(escape, row))
        Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
