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

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache._kernel_loader import KernelLoad as KernelLoad
    from nexus_cache._kernel_loader import kernel_loads as kernel_loads
    from nexus_cache.graph._host_engine import HOST_ENGINE_VARIABLE as HOST_ENGINE_VARIABLE
    from nexus_cache.graph._kernels import preload_kernels as preload_kernels
    from nexus_cache.graph.csr import Graph as Graph
    from nexus_cache.graph.csr import build_graph as build_graph
    from nexus_cache.graph.degrees import degree as degree
    from nexus_cache.graph.options import DUPLICATE_RULES as DUPLICATE_RULES
    from nexus_cache.graph.options import ORIENTATIONS as ORIENTATIONS
    from nexus_cache.graph.options import GraphOptions as GraphOptions
    from nexus_cache.graph.ranking import pagerank as pagerank
    from nexus_cache.graph.registry import ALGORITHMS as ALGORITHMS
    from nexus_cache.graph.registry import CONVERGENCE_RULES as CONVERGENCE_RULES
    from nexus_cache.graph.registry import AlgorithmSpec as AlgorithmSpec
    from nexus_cache.graph.registry import get_spec as get_spec
    from nexus_cache.graph.result import GraphResult as GraphResult
    from nexus_cache.graph.similarities import DEFAULT_MAX_TEMP_BYTES as DEFAULT_MAX_TEMP_BYTES
    from nexus_cache.graph.similarities import METRICS as METRICS
    from nexus_cache.graph.similarities import common_neighbours as common_neighbours
    from nexus_cache.graph.similarities import cosine as cosine
    from nexus_cache.graph.similarities import edge_pairs as edge_pairs
    from nexus_cache.graph.similarities import jaccard as jaccard
    from nexus_cache.graph.similarities import overlap as overlap
    from nexus_cache.graph.similarities import similarity as similarity
    from nexus_cache.graph.similarities import sorensen as sorensen
    from nexus_cache.graph.traversal import bfs as bfs
    from nexus_cache.graph.triangle_counts import triangles as triangles

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "HOST_ENGINE_VARIABLE": "nexus_cache.graph._host_engine",
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
    "KernelLoad": "nexus_cache._kernel_loader",
    "bfs": "nexus_cache.graph.traversal",
    "build_graph": "nexus_cache.graph.csr",
    "common_neighbours": "nexus_cache.graph.similarities",
    "cosine": "nexus_cache.graph.similarities",
    "degree": "nexus_cache.graph.degrees",
    "edge_pairs": "nexus_cache.graph.similarities",
    "get_spec": "nexus_cache.graph.registry",
    "jaccard": "nexus_cache.graph.similarities",
    "kernel_loads": "nexus_cache._kernel_loader",
    "overlap": "nexus_cache.graph.similarities",
    "pagerank": "nexus_cache.graph.ranking",
    "preload_kernels": "nexus_cache.graph._kernels",
    "similarity": "nexus_cache.graph.similarities",
    "sorensen": "nexus_cache.graph.similarities",
    "triangles": "nexus_cache.graph.triangle_counts",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
