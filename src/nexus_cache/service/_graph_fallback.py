"""Uncached graph algorithms on NumPy/SciPy, used while ``nexus_cache.graph`` is absent.

The service reports the graph-cache status ``unavailable`` when it runs these.
Results are keyed by the original vertex ids:

* PageRank: ``vertex``, ``pagerank`` (dangling mass spread uniformly;
  converged when the L1 change is below ``n * tol``);
* BFS: ``vertex``, ``distance``, ``predecessor`` for every reached vertex
  (the source's predecessor is -1), within ``depth_limit`` when given;
* similarities: ``first``, ``second`` and the score for every distinct edge
  ``first < second`` of the undirected, loop-free neighbourhood graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp
from scipy.sparse import csgraph

from nexus_cache.errors import ConfigError

__all__ = ["run_algorithm"]

_CHUNK_NNZ = 1 << 22


def _renumber(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
    return ids, inverse[: len(src)], inverse[len(src) :]


def run_algorithm(
    edges: pa.Table,
    src: str,
    dst: str,
    weight: str | None,
    directed: bool,
    algorithm: str,
    params: Mapping[str, Any],
) -> pa.Table:
    s = edges.column(src).to_numpy().astype(np.int64, copy=False)
    d = edges.column(dst).to_numpy().astype(np.int64, copy=False)
    w = (
        np.ones(len(s))
        if weight is None
        else edges.column(weight).to_numpy().astype(np.float64, copy=False)
    )
    ids, u, v = _renumber(s, d)
    n = len(ids)
    if not directed:
        u, v, w = np.concatenate([u, v]), np.concatenate([v, u]), np.concatenate([w, w])
    matrix = sp.csr_matrix((w, (u, v)), shape=(n, n))
    matrix.sum_duplicates()
    if weight is None:  # duplicate edges are one edge; with weights they add up
        matrix.data[:] = 1.0
    if algorithm == "pagerank":
        return _pagerank(matrix, ids, **params)
    if algorithm == "bfs":
        return _bfs(matrix, ids, directed, **params)
    return _similarity(matrix, ids, algorithm)


def _pagerank(matrix: Any, ids: np.ndarray, alpha: float, tol: float, max_iter: int) -> pa.Table:
    n = matrix.shape[0]
    out = np.asarray(matrix.sum(axis=1)).ravel()
    dangling = out == 0
    inv = np.divide(1.0, out, out=np.zeros_like(out), where=~dangling)
    transposed = (sp.diags(inv) @ matrix).T.tocsr()
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        previous = x
        x = alpha * (transposed @ x + x[dangling].sum() / n) + (1 - alpha) / n
        if np.abs(x - previous).sum() < n * tol:
            break
    return pa.table({"vertex": ids, "pagerank": x})


def _bfs(
    matrix: Any, ids: np.ndarray, directed: bool, source: int, depth_limit: int | None
) -> pa.Table:
    where = np.searchsorted(ids, source)
    if where >= len(ids) or ids[where] != source:
        raise ConfigError(f"BFS source vertex {source} is not in the graph; pick an existing id")
    order, predecessors = csgraph.breadth_first_order(
        matrix, int(where), directed=True, return_predecessors=True
    )
    distance = np.full(len(ids), -1, dtype=np.int64)
    distance[where] = 0
    for vertex in order[1:]:  # BFS order: a predecessor is always settled first
        distance[vertex] = distance[predecessors[vertex]] + 1
    reached = np.sort(order)
    if depth_limit is not None:
        reached = reached[distance[reached] <= depth_limit]
    pred = predecessors[reached]
    pred_ids = np.where(pred < 0, -1, ids[np.clip(pred, 0, None)])
    return pa.table(
        {"vertex": ids[reached], "distance": distance[reached], "predecessor": pred_ids}
    )


def _similarity(matrix: Any, ids: np.ndarray, algorithm: str) -> pa.Table:
    sym = ((matrix + matrix.T) != 0).astype(np.float64).tocsr()
    sym.setdiag(0)
    sym.eliminate_zeros()
    upper = sp.triu(sym, k=1).tocoo()
    first, second = upper.row.astype(np.int64), upper.col.astype(np.int64)
    degree = np.asarray(sym.sum(axis=1)).ravel()
    inter = np.zeros(len(first))
    # Chunks bound the row copies below to about _CHUNK_NNZ stored entries.
    cumulative = np.cumsum(degree[first] + degree[second])
    total = int(cumulative[-1]) if len(cumulative) else 0
    cuts = np.searchsorted(cumulative, np.arange(_CHUNK_NNZ, total, _CHUNK_NNZ))
    bounds = [0, *sorted(set(int(c) + 1 for c in cuts)), len(first)]
    for start, stop in itertools.pairwise(bounds):
        if start < stop:
            rows = sym[first[start:stop]].multiply(sym[second[start:stop]])
            inter[start:stop] = np.asarray(rows.sum(axis=1)).ravel()
    du, dv = degree[first], degree[second]
    if algorithm == "jaccard":
        score = inter / (du + dv - inter)
    elif algorithm == "sorensen":
        score = 2 * inter / (du + dv)
    elif algorithm == "overlap":
        score = inter / np.minimum(du, dv)
    else:
        score = inter / np.sqrt(du * dv)
    order = np.lexsort((second, first))
    return pa.table(
        {"first": ids[first[order]], "second": ids[second[order]], algorithm: score[order]}
    )
