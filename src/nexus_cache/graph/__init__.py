"""Graph algorithms on NumPy or CuPy: CSR construction, BFS, PageRank, similarities.

Everything here is written once against an array module ``xp`` (NumPy with
``scipy.sparse`` on the host, CuPy with ``cupyx.scipy.sparse`` on the GPU);
a graph lives on the module of the edge columns it was built from (or the
``xp`` given to :func:`build_graph`). Results are :class:`GraphResult`
frames keyed by the original vertex ids; ``to_arrow()`` gives a
``pyarrow.Table``.
"""

from __future__ import annotations

from nexus_cache.graph.bfs import bfs
from nexus_cache.graph.csr import Graph, build_graph
from nexus_cache.graph.options import DUPLICATE_RULES, ORIENTATIONS, GraphOptions
from nexus_cache.graph.pagerank import pagerank
from nexus_cache.graph.result import GraphResult
from nexus_cache.graph.similarity import (
    DEFAULT_MAX_TEMP_BYTES,
    METRICS,
    cosine,
    jaccard,
    overlap,
    similarity,
    sorensen,
)

__all__ = [
    "DEFAULT_MAX_TEMP_BYTES",
    "DUPLICATE_RULES",
    "METRICS",
    "ORIENTATIONS",
    "Graph",
    "GraphOptions",
    "GraphResult",
    "bfs",
    "build_graph",
    "cosine",
    "jaccard",
    "overlap",
    "pagerank",
    "similarity",
    "sorensen",
]
