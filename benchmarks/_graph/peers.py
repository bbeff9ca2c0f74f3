"""Host graph algorithms side by side with NetworKit and igraph, in one process.

For each scale: one undirected R-MAT graph without self loops or repeated
edges, loaded into ours, NetworKit (all cores) and igraph from the same
dense edge list (loading is not timed). Each figure runs ours and every
installed peer interleaved, the order rotating between repeats, and reports
the median seconds and ``peer / ours`` (above 1: ours is faster) against the
faster peer. A peer that is not installed is skipped.

Figures: PageRank until the total L1 change is below 1e-6 (igraph's PRPACK
solves to its own precision); BFS from one root (the median
over ``roots`` roots; NetworKit computes distances only, igraph the order
and parents, ours distances and parents); Jaccard and Sorensen of every
edge; Jaccard of ``pairs`` given pairs (random input edges, so pairs with a
hub occur as often as in real queries); Overlap and Cosine (ours only).
igraph runs with ``loops=False``: its default counts every vertex as its own
neighbour, which is not the definition ours (and NetworkX) computes.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from nexus_cache.graph import GraphOptions, bfs, build_graph, pagerank, similarity

__all__ = ["PEERS", "compare_peers"]

PEERS = ("networkit", "igraph")
_TOL = 1e-6  # stop when the rank vector's total L1 change is below this


def _load(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        print(f"# {name} is not installed: skipped (pip install {name})")
        return None


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each run, runs interleaved with a rotating order."""
    for fn in runs.values():  # warm-up: first-call costs stay out of the medians
        fn()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(_timed(runs[name]))
    return {name: statistics.median(values) for name, values in times.items()}


