"""Flattening variable-length work (rows of a CSR) into bounded chunks.

Item ``i`` owns ``counts[i]`` work elements; element ``f`` of the flat range
belongs to the item whose offset range holds it. Walking the flat range in
chunks of at most ``chunk`` elements bounds temporary memory no matter how
long one item (a high-degree vertex) is: one item may span many chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["chunk_elements", "expand_chunks", "offsets_of"]


def offsets_of(xp: Any, counts: Any) -> Any:
    """``[0, c0, c0+c1, ...]`` as int64 (length ``len(counts) + 1``)."""
    offsets = xp.zeros(int(counts.size) + 1, dtype=np.int64)
    if counts.size:
        offsets[1:] = xp.cumsum(counts, dtype=np.int64)
    return offsets


def chunk_elements(max_temp_bytes: int, bytes_per_element: int) -> int:
    """How many work elements fit ``max_temp_bytes`` (at least 1024)."""
    return max(1024, max_temp_bytes // bytes_per_element)


def expand_chunks(xp: Any, offsets: Any, chunk: int) -> Iterator[tuple[Any, Any]]:
    """Yield ``(item, position)`` arrays covering every element, ``chunk`` at a time."""
    total = int(offsets[-1])
    for lo in range(0, total, chunk):
        flat = xp.arange(lo, min(lo + chunk, total), dtype=np.int64)
        item = xp.searchsorted(offsets, flat, side="right") - 1
        flat -= offsets[item]
        yield item, flat
