"""CUDA kernels for the steps where plain CuPy array code does not pay.

Two kernels: the bottom-up BFS step lets each unvisited vertex stop at its
first neighbour in the frontier, which array code (one SpMV over every arc)
cannot do; the pair-intersection count walks the shorter neighbour list of
each pair with one warp and binary-searches the other list, with no
per-element temporaries (array code materializes ~64 bytes per element).
Each kernel is compiled per index-type combination and device
architecture through the package's program cache (``nexus_cache._kernel_loader``: NVRTC by
way of ``cuda.core``, CuPy's own compiler as the fallback) on first use, or
all at once by :func:`preload_kernels` (the service's warm-up). CuPy is imported
only lazily.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from nexus_cache._kernel_loader import grid_blocks

__all__ = [
    "INTERSECT_SOURCE",
    "PULL_SOURCE",
    "ctype_of",
    "intersect_counts",
    "KERNEL_NAMES",
    "INDEX_DTYPES",
    "intersect_source",
    "preload_kernels",
    "pull_source",
    "pull_step",
]

_CTYPES = {
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}

#: Bottom-up step: every unvisited vertex ``v`` scans its row (its
#: in-neighbours) and adopts the first one found in the frontier as parent.
#: ``OFFSET_T`` is the indptr type, ``VERTEX_T`` the indices type.
PULL_SOURCE = r"""
extern "C" __global__ void bfs_pull(
    const OFFSET_T* __restrict__ indptr,
    const VERTEX_T* __restrict__ indices,
    const unsigned char* __restrict__ frontier,
    int* __restrict__ dist,
    VERTEX_T* __restrict__ pred,
    const int level,
    const long long n)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < n; v += stride) {
        if (dist[v] != -1) continue;
        OFFSET_T end = indptr[v + 1];
        for (OFFSET_T e = indptr[v]; e < end; ++e) {
            VERTEX_T u = indices[e];
            if (frontier[u]) {
                dist[v] = level;
                pred[v] = u;
                break;
            }
        }
    }
}
"""


#: One warp per pair: lanes stride over the shorter sorted row and
#: binary-search each element in the longer one; a warp reduction gives the
#: intersection size. The pair loop is warp-uniform, so full-mask shuffles
#: are safe.
INTERSECT_SOURCE = r"""
extern "C" __global__ void pair_intersections(
    const OFFSET_T* __restrict__ indptr,
    const VERTEX_T* __restrict__ indices,
    const VERTEX_T* __restrict__ first,
    const VERTEX_T* __restrict__ second,
    const long long n_pairs,
    long long* __restrict__ counts)
{
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long p = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; p < n_pairs;
         p += warps) {
        long long a0 = indptr[first[p]], a1 = indptr[first[p] + 1];
        long long b0 = indptr[second[p]], b1 = indptr[second[p] + 1];
        if (a1 - a0 > b1 - b0) {
            long long t0 = a0, t1 = a1;
            a0 = b0; a1 = b1; b0 = t0; b1 = t1;
        }
        long long c = 0;
        for (long long e = a0 + lane; e < a1; e += 32) {
            VERTEX_T w = indices[e];
            long long lo = b0, hi = b1;
            while (lo < hi) {
                long long mid = (lo + hi) >> 1;
                if (indices[mid] < w) lo = mid + 1; else hi = mid;
            }
            if (lo < b1 && indices[lo] == w) ++c;
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            c += __shfl_down_sync(0xffffffffu, c, offset);
        }
        if (lane == 0) counts[p] = c;
    }
}
"""


def ctype_of(dtype: Any) -> str:
    """The C type name of an int32 / int64 dtype."""
    return _CTYPES[np.dtype(dtype)]


def _typed(source: str, offset_dtype: Any, vertex_dtype: Any) -> str:
    return (
        f"typedef {ctype_of(offset_dtype)} OFFSET_T;\n"
        f"typedef {ctype_of(vertex_dtype)} VERTEX_T;\n" + source
    )


def pull_source(offset_dtype: Any, vertex_dtype: Any) -> str:
    """The compilable source of the bottom-up kernel for these dtypes."""
    return _typed(PULL_SOURCE, offset_dtype, vertex_dtype)


def intersect_source(offset_dtype: Any, vertex_dtype: Any) -> str:
    """The compilable source of the pair-intersection kernel for these dtypes."""
    return _typed(INTERSECT_SOURCE, offset_dtype, vertex_dtype)


#: kernel name -> its source for given (offset, vertex) dtypes
_SOURCES = {"bfs_pull": pull_source, "pair_intersections": intersect_source}
KERNEL_NAMES = tuple(_SOURCES)
#: the index dtypes a graph may use (offsets and vertices alike)
INDEX_DTYPES = tuple(_CTYPES)


@functools.lru_cache(maxsize=16)
def _source_and_label(name: str, offset: np.dtype, vertex: np.dtype) -> tuple[str, str]:
    return _SOURCES[name](offset, vertex), f"{name}({offset.name}, {vertex.name})"


def _kernel(name: str, offset_dtype: Any, vertex_dtype: Any) -> Any:
    """The kernel ``name`` for these dtypes on the current device (loaded once per device)."""
    from nexus_cache._kernel_loader import kernel_function

    source, label = _source_and_label(name, np.dtype(offset_dtype), np.dtype(vertex_dtype))
    return kernel_function(name, source, label)


def preload_kernels() -> list[Any]:
    """Make every kernel ready on the current device, for every dtype combination.

    Returns the :class:`~nexus_cache._kernel_loader.KernelLoad` of each
    kernel loaded by this call (none for kernels this process already holds).
    It needs CuPy and a CUDA device: on the host backend nothing is compiled.

    Returns
    -------
    list of KernelLoad
        The kernels this call compiled or read from the program cache.

    Raises
    ------
    ModuleNotFoundError
        CuPy is not installed.

    Examples
    --------
    >>> from nexus_cache.graph import preload_kernels
    >>> loads = preload_kernels()  # doctest: +SKIP
    >>> sorted({load.origin for load in loads})  # doctest: +SKIP
    ['compiled']
    """
    from nexus_cache._kernel_loader import kernel_loads

    before = len(kernel_loads())
    for name in KERNEL_NAMES:
        for offset in INDEX_DTYPES:
            for vertex in INDEX_DTYPES:
                _kernel(name, offset, vertex)
    return list(kernel_loads()[before:])


def intersect_counts(indptr: Any, indices: Any, first: Any, second: Any) -> Any:
    """``|N(first[i]) & N(second[i])|`` for every pair, as int64 (GPU, one pass)."""
    import cupy

    first = cupy.ascontiguousarray(first, dtype=indices.dtype)
    second = cupy.ascontiguousarray(second, dtype=indices.dtype)
    n_pairs = int(first.size)
    counts = cupy.zeros(n_pairs, dtype=cupy.int64)
    if n_pairs == 0:
        return counts
    kernel = _kernel("pair_intersections", indptr.dtype, indices.dtype)
    threads = 256
    blocks = grid_blocks(n_pairs * 32, threads, most=65535 * 16)
    kernel((blocks,), (threads,), (indptr, indices, first, second, np.int64(n_pairs), counts))
    return counts


def pull_step(indptr: Any, indices: Any, frontier: Any, dist: Any, pred: Any, level: int) -> None:
    """Run one bottom-up BFS level on the GPU, in place on ``dist`` and ``pred``."""
    import cupy

    n = int(indptr.size) - 1
    if n <= 0:
        return
    kernel = _kernel("bfs_pull", indptr.dtype, indices.dtype)
    threads = 256
    blocks = grid_blocks(n, threads)
    kernel(
        (blocks,),
        (threads,),
        (
            indptr,
            indices,
            frontier.view(cupy.uint8),
            dist,
            pred,
            np.int32(level),
            np.int64(n),
        ),
    )
