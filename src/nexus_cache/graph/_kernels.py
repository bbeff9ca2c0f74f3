"""CUDA kernels for the steps where plain CuPy array code does not pay.

Only the bottom-up BFS step is a kernel: it lets each unvisited vertex stop
at its first neighbour in the frontier, which array code (one SpMV over
every arc) cannot do. Kernels are compiled by CuPy (NVRTC) on first use and
cached per dtype combination; CuPy is imported only here and lazily.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["PULL_SOURCE", "ctype_of", "pull_source", "pull_step"]

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


def ctype_of(dtype: Any) -> str:
    """The C type name of an int32 / int64 dtype."""
    return _CTYPES[np.dtype(dtype)]


def pull_source(offset_dtype: Any, vertex_dtype: Any) -> str:
    """The compilable source of the bottom-up kernel for these dtypes."""
    return (
        f"typedef {ctype_of(offset_dtype)} OFFSET_T;\n"
        f"typedef {ctype_of(vertex_dtype)} VERTEX_T;\n" + PULL_SOURCE
    )


@functools.lru_cache(maxsize=8)
def _pull_kernel(offset_dtype: np.dtype, vertex_dtype: np.dtype) -> Any:
    import cupy

    return cupy.RawKernel(pull_source(offset_dtype, vertex_dtype), "bfs_pull")


def pull_step(indptr: Any, indices: Any, frontier: Any, dist: Any, pred: Any, level: int) -> None:
    """Run one bottom-up BFS level on the GPU, in place on ``dist`` and ``pred``."""
    import cupy

    n = int(indptr.size) - 1
    if n <= 0:
        return
    kernel = _pull_kernel(np.dtype(indptr.dtype), np.dtype(indices.dtype))
    threads = 256
    blocks = min((n + threads - 1) // threads, 65535 * 8)
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
