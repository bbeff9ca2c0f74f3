"""Neighbourhood similarity of vertex pairs: Jaccard, Sorensen, Overlap, Cosine.

With ``N(u)`` the set of neighbours of ``u`` (out-neighbours on a directed
graph, as stored in the graph's orientation) and ``c = |N(u) & N(v)|``:

* Jaccard ``c / |N(u) | N(v)|``; Sorensen ``2c / (|N(u)| + |N(v)|)``;
* Overlap ``c / min(|N(u)|, |N(v)|)``; Cosine ``c / sqrt(|N(u)| * |N(v)|)``;

and 0 where the denominator is 0. Weights are ignored; the graph should
merge duplicates (a ``keep`` multigraph counts every copy).

Memory bound: ``c`` is counted by walking the shorter neighbour list of each
pair and binary-searching each element in the other (sorted) list. On CuPy
one kernel does the walk with a warp per pair and no per-element
temporaries. On NumPy the walk is flattened over all pairs and processed in
chunks of ``max_temp_bytes / _BYTES_PER_ELEMENT`` elements, so temporary
memory stays within ``max_temp_bytes`` (default 256 MiB) however high a
vertex's degree. Both add O(pairs) arrays for the pairs, their degrees,
counts and the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache._sizes import parse_size
from nexus_cache.errors import GraphInputError
from nexus_cache.graph._expand import chunk_elements, expand_chunks, offsets_of
from nexus_cache.graph._host_engine import (
    edge_common_neighbours,
    host_kernels,
    pair_common_neighbours,
)
from nexus_cache.graph.arrays import is_device_module
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.result import GraphResult

__all__ = [
    "DEFAULT_MAX_TEMP_BYTES",
    "METRICS",
    "common_neighbours",
    "edge_pairs",
    "cosine",
    "jaccard",
    "overlap",
    "similarity",
    "sorensen",
]

DEFAULT_MAX_TEMP_BYTES = 256 << 20
# Live temporaries per walked element: flat index, pair, position, arc,
# element, search bounds and the found flag, at 8 bytes each.
_BYTES_PER_ELEMENT = 64
METRICS = ("jaccard", "sorensen", "overlap", "cosine")


def _contains(indices: Any, lo: Any, hi: Any, values: Any) -> Any:
    """Whether ``values[i]`` is in the sorted slice ``indices[lo[i]:hi[i]]`` (NumPy)."""
    lo = lo.copy()
    hi0 = hi
    hi = hi.copy()
    # Vectorized binary search: every lane halves its own [lo, hi) slice.
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) >> 1
        below = np.zeros(lo.shape, dtype=bool)
        below[active] = indices[mid[active]] < values[active]
        lo = np.where(active & below, mid + 1, lo)
        hi = np.where(active & ~below, mid, hi)
    found = lo < hi0
    found[found] = indices[lo[found]] == values[found]
    return found


def edge_pairs(graph: Graph) -> tuple[Any, Any, Any | None]:
    """``(first, second, loops)``: every stored arc ``u -> v`` once as dense
    indices (``u != v`` on a directed graph; ``u < v`` on an undirected one, so
    each edge once), self loops left out, and on an undirected graph the
    vertices with a self loop (None on a directed one).

    Parameters
    ----------
    graph : Graph
        The graph whose arcs are listed.

    Returns
    -------
    tuple of (array, array, array or None)
        ``first`` and ``second`` dense indices, and the self-loop vertices
        (None on a directed graph).

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, edge_pairs
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> first, second, loops = edge_pairs(g)
    >>> first.tolist(), second.tolist(), loops.tolist()
    ([0, 0, 1, 2], [1, 2, 2, 3], [])
    """
    first, second = graph.rows(), graph.indices
    loops = None if graph.directed else first[first == second]
    keep = first != second if graph.directed else first < second
    return first[keep].astype(graph.indices.dtype), second[keep], loops


def common_neighbours(
    graph: Graph, first: Any, second: Any, max_temp_bytes: int, loops: Any | None = None
) -> tuple[Any, Any, Any]:
    """``(counts, degrees of first, degrees of second)``: ``|N(u) & N(v)|`` of each
    pair of dense indices (int64) and the two ends' row lengths.

    A self loop makes a vertex its own neighbour, so it counts. ``loops``
    (the vertices with a self loop) is given when the pairs are every edge of
    an undirected graph (:func:`edge_pairs`): the host engine then counts
    triangles instead of intersecting each pair. Temporary memory beyond
    O(pairs) stays within ``max_temp_bytes`` (see the module notes). Reads
    ``graph`` only; thread-safe.

    Parameters
    ----------
    graph : Graph
        The graph.
    first, second : array of int
        The pairs' ends as dense indices (``graph.dense`` maps original ids).
    max_temp_bytes : int
        The bound on temporary memory, in bytes.
    loops : array or None, optional
        The self-loop vertices from :func:`edge_pairs`, when the pairs are
        every edge of an undirected graph.

    Returns
    -------
    tuple of (array, array, array)
        The common-neighbour count of each pair and the degrees of both ends.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, common_neighbours, edge_pairs
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> first, second, loops = edge_pairs(g)
    >>> counts, deg_first, deg_second = common_neighbours(g, first, second, 1 << 20, loops)
    >>> counts.tolist(), deg_first.tolist(), deg_second.tolist()
    ([1, 1, 1, 0], [2, 2, 2, 3], [2, 3, 3, 1])
    """
    xp = graph.xp
    indptr = graph.indptr.astype(np.int64, copy=False)
    deg_a = indptr[first + 1] - indptr[first]
    deg_b = indptr[second + 1] - indptr[second]
    if is_device_module(xp):
        from nexus_cache.graph._kernels import intersect_counts

        return intersect_counts(graph.indptr, graph.indices, first, second), deg_a, deg_b
    kernels = host_kernels()
    if kernels is not None:
        if loops is not None and graph.options.duplicates != "keep":
            counts = edge_common_neighbours(kernels, graph, first, second, loops, max_temp_bytes)
        else:
            counts = pair_common_neighbours(kernels, graph, first, second)
        return counts, deg_a, deg_b
    a_short = deg_a <= deg_b
    short = xp.where(a_short, first, second)
    long_ = xp.where(a_short, second, first)
    del a_short
    counts = xp.zeros(int(first.size), dtype=np.int64)
    offsets = offsets_of(xp, xp.minimum(deg_a, deg_b))
    chunk = chunk_elements(max_temp_bytes, _BYTES_PER_ELEMENT)
    for pair, pos in expand_chunks(xp, offsets, chunk):
        element = graph.indices[indptr[short[pair]] + pos]
        other = long_[pair]
        found = _contains(graph.indices, indptr[other], indptr[other + 1], element)
        # ``pair`` is non-decreasing within a chunk: the hits of each pair are a
        # run, counted by binary search (no atomics on one hot counter).
        low, high = int(pair[0]), int(pair[-1])
        hits = pair[found]
        bounds = xp.searchsorted(hits, xp.arange(low, high + 2, dtype=np.int64), side="left")
        counts[low : high + 1] += xp.diff(bounds)
    return counts, deg_a, deg_b


def _coefficient(xp: Any, metric: str, c: Any, da: Any, db: Any) -> Any:
    c = c.astype(np.float64)
    if metric == "jaccard":
        denom = (da + db - c).astype(np.float64)
    elif metric == "sorensen":
        c = 2 * c
        denom = (da + db).astype(np.float64)
    elif metric == "overlap":
        denom = xp.minimum(da, db).astype(np.float64)
    else:
        denom = xp.sqrt(da.astype(np.float64) * db.astype(np.float64))
    return xp.where(denom > 0, c / xp.where(denom > 0, denom, 1.0), 0.0)


def similarity(
    graph: Graph,
    metric: str,
    pairs: tuple[Any, Any] | None = None,
    *,
    max_temp_bytes: int | str = DEFAULT_MAX_TEMP_BYTES,
) -> GraphResult:
    """Similarity ``metric`` of ``pairs`` (original ids) or of every edge.

    ``pairs`` is ``(first ids, second ids)``; without it every stored arc
    ``u -> v`` is scored (each undirected edge once, with ``u < v`` by dense
    index, self loops left out). Returns columns ``first``, ``second`` and
    ``metric`` (float64). ``max_temp_bytes`` bounds the temporary memory of
    the counting walk (see the module notes). Reads ``graph`` only.

    Parameters
    ----------
    graph : Graph
        The graph to score.
    metric : str
        One of :data:`METRICS`: ``jaccard``, ``sorensen``, ``overlap`` or
        ``cosine``.
    pairs : (array-like, array-like) or None, optional
        ``(first ids, second ids)`` to score; None scores every edge.
    max_temp_bytes : int or str, optional
        The bound on temporary memory (bytes, or a size such as ``"64M"``).

    Returns
    -------
    GraphResult
        Columns ``first``, ``second`` and ``metric``;
        ``info["max_temp_bytes"]``.

    Raises
    ------
    GraphInputError
        ``metric`` is not known, a pair names no vertex of the graph, or the
        two sides differ in length.
    ConfigError
        ``max_temp_bytes`` is not a size.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, similarity
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> similarity(g, "jaccard").to_arrow().to_pydict()
    {'first': [1, 1, 2, 3], 'second': [2, 3, 3, 4], 'jaccard': [0.333..., 0.25, 0.25, 0.0]}
    """
    if metric not in METRICS:
        raise GraphInputError(f"similarity metric={metric!r}: use one of {', '.join(METRICS)}")
    budget = parse_size(max_temp_bytes, name="max_temp_bytes")
    xp = graph.xp
    loops = None
    if pairs is None:
        first, second, loops = edge_pairs(graph)
    else:
        try:
            ids_a, ids_b = pairs
        except (TypeError, ValueError) as exc:
            raise GraphInputError("pairs must be a pair (first ids, second ids)") from exc
        first = graph.dense(ids_a, "first vertices of pairs")
        second = graph.dense(ids_b, "second vertices of pairs")
        if first.shape != second.shape:
            raise GraphInputError(
                f"pairs have {first.size} first and {second.size} second vertices; "
                "give equal numbers"
            )
    if first.size == 0:
        # no pair (an empty graph, or ``([], [])``): an empty result, and no
        # zero-sized kernel launch or chunk walk
        score = xp.zeros(0, dtype=np.float64)
    else:
        counts, deg_a, deg_b = common_neighbours(graph, first, second, budget, loops)
        score = _coefficient(xp, metric, counts, deg_a, deg_b)
    return GraphResult(
        {
            "first": graph.original(first),
            "second": graph.original(second),
            metric: score,
        },
        info={"max_temp_bytes": budget},
    )


def jaccard(graph: Graph, pairs: tuple[Any, Any] | None = None, **kw: Any) -> GraphResult:
    """Jaccard similarity; see :func:`similarity`.

    Parameters
    ----------
    graph : Graph
        The graph to score.
    pairs : (array-like, array-like) or None, optional
        ``(first ids, second ids)`` to score; None scores every edge.
    **kw
        ``max_temp_bytes``, as for :func:`similarity`.

    Returns
    -------
    GraphResult
        Columns ``first``, ``second`` and ``jaccard`` (float64).

    Raises
    ------
    GraphInputError
        A pair names no vertex of the graph, or the two sides differ in length.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, jaccard
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> jaccard(g, pairs=([1], [2])).to_arrow().to_pydict()
    {'first': [1], 'second': [2], 'jaccard': [0.333...]}
    """
    return similarity(graph, "jaccard", pairs, **kw)


def sorensen(graph: Graph, pairs: tuple[Any, Any] | None = None, **kw: Any) -> GraphResult:
    """Sorensen-Dice similarity; see :func:`similarity`.

    Parameters
    ----------
    graph : Graph
        The graph to score.
    pairs : (array-like, array-like) or None, optional
        ``(first ids, second ids)`` to score; None scores every edge.
    **kw
        ``max_temp_bytes``, as for :func:`similarity`.

    Returns
    -------
    GraphResult
        Columns ``first``, ``second`` and ``sorensen`` (float64).

    Raises
    ------
    GraphInputError
        A pair names no vertex of the graph, or the two sides differ in length.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, sorensen
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> sorensen(g, pairs=([1], [2])).to_arrow().to_pydict()
    {'first': [1], 'second': [2], 'sorensen': [0.5]}
    """
    return similarity(graph, "sorensen", pairs, **kw)


def overlap(graph: Graph, pairs: tuple[Any, Any] | None = None, **kw: Any) -> GraphResult:
    """Overlap coefficient; see :func:`similarity`.

    Parameters
    ----------
    graph : Graph
        The graph to score.
    pairs : (array-like, array-like) or None, optional
        ``(first ids, second ids)`` to score; None scores every edge.
    **kw
        ``max_temp_bytes``, as for :func:`similarity`.

    Returns
    -------
    GraphResult
        Columns ``first``, ``second`` and ``overlap`` (float64).

    Raises
    ------
    GraphInputError
        A pair names no vertex of the graph, or the two sides differ in length.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, overlap
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> overlap(g, pairs=([1], [2])).to_arrow().to_pydict()
    {'first': [1], 'second': [2], 'overlap': [0.5]}
    """
    return similarity(graph, "overlap", pairs, **kw)


def cosine(graph: Graph, pairs: tuple[Any, Any] | None = None, **kw: Any) -> GraphResult:
    """Cosine similarity; see :func:`similarity`.

    Parameters
    ----------
    graph : Graph
        The graph to score.
    pairs : (array-like, array-like) or None, optional
        ``(first ids, second ids)`` to score; None scores every edge.
    **kw
        ``max_temp_bytes``, as for :func:`similarity`.

    Returns
    -------
    GraphResult
        Columns ``first``, ``second`` and ``cosine`` (float64).

    Raises
    ------
    GraphInputError
        A pair names no vertex of the graph, or the two sides differ in length.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, cosine
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> g = build_graph(edges, options=GraphOptions(directed=False))
    >>> cosine(g, pairs=([1], [2])).to_arrow().to_pydict()
    {'first': [1], 'second': [2], 'cosine': [0.5]}
    """
    return similarity(graph, "cosine", pairs, **kw)