class _Peers:
    """One scale's graph in ours and in each installed peer."""

    def __init__(self, src: Any, dst: Any, seed: int, n_pairs: int) -> None:
        self.graph = build_graph(
            {"src": src, "dst": dst},
            # ``max``: a repeated edge stays one edge of weight 1, as in the peers
            # (``sum`` would weigh PageRank's arcs by their repeats).
            options=GraphOptions(directed=False, drop_self_loops=True, duplicates="max"),
        )
        g = self.graph
        rows = g.rows()
        upper = rows < g.indices
        self.u, self.v = rows[upper].astype(np.int64), g.indices[upper].astype(np.int64)
        rng = np.random.default_rng(seed)
        pick = rng.choice(int(src.size), n_pairs)
        keep = src[pick] != dst[pick]  # the graph has no self loops
        self.pair_ids = (src[pick][keep], dst[pick][keep])
        self.pair_dense = (g.dense(self.pair_ids[0]), g.dense(self.pair_ids[1]))
        degree = np.diff(g.indptr)
        self.roots = [int(r) for r in rng.choice(np.flatnonzero(degree > 0), 5, replace=False)]
        self.nk = self._networkit()
        self.ig = self._igraph()

    def _networkit(self) -> Any | None:
        nk = _load("networkit")
        if nk is None:
            return None
        graph = nk.graph.Graph(self.graph.n_vertices, weighted=False, directed=False)
        graph.addEdges((self.u.astype(np.uint64), self.v.astype(np.uint64)))
        graph.indexEdges()
        return graph

    def _igraph(self) -> Any | None:
        ig = _load("igraph")
        if ig is None:
            return None
        edges = np.column_stack([self.u, self.v]).tolist()
        return ig.Graph(n=self.graph.n_vertices, edges=edges, directed=False)

    def figures(self) -> dict[str, dict[str, Callable[[], Any]]]:
        g = self.graph
        ids = g.vertex_ids
        pairs = self.pair_ids
        figures: dict[str, dict[str, Callable[[], Any]]] = {
            "PageRank, L1 change < 1e-6": {
                "ours": lambda: pagerank(g, tol=_TOL, max_iter=1000),
            },
            "BFS from one root": {
                "ours": lambda: [bfs(g, [int(ids[r])]) for r in self.roots],
            },
            "Jaccard, every edge": {"ours": lambda: similarity(g, "jaccard")},
            "Sorensen, every edge": {"ours": lambda: similarity(g, "sorensen")},
            f"Jaccard, {pairs[0].size} given pairs": {
                "ours": lambda: similarity(g, "jaccard", pairs),
            },
            "Overlap, every edge": {"ours": lambda: similarity(g, "overlap")},
            "Cosine, every edge": {"ours": lambda: similarity(g, "cosine")},
        }
        if self.nk is not None:
            self._add_networkit(figures)
        if self.ig is not None:
            self._add_igraph(figures)
        return figures

    def _add_networkit(self, figures: dict[str, dict[str, Callable[[], Any]]]) -> None:
        import networkit as nk

        graph = self.nk

        def rank() -> Any:
            pr = nk.centrality.PageRank(graph, damp=0.85, tol=_TOL)
            pr.norm = nk.centrality.Norm.L1_NORM
            pr.run()
            return pr

        def jaccard_edges() -> Any:
            triangles = nk.sparsification.ChibaNishizekiTriangleEdgeScore(graph)
            triangles.run()
            score = nk.sparsification.JaccardSimilarityAttributizer(graph, triangles.scores())
            return score.getAttribute()

        pair_list = list(zip(*(p.tolist() for p in self.pair_dense), strict=True))
        index = nk.linkprediction.JaccardIndex(graph)
        runs = {
            "PageRank, L1 change < 1e-6": rank,
            "BFS from one root": lambda: [
                nk.distance.BFS(graph, r, storePaths=False).run() for r in self.roots
            ],
            "Jaccard, every edge": jaccard_edges,
            f"Jaccard, {len(pair_list)} given pairs": lambda: index.runOn(pair_list),
        }
        for figure, fn in runs.items():
            figures[figure]["NetworKit"] = fn

    def _add_igraph(self, figures: dict[str, dict[str, Callable[[], Any]]]) -> None:
        graph = self.ig
        edge_list = list(zip(self.u.tolist(), self.v.tolist(), strict=True))
        pair_list = list(zip(*(p.tolist() for p in self.pair_dense), strict=True))
        runs = {
            "PageRank, L1 change < 1e-6": lambda: graph.pagerank(damping=0.85),
            "BFS from one root": lambda: [graph.bfs(r) for r in self.roots],
            "Jaccard, every edge": lambda: graph.similarity_jaccard(pairs=edge_list, loops=False),
            "Sorensen, every edge": lambda: graph.similarity_dice(pairs=edge_list, loops=False),
            f"Jaccard, {len(pair_list)} given pairs": lambda: graph.similarity_jaccard(
                pairs=pair_list, loops=False
            ),
        }
        for figure, fn in runs.items():
            figures[figure]["igraph"] = fn

    def check(self) -> None:
        """Ours agrees with igraph on PageRank and the given pairs (no timing of wrong code)."""
        if self.ig is None:
            return
        pair_list = list(zip(*(p.tolist() for p in self.pair_dense), strict=True))
        theirs = np.asarray(self.ig.similarity_jaccard(pairs=pair_list, loops=False))
        ours = similarity(self.graph, "jaccard", self.pair_ids)["jaccard"]
        if not np.allclose(ours, theirs, rtol=0, atol=1e-12):
            raise SystemExit("Jaccard of the given pairs differs from igraph's")
        ranks = np.asarray(pagerank(self.graph, tol=_TOL)["pagerank"], dtype=np.float64)
        if np.abs(ranks - np.asarray(self.ig.pagerank(damping=0.85))).sum() > 1e-4:
            raise SystemExit("PageRank differs from igraph's by more than 1e-4 (L1)")


def compare_peers(
    rmat: Callable[[Any, int, int, int], tuple[Any, Any]],
    scales: list[int],
    edge_factor: int,
    seed: int,
    repeats: int,
    n_pairs: int = 1 << 16,
) -> list[tuple[str, ...]]:
    """Rows ``(scale, figure, ours s, NetworKit s, igraph s, faster peer / ours)``."""
    rows: list[tuple[str, ...]] = []
    for scale in scales:
        src, dst = rmat(np, scale, edge_factor, seed)
        peers = _Peers(src, dst, seed, n_pairs)
        g = peers.graph
        print(
            f"# peers, scale {scale}: {g.n_vertices} vertices, {peers.u.size} edges "
            f"(undirected, no self loops), {repeats} interleaved repeats"
        )
        peers.check()
        for figure, runs in peers.figures().items():
            medians = _interleaved(runs, repeats)
            ours = medians.pop("ours")
            cells = [f"{medians[p]:.4f}" if p in medians else "-" for p in ("NetworKit", "igraph")]
            ratio = f"{min(medians.values()) / ours:.2f}" if medians else "-"
            rows.append((str(scale), figure, f"{ours:.4f}", *cells, ratio))
            print(
                f"RATIO scale {scale} {figure}: ours {ours:.4f} s, NetworKit {cells[0]} s, "
                f"igraph {cells[1]} s, faster peer / ours = {ratio}",
                flush=True,
            )
    return rows
