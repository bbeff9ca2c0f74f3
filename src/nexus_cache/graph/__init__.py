"""Graph algorithms on NumPy or CuPy: CSR construction, BFS, PageRank, similarities, degree.

Everything here is written once against an array module ``xp`` (NumPy with
``scipy.sparse`` on the host, CuPy with ``cupyx.scipy.sparse`` on the GPU);
a graph lives on the module of the edge columns it was built from (or the
``xp`` given to :func:`build_graph`). Results are :class:`GraphResult`
frames keyed by the original vertex ids; ``to_arrow()`` gives a
``pyarrow.Table``. :data:`ALGORITHMS` (``graph.registry``) lists every
algorithm with its parameters, result columns and construction contract.

The package is lazy: each public name loads its module on first access, so
importing one submodule (``nexus_cache.graph.options``) stays cheap.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "ALGORITHMS": "nexus_cache.graph.registry",
    "AlgorithmSpec": "nexus_cache.graph.registry",
    "CONVERGENCE_RULES": "nexus_cache.graph.registry",
    "DEFAULT_MAX_TEMP_BYTES": "nexus_cache.graph.similarities",
    "DUPLICATE_RULES": "nexus_cache.graph.options",
    "METRICS": "nexus_cache.graph.similarities",
    "ORIENTATIONS": "nexus_cache.graph.options",
    "Graph": "nexus_cache.graph.csr",
    "GraphOptions": "nexus_cache.graph.options",
    "GraphResult": "nexus_cache.graph.result",
    "KernelLoad": "nexus_cache.graph._programs",
    "bfs": "nexus_cache.graph.traversal",
    "build_graph": "nexus_cache.graph.csr",
    "common_neighbours": "nexus_cache.graph.similarities",
    "cosine": "nexus_cache.graph.similarities",
    "degree": "nexus_cache.graph.degrees",
    "edge_pairs": "nexus_cache.graph.similarities",
    "get_spec": "nexus_cache.graph.registry",
    "jaccard": "nexus_cache.graph.similarities",
    "kernel_function": "nexus_cache.graph._programs",
    "kernel_loads": "nexus_cache.graph._programs",
    "overlap": "nexus_cache.graph.similarities",
    "pagerank": "nexus_cache.graph.ranking",
    "preload_kernels": "nexus_cache.graph._kernels",
    "similarity": "nexus_cache.graph.similarities",
    "sorensen": "nexus_cache.graph.similarities",
    "triangles": "nexus_cache.graph.triangle_counts",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
