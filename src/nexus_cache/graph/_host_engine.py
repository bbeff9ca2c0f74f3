"""The host (NumPy) graph engine: compiled loops when Numba is installed.

``NEXUS_GRAPH_HOST_ENGINE`` chooses, per call: ``auto`` (the default) uses
the Numba kernels of :mod:`nexus_cache.graph._host_kernels` when ``numba``
imports (the ``host`` extra), else the vectorized NumPy code; ``numba``
insists (``BackendUnavailableError`` without it); ``numpy`` never uses them.
Both give the same results.

The kernels run on every core this process may use: the work is cut into
one piece of about equal cost per core, and each piece runs on its own
thread (the kernels release the GIL). Thread-safe: each call has its own
threads, arrays and outputs, so any number of calls may run at once.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from nexus_cache._env import Variable, read
from nexus_cache.errors import BackendUnavailableError

__all__ = [
    "ENGINES",
    "ENV_HOST_ENGINE",
    "HOST_ENGINE_VARIABLE",
    "VARIABLES",
    "bfs",
    "edge_common_neighbours",
    "host_kernels",
    "pair_common_neighbours",
]

ENGINES = ("auto", "numba", "numpy")
HOST_ENGINE_VARIABLE = Variable(
    "NEXUS_GRAPH_HOST_ENGINE",
    "enum",
    "Graph algorithms on the host",
    default="auto",
    choices=ENGINES,
)
#: the variables the graph package reads
VARIABLES = (HOST_ENGINE_VARIABLE,)
ENV_HOST_ENGINE = HOST_ENGINE_VARIABLE.name


def host_kernels() -> Any | None:
    """The compiled kernel module, or None when the NumPy code is to run."""
    choice = read(HOST_ENGINE_VARIABLE)
    if choice == "numpy":
        return None
    try:
        from nexus_cache.graph import _host_kernels
    except ImportError as exc:
        if choice == "numba":
            raise BackendUnavailableError(
                f"{ENV_HOST_ENGINE}=numba but numba does not import ({exc}); "
                'pip install "nexus-cache[host]", or set it to auto or numpy'
            ) from exc
        return None
    return _host_kernels


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _pieces(cumulative_work: Any, parts: int) -> list[tuple[int, int]]:
    """Cut items ``0..len-1`` (cumulative cost given) into ``parts`` ranges of about equal cost."""
    count = int(cumulative_work.size)
    if count == 0:
        return []
    total = int(cumulative_work[-1])
    targets = np.arange(1, parts, dtype=np.int64) * total // parts
    cuts = np.searchsorted(cumulative_work, targets, side="left") + 1
    bounds = [0, *np.clip(cuts, 0, count).tolist(), count]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _run(work: Callable[[int, int, int], None], pieces: list[tuple[int, int]]) -> None:
    """Run ``work(piece number, start, stop)`` for every piece, one thread each."""
    if len(pieces) <= 1:
        for i, (start, stop) in enumerate(pieces):
            work(i, start, stop)
        return
    with ThreadPoolExecutor(len(pieces), thread_name_prefix="nexus-graph") as pool:
        futures = [pool.submit(work, i, a, b) for i, (a, b) in enumerate(pieces)]
        for future in futures:
            future.result()


def pair_common_neighbours(kernels: Any, graph: Any, first: Any, second: Any) -> Any:
    """``|N(first[i]) & N(second[i])|`` as int64.

    Temporaries: O(pairs) arrays (the pairs' shorter and longer ends, their
    order, the cost sums) and one byte per vertex per thread.
    """
    indptr, indices = graph.indptr, graph.indices
    counts = np.zeros(int(first.size), dtype=np.int64)
    degree = np.diff(indptr)
    deg_a, deg_b = degree[first], degree[second]
    del degree
    a_short = deg_a <= deg_b
    short = np.where(a_short, first, second)
    long_ = np.where(a_short, second, first)
    smaller = np.minimum(deg_a, deg_b).astype(np.int64, copy=False)
    del a_short, deg_a, deg_b
    order = np.argsort(long_, kind="stable")
    # The cost of a pair is its shorter list: cut so each thread walks as much.
    cost = smaller[order]
    del smaller
    cost += 1
    np.cumsum(cost, out=cost)
    pieces = _pieces(cost, _cores())
    del cost

    def work(_: int, start: int, stop: int) -> None:
        marker = np.zeros(graph.n_vertices, dtype=np.uint8)
        kernels.pair_counts(indptr, indices, short, long_, order, marker, counts, start, stop)

    _run(work, pieces)
    return counts


def _triangle_bytes(n: int, edges: int, threads: int) -> int:
    """Temporaries of the triangle path: rank and its sort, the oriented CSR and
    its work sums, and each thread's marker and counts (8 bytes a slot)."""
    return 4 * n * 8 + edges * 16 + threads * (n + edges) * 8


