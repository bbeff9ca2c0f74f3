"""Degree of every vertex: the number of arcs that leave, enter or touch it.

Plain array-module work on the CSR, the same on NumPy and CuPy: row lengths
(``diff(indptr)``) count the arcs a row holds and a ``bincount`` of the
column indices counts the arcs that point at each vertex, so either
orientation gives out- and in-degrees without a transpose.

NetworkX's rules: on a directed graph ``out`` and ``in`` count arcs and
``total`` is their sum (``DiGraph.degree``), so a self loop counts once each
way and twice in total; on an undirected graph every direction gives
``Graph.degree``, where a self loop counts twice. Every stored arc counts
once: each neighbour once after ``duplicates="sum"``, ``"min"`` or
``"max"``, every copy of a repeated edge under ``"keep"``
(``MultiDiGraph.degree``). Weights are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nexus_cache.errors import ConfigError
from nexus_cache.graph.arrays import occurrences
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.registry import ALGORITHMS
from nexus_cache.graph.result import GraphResult

__all__ = ["DIRECTIONS", "degree", "transient_bytes"]

#: ``total``: arcs in and out (directed) or edges (undirected); ``out``, ``in``.
DIRECTIONS = ALGORITHMS["degree"].param("direction").choices


def degree(graph: Graph, *, direction: str = "total") -> GraphResult:
    """Columns ``vertex`` (original id) and ``degree`` (int64), one row per vertex.

    ``direction`` is one of :data:`DIRECTIONS`; it matters on a directed
    graph only. Reads ``graph`` only; thread-safe.

    Parameters
    ----------
    graph : Graph
        The graph.
    direction : {"total", "out", "in"}, optional
        Which arcs count on a directed graph.

    Returns
    -------
    GraphResult
        Columns ``vertex`` and ``degree``.

    Raises
    ------
    ConfigError
        ``direction`` is not accepted.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import build_graph, degree
    >>> g = build_graph({"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])})
    >>> degree(g, direction="out").to_arrow().to_pydict()
    {'vertex': [1, 2, 3, 4], 'degree': [1, 1, 2, 0]}
    """
    if direction not in DIRECTIONS:
        raise ConfigError(
            f"degree direction={direction!r} is not accepted; use one of "
            + ", ".join(repr(d) for d in DIRECTIONS)
        )
    xp, n = graph.xp, graph.n_vertices
    rows = xp.diff(graph.indptr).astype(np.int64, copy=False)
    if not graph.directed:
        # a self loop is one stored arc but two ends of an edge
        every_row = graph.rows()
        counts = rows + occurrences(xp, every_row[every_row == graph.indices], n)
    else:
        # rows hold out-neighbours unless the graph is stored transposed
        columns = occurrences(xp, graph.indices, n)
        outs, ins = (columns, rows) if graph.options.stores_in_edges else (rows, columns)
        counts = {"out": outs, "in": ins}.get(direction)
        if counts is None:
            counts = outs + ins
    return GraphResult({"vertex": graph.vertex_ids, "degree": counts})


def transient_bytes(graph: Graph, arguments: Mapping[str, Any]) -> int:
    """Upper bound of the bytes :func:`degree` allocates besides ``graph``.

    Per arc: the row of every arc and the self-loop mask (undirected); per
    vertex: row lengths, the column counts, their sum and the result's ids
    and degrees, at 8 bytes each.
    """
    return graph.n_arcs * 9 + graph.n_vertices * 40 + (1 << 20)
