"""The kept rows of several masks, with one read back from the device for all.

``xp.nonzero(mask)`` must learn how many rows a mask keeps before it can size
its result, so on a GPU each call waits for the device: a filtered scan of
four objects waited four times, and the device idled while the host launched
the next object's kernels. :func:`kept_rows` takes every mask's running count
(``cumsum``), reads the last count of each in one copy (one wait), then writes
each mask's row indices in place by one kernel launch (``compact_rows``: the
row of each kept position). On the host (NumPy) ``flatnonzero`` has no wait
to save, and runs as it is. :func:`_kept_rows` is the one flow both use, its
kernel passed in: CI runs it with the kernel's NumPy port. Pure functions;
thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["COMPACT_SOURCE", "kept_rows"]

#: One thread per row (grid-stride): a kept row's index into its place, given
#: by the running count of kept rows up to and including it.
COMPACT_SOURCE = r"""
extern "C" __global__ void compact_rows(
    const bool* __restrict__ mask,
    const long long* __restrict__ position,
    long long* __restrict__ out,
    const long long n)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        if (mask[i]) out[position[i] - 1] = i;
}
"""

_THREADS = 256

#: ``compact(mask, position, out)``: ``out[position[i] - 1] = i`` where ``mask[i]``
Compact = Callable[[Any, Any, Any], None]


def kept_rows(masks: Sequence[Any | None], xp: Any) -> list[Any | None]:
    """The indices (int64, ascending) of the rows each boolean mask of ``masks``
    keeps, as arrays of ``xp`` (None where the mask is None). On a device, one
    read back for all the masks."""
    if xp is np:
        return [None if m is None else np.flatnonzero(m) for m in masks]
    return _kept_rows(masks, xp, _cuda_compact)


def _kept_rows(masks: Sequence[Any | None], xp: Any, compact: Compact) -> list[Any | None]:
    positions = [None if m is None else xp.cumsum(m, dtype=np.int64) for m in masks]
    lasts = [p[-1:] for p in positions if p is not None and p.size]
    counts = iter(xp.concatenate(lasts).get().tolist() if lasts else ())  # the one wait
    out: list[Any | None] = []
    for mask, position in zip(masks, positions, strict=True):
        if position is None:
            out.append(None)
            continue
        kept = int(next(counts)) if position.size else 0
        rows = xp.empty(kept, np.int64)
        if kept:
            compact(mask, position, rows)
        out.append(rows)
    return out


def _cuda_compact(mask: Any, position: Any, out: Any) -> None:
    from nexus_cache._kernel_loader import grid_blocks, kernel_function

    n = int(mask.size)
    kernel = kernel_function("compact_rows", COMPACT_SOURCE, "compact_rows")
    kernel((grid_blocks(n, _THREADS),), (_THREADS,), (mask, position, out, np.int64(n)))
