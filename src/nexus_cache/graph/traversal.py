"""Breadth-first search from one or more sources, direction-optimizing.

Each level is either a top-down step (expand the frontier's out-arcs) or a
bottom-up step (every unvisited vertex looks for a parent among its
in-neighbours, stopping at the first). ``direction='auto'`` switches as
Beamer et al. describe: to bottom-up once the frontier's arcs exceed
1/``_ALPHA`` of the arcs still unexplored, back to top-down once the
frontier holds fewer than 1/``_BETA`` of the vertices. Both steps need
both orientations, which an undirected graph has for free; a directed graph
has only the one it was built with, so ``auto`` uses that one (build with
``orientation='transposed'`` for bottom-up) and a forced other direction
builds a transient transpose.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from nexus_cache.errors import ConfigError, GraphInputError
from nexus_cache.graph._expand import expand_chunks, offsets_of
from nexus_cache.graph._host_engine import bfs as host_bfs
from nexus_cache.graph._host_engine import host_kernels
from nexus_cache.graph._reductions import reduce
from nexus_cache.graph.arrays import is_device_module
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.result import GraphResult
from nexus_cache.graph.stopping import checkpoint

__all__ = ["bfs"]

_ALPHA = 14
_BETA = 24
# Top-down steps expand at most this many arcs at once (about 40 bytes each).
_PUSH_CHUNK = 1 << 24


def bfs(
    graph: Graph,
    sources: Any,
    *,
    depth_limit: int | None = None,
    include_edges: bool = False,
    direction: Literal["auto", "push", "pull"] = "auto",
) -> GraphResult:
    """Distances and predecessors from ``sources`` (original ids, one or many).

    Returns a :class:`GraphResult` with one row per vertex: ``vertex``
    (original id), ``distance`` (int32 hops to the nearest source; null when
    unreached or beyond ``depth_limit``) and ``predecessor`` (original id of
    a parent on a shortest path; null for sources and unreached vertices).
    With several parents at the same distance, which one is reported is
    unspecified. ``include_edges=True`` adds ``info["tree_edges"]``: a
    :class:`GraphResult` of the BFS tree with ``source``, ``destination`` and
    ``distance`` (of the destination).

    Reads ``graph`` only; safe to run concurrently on one graph.

    Parameters
    ----------
    graph : Graph
        The graph to walk (its rows: out-neighbours).
    sources : int or array-like of int
        The start vertices, as original ids.
    depth_limit : int or None, optional
        Stop after this many hops (None: no limit).
    include_edges : bool, optional
        Also return the BFS tree's edges as ``info["tree_edges"]``.
    direction : {"auto", "push", "pull"}, optional
        Top-down (push), bottom-up (pull) or chosen per level (auto).

    Returns
    -------
    GraphResult
        Columns ``vertex``, ``distance`` and ``predecessor``; ``info["levels"]``.

    Raises
    ------
    ConfigError
        ``direction`` or ``depth_limit`` is not accepted.
    GraphInputError
        No source is given, or a source is not a vertex of the graph.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, bfs, build_graph
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> bfs(g, 1).to_arrow().to_pydict()
    {'vertex': [1, 2, 3, 4], 'distance': [0, 1, 1, 2], 'predecessor': [None, 1, 1, 3]}
    """
    if direction not in ("auto", "push", "pull"):
        raise ConfigError(f"bfs direction={direction!r}: use 'auto', 'push' or 'pull'")
    if depth_limit is not None and (
        isinstance(depth_limit, bool) or not isinstance(depth_limit, int) or depth_limit < 0
    ):
        raise ConfigError(f"bfs depth_limit={depth_limit!r}: use None or an int >= 0")
    xp = graph.xp
    if getattr(sources, "size", None) == 0 or (isinstance(sources, (list, tuple)) and not sources):
        raise GraphInputError("bfs got no sources; give at least one vertex id")
    dense_sources = graph.dense(sources, "BFS sources")
    dist, pred, levels = _bfs_dense(graph, dense_sources, depth_limit, direction)
    reached = dist >= 0
    has_parent = reached & (pred >= 0)
    parent_ids = graph.original(xp.maximum(pred, 0))
    result = GraphResult(
        {"vertex": graph.vertex_ids, "distance": dist, "predecessor": parent_ids},
        valid={"distance": reached, "predecessor": has_parent},
        info={"levels": levels},
    )
    if include_edges:
        tree = xp.flatnonzero(has_parent)
        result.info["tree_edges"] = GraphResult(
            {
                "source": parent_ids[tree],
                "destination": graph.vertex_ids[tree],
                "distance": dist[tree],
            }
        )
    return result


def _bfs_dense(
    graph: Graph, sources: Any, depth_limit: int | None, direction: str
) -> tuple[Any, Any, int]:
    xp = graph.xp
    n = graph.n_vertices
    push_g: Graph | None = None if graph.options.stores_in_edges else graph
    pull_g: Graph | None = graph if not graph.directed or graph.options.stores_in_edges else None
    if direction == "push" and push_g is None:
        push_g, pull_g = graph.out_csr(), None
    elif direction == "pull" and pull_g is None:
        push_g, pull_g = None, graph.in_csr()
    elif direction == "push":
        pull_g = None
    elif direction == "pull":
        push_g = None
    kernels = None if is_device_module(xp) else host_kernels()
    if kernels is not None:
        mode = 0 if push_g is not None and pull_g is not None else 1 if pull_g is None else 2
        rows_g = push_g if push_g is not None else pull_g
        assert rows_g is not None
        return host_bfs(kernels, rows_g, sources, depth_limit, mode, _ALPHA, _BETA)
    dist = xp.full(n, -1, dtype=np.int32)
    pred = xp.full(n, -1, dtype=graph.indices.dtype)
    if n == 0:
        return dist, pred, 0
    dist[sources] = 0
    frontier = xp.flatnonzero(dist == 0)
    ref = push_g if push_g is not None else pull_g
    assert ref is not None
    # int64 degrees: CuPy sums int64 with CUB's precompiled device reduce; an
    # int32 sum is a kernel it compiles per length class of the frontier (up to
    # 128, 256, 512, 1024 vertices, more), so a first BFS whose frontier falls
    # in a class no earlier BFS met would compile (seconds on a fresh machine)
    degree = xp.subtract(ref.indptr[1:], ref.indptr[:-1], dtype=np.int64)
    frontier_arcs = int(reduce("sum", degree[frontier]))
    unexplored = ref.n_arcs - frontier_arcs
    pushing = push_g is not None
    rows: Any = None
    level = 0
    while frontier.size and (depth_limit is None or level < depth_limit):
        checkpoint()  # a caller's stop request is honoured between levels
        if push_g is not None and pull_g is not None:
            if pushing and frontier_arcs * _ALPHA > unexplored:
                pushing = False
            elif not pushing and frontier.size * _BETA < n:
                pushing = True
        level += 1
        if pushing:
            assert push_g is not None
            _push_step(push_g, frontier, dist, pred, level)
        else:
            assert pull_g is not None
            if not is_device_module(xp) and rows is None:
                rows = pull_g.rows()
            _pull_step(pull_g, rows, dist, pred, level)
        frontier = xp.flatnonzero(dist == level)
        frontier_arcs = int(reduce("sum", degree[frontier]))
        unexplored -= frontier_arcs
    return dist, pred, level


def _push_step(g: Graph, frontier: Any, dist: Any, pred: Any, level: int) -> None:
    xp = g.xp
    starts = g.indptr[frontier]
    offsets = offsets_of(xp, g.indptr[frontier + 1] - starts)
    for item, pos in expand_chunks(xp, offsets, _PUSH_CHUNK):
        neighbours = g.indices[starts[item] + pos]
        fresh = dist[neighbours] == -1
        neighbours = neighbours[fresh]
        dist[neighbours] = level
        # A neighbour reached from several frontier vertices keeps the smallest:
        # a plain scatter lets the GPU's racing writes pick, and then two runs of
        # one BFS (a cache miss and its hit) would return different trees.
        pred[neighbours] = np.iinfo(pred.dtype).max
        xp.minimum.at(pred, neighbours, frontier[item[fresh]])


def _pull_step(g: Graph, rows: Any, dist: Any, pred: Any, level: int) -> None:
    xp = g.xp
    frontier = dist == level - 1
    if is_device_module(xp):
        from nexus_cache.graph._kernels import pull_step

        pull_step(g.indptr, g.indices, frontier, dist, pred, level)
        return
    hit = (dist[rows] == -1) & frontier[g.indices]
    vertices = rows[hit]
    dist[vertices] = level
    # The smallest parent, as the CUDA kernel (first in-neighbour found) picks.
    pred[vertices] = np.iinfo(pred.dtype).max
    xp.minimum.at(pred, vertices, g.indices[hit])