def edge_common_neighbours(
    kernels: Any, graph: Any, first: Any, second: Any, loops: Any, max_temp_bytes: int
) -> Any:
    """Common neighbours of every edge ``(first[i], second[i])`` (the arcs ``u < v``
    of an undirected graph without repeated arcs, in CSR order), as int64.

    Counts triangles: each edge is stored once, from its end of lower
    (degree, index) rank, and every triangle is found once from its
    lowest-ranked vertex and added to its three edges; a self loop at an end
    adds that end (``loops``: the vertices with one). This needs
    O(vertices + edges) temporaries per thread; when even one thread's do
    not fit ``max_temp_bytes`` the pairs are intersected one by one instead
    (no temporaries).
    """
    n, edges = graph.n_vertices, int(first.size)
    threads = _cores()
    while threads > 1 and _triangle_bytes(n, edges, threads) > max_temp_bytes:
        threads -= 1
    if _triangle_bytes(n, edges, threads) > max_temp_bytes:
        return pair_common_neighbours(kernels, graph, first, second)
    counts = _triangles(kernels, graph, first, second, threads)
    if loops.size:
        looped = np.zeros(n, dtype=np.uint8)
        looped[loops] = 1
        counts += looped[first]
        counts += looped[second]
    return counts


def _triangles(kernels: Any, graph: Any, first: Any, second: Any, threads: int) -> Any:
    """Triangles through each edge, counted on up to ``threads`` threads."""
    n, edges = graph.n_vertices, int(first.size)
    degree = np.diff(graph.indptr)
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(degree, kind="stable")] = np.arange(n, dtype=np.int64)
    del degree
    # Edge ids, markers and counts in int32 where they fit: half the bytes
    # of the randomly accessed arrays, which is what the loop waits on.
    small = np.int32 if max(n, edges) < 2**31 - 1 else np.int64
    ptr = np.zeros(n + 1, dtype=np.int64)
    fill = np.empty(n, dtype=np.int64)
    head = np.empty(edges, dtype=first.dtype)
    edge = np.empty(edges, dtype=small)
    kernels.orient(first, second, rank, ptr, fill, head, edge)
    del rank
    kernels.oriented_work(ptr, head, fill)
    pieces = _pieces(fill, threads)
    del fill
    partial = [np.zeros(edges, dtype=small) for _ in pieces]

    def work(i: int, start: int, stop: int) -> None:
        marker = np.full(n, -1, dtype=small)
        kernels.triangle_counts(ptr, head, edge, marker, partial[i], start, stop)

    _run(work, pieces)
    counts = np.zeros(edges, dtype=np.int64)
    for part in partial:
        counts += part
    return counts


def bfs(
    kernels: Any,
    graph: Any,
    sources: Any,
    depth_limit: int | None,
    mode: int,
    alpha: int,
    beta: int,
    steps: Any | None = None,
) -> tuple[Any, Any, int]:
    """Distances, parents and levels of a BFS on ``graph``'s rows (see ``kernels.bfs``)."""
    n = graph.n_vertices
    dist = np.full(n, -1, dtype=np.int32)
    pred = np.full(n, -1, dtype=graph.indices.dtype)
    if n == 0:
        return dist, pred, 0
    counted = np.zeros(2, dtype=np.int64) if steps is None else steps
    scratch = np.empty((2, n), dtype=np.int64)
    levels = kernels.bfs(
        graph.indptr,
        graph.indices,
        np.ascontiguousarray(sources),
        # the kernel takes an int64; no BFS has n levels, so a limit that
        # high (a Python int may exceed int64) is no limit
        -1 if depth_limit is None or depth_limit >= n else depth_limit,
        mode,
        alpha,
        beta,
        dist,
        pred,
        scratch[0],
        scratch[1],
        counted,
    )
    return dist, pred, int(levels)
