"""Upper estimates of the memory a graph build and each algorithm's run take.

A device cache reserves these in its ledger before building a graph or
running an algorithm on a parked one (the "headroom"), so the estimates err
high. They count bytes per vertex, per stored arc and per input edge, from
the arrays each step allocates; none of them is a hard bound on the
allocator (pool rounding and library temporaries come on top).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nexus_cache._sizes import parse_size
from nexus_cache.graph._expand import chunk_elements
from nexus_cache.graph.arrays import is_device_module
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.options import GraphOptions
from nexus_cache.graph.similarities import DEFAULT_MAX_TEMP_BYTES

__all__ = ["build_bytes", "result_bytes", "transient_bytes"]

# Input copies (two int64 id columns) and the renumbered int32/int64 endpoints.
_BUILD_PER_EDGE = 32
# Per stored arc: the packed key, the sort's output and scratch, the indices.
_BUILD_PER_ARC = 40
# Weighted builds also sort an order array and gather the weights.
_BUILD_PER_WEIGHTED_ARC = 24
# BFS: distances, predecessors, masks, frontier list, result ids per vertex.
_BFS_PER_VERTEX = 40
# BFS top-down expansion: pair, position, neighbour, fresh mask per element.
_BFS_PER_EXPANDED = 40
_BFS_EXPANSION_CAP = 1 << 24
# Similarity: pair ids, degrees, counts and score per pair.
_SIMILARITY_PER_PAIR = 64
# The host's chunked walk: its bytes per element. The walk sizes its chunks at
# 64 B per element, but its measured peak (tracemalloc, R-MAT scale 10 and 12)
# is about 76 B per element: err high.
_SIMILARITY_PER_ELEMENT = 80
# What the walk itself assumes when it cuts chunks (graph.similarities).
_SIMILARITY_CHUNK_PER_ELEMENT = 64
# A transient transpose: rows, packed key, sort scratch, new indices.
_TRANSPOSE_PER_ARC = 36
# Result tables: PageRank (id int64, rank float64); BFS (id int64, distance
# int32, predecessor int64, and two validity bitmaps); a similarity (two ids
# int64 and a float64 score) per scored pair.
_RESULT_PER_VERTEX = {"pagerank": 16, "bfs": 24}
_RESULT_PER_PAIR = 24
# Arrow buffers are padded: a few KiB whatever the size.
_RESULT_FIXED = 1 << 12
# Arcs per block when sizing a similarity's walk (bounds the estimate's own memory).
_WORK_BLOCK_ARCS = 1 << 20


def build_bytes(n_edges: int, options: GraphOptions, weighted: bool) -> int:
    """Peak bytes of :func:`~nexus_cache.graph.build_graph` on ``n_edges`` edges."""
    arcs = n_edges if options.directed else 2 * n_edges
    per_arc = _BUILD_PER_ARC + (_BUILD_PER_WEIGHTED_ARC if weighted else 0)
    return n_edges * _BUILD_PER_EDGE + arcs * per_arc + (1 << 20)


def result_bytes(algorithm: str, n_edges: int, n_vertices: int) -> int:
    """Upper bound of the bytes of ``algorithm``'s result table (Arrow) on a graph of
    ``n_edges`` input edges and at most ``n_vertices`` vertices: one row per vertex
    (PageRank, BFS), or per scored pair (a similarity scores each input edge at most
    once)."""
    per_vertex = _RESULT_PER_VERTEX.get(algorithm)
    rows = n_edges * _RESULT_PER_PAIR if per_vertex is None else n_vertices * per_vertex
    return rows + _RESULT_FIXED


def _similarity_work(graph: Graph) -> tuple[int, int]:
    """``(pairs, elements)`` of an all-edges similarity on a host graph: the arcs it
    scores and the work elements its counting walk expands (the shorter
    neighbour list of each pair), counted block by block."""
    xp = graph.xp
    indptr = graph.indptr.astype(np.int64, copy=False)
    degree = xp.diff(indptr)
    pairs = elements = 0
    vertex, n = 0, graph.n_vertices
    while vertex < n:
        end = int(xp.searchsorted(indptr, indptr[vertex] + _WORK_BLOCK_ARCS, side="right")) - 1
        end = min(max(end, vertex + 1), n)
        rows = xp.repeat(xp.arange(vertex, end), degree[vertex:end])
        columns = graph.indices[int(indptr[vertex]) : int(indptr[end])]
        keep = rows != columns if graph.directed else rows < columns
        rows, columns = rows[keep], columns[keep]
        pairs += int(rows.size)
        elements += int(xp.minimum(degree[rows], degree[columns]).sum())
        vertex = end
    return pairs, elements


def transient_bytes(graph: Graph, algorithm: str, params: Mapping[str, Any]) -> int:
    """Bytes ``algorithm`` allocates besides ``graph`` while it runs (and its result)."""
    n, arcs = graph.n_vertices, graph.n_arcs
    transpose = arcs * _TRANSPOSE_PER_ARC
    if algorithm == "bfs":
        needs_transpose = graph.directed and params.get("direction", "auto") != "auto"
        expanded = min(arcs, _BFS_EXPANSION_CAP) * _BFS_PER_EXPANDED
        rows = arcs * 8  # the host's bottom-up step keeps the row of every arc
        extra = transpose if needs_transpose else 0
        return n * _BFS_PER_VERTEX + expanded + rows + extra + (1 << 20)
    if algorithm == "pagerank":
        size = np.dtype(params.get("dtype") or graph.options.weight_dtype).itemsize
        extra = transpose if graph.directed and not graph.options.stores_in_edges else 0
        # per arc: float64 weights, the gathered out-weights and the float64
        # transition probabilities, then the matrix's copy in ``dtype``; per
        # vertex: the float64 out-weights and masks, and the iteration vectors
        return arcs * (24 + size) + n * (16 + 10 * size) + extra + (1 << 20)
    pairs = params.get("pairs")
    count = arcs if pairs is None else len(pairs[0])
    rows = arcs * 8 if pairs is None else 0
    budget = parse_size(
        params.get("max_temp_bytes", DEFAULT_MAX_TEMP_BYTES), name="max_temp_bytes"
    )
    chunk = 0
    if not is_device_module(graph.xp) and arcs:  # the GPU kernel walks without temporaries
        # The walk goes in chunks of at most chunk_elements(budget) elements:
        # its temporaries are the smaller of one chunk and the whole walk.
        if pairs is None:
            count, elements = _similarity_work(graph)
        else:  # a few given pairs: bound each by the longest neighbour list
            elements = count * int(graph.xp.diff(graph.indptr).max())
        chunk = min(chunk_elements(budget, _SIMILARITY_CHUNK_PER_ELEMENT), elements)
        chunk *= _SIMILARITY_PER_ELEMENT
    return count * _SIMILARITY_PER_PAIR + rows + chunk + (1 << 20)
