"""Triangles through every vertex of an undirected graph (NetworkX's ``triangles``).

Reuses the similarities' per-edge intersection
(:func:`~nexus_cache.graph.similarities.common_neighbours`): for every edge
``u - v`` the common neighbours ``|N(u) & N(v)|`` are the triangles through
that edge, and each triangle through ``u`` is seen from both of its edges at
``u``, so ``triangles(u)`` is half the sum over ``u``'s edges. On the GPU the
intersection is one kernel; on the host, with Numba, a triangle count over
the edges, else the chunked NumPy walk, in ``max_temp_bytes``.

Self loops are ignored, as in NetworkX: an end's self loop made it its own
neighbour in the intersection, and that count is taken back. Directed graphs
and multigraphs (``duplicates="keep"``) are refused: NetworkX counts
triangles of simple undirected graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nexus_cache._sizes import parse_size
from nexus_cache.errors import GraphInputError
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.memory import similarity_transient_bytes
from nexus_cache.graph.result import GraphResult
from nexus_cache.graph.similarities import DEFAULT_MAX_TEMP_BYTES, common_neighbours, edge_pairs

__all__ = ["transient_bytes", "triangles"]


def triangles(graph: Graph, *, max_temp_bytes: int | str = DEFAULT_MAX_TEMP_BYTES) -> GraphResult:
    """Columns ``vertex`` (original id) and ``triangles`` (int64), one row per vertex.

    ``graph`` must be undirected without kept duplicates; ``max_temp_bytes``
    bounds the host walk's temporaries, as for the similarities. Reads
    ``graph`` only; thread-safe.

    Parameters
    ----------
    graph : Graph
        An undirected graph.
    max_temp_bytes : int or str, optional
        The bound on temporary memory (bytes, or a size such as ``"64M"``).

    Returns
    -------
    GraphResult
        Columns ``vertex`` and ``triangles``.

    Raises
    ------
    GraphInputError
        The graph is directed, or was built with ``duplicates="keep"``.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, triangles
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> triangles(g).to_arrow().to_pydict()
    {'vertex': [1, 2, 3, 4], 'triangles': [1, 1, 1, 0]}
    """
    if graph.directed:
        raise GraphInputError(
            "triangles counts triangles of an undirected graph; build it with "
            "GraphOptions(directed=False) (the command line: --undirected)"
        )
    if graph.options.duplicates == "keep":
        raise GraphInputError(
            "triangles needs each edge once; build the graph with duplicates "
            "'sum', 'min' or 'max', not 'keep'"
        )
    budget = parse_size(max_temp_bytes, name="max_temp_bytes")
    xp, n = graph.xp, graph.n_vertices
    first, second, loops = edge_pairs(graph)
    through_u = xp.zeros(n, dtype=np.int64)
    if int(first.size):
        counts, _, _ = common_neighbours(graph, first, second, budget, loops)
        counts = counts.astype(np.int64, copy=False)
        if loops is not None and int(loops.size):
            # a looped end was its own common neighbour: not a triangle
            looped = xp.zeros(n, dtype=np.int64)
            looped[loops] = 1
            counts = counts - looped[first] - looped[second]
        # each vertex's edges, both ends: bincount with integer weights is exact
        # (float64 holds counts up to 2**53)
        through_u = xp.bincount(
            xp.concatenate([first, second]),
            weights=xp.concatenate([counts, counts]).astype(np.float64),
            minlength=n,
        ).astype(np.int64)
    return GraphResult({"vertex": graph.vertex_ids, "triangles": through_u // 2})


def transient_bytes(graph: Graph, arguments: Mapping[str, Any]) -> int:
    """The similarities' estimate for every edge, plus the per-edge and per-vertex
    sums (both ends of every edge, in int64 and float64)."""
    extra = graph.n_arcs * 32 + graph.n_vertices * 24
    return similarity_transient_bytes(graph, arguments) + extra
