"""Sort-based CSR construction: renumbering, edge preparation, packed-key sort.

No COO-to-CSR conversion of SciPy or CuPy is used: those took seconds for
2**28 edges on an H200. Here each arc becomes one int64 key
``row << bits | column``; one sort of the keys (CUB radix sort on CuPy)
orders the arcs row-major with sorted columns, equal keys become adjacent
(duplicates merge in one pass), and a count of the rows gives ``indptr``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache.errors import GraphInputError
from nexus_cache.graph._reductions import reduce
from nexus_cache.graph.arrays import is_device_module, scatter_add, scatter_max, scatter_min

__all__ = ["Renumbering", "csr_from_arcs", "renumber", "rows_of"]

# A direct-address table is used for renumbering when the id span is at most
# this many slots per edge endpoint (plus a small floor): ids from a dense or
# nearly dense range then avoid the sort that sparse ids (10**12 + k) need.
_TABLE_SLOTS_PER_ENDPOINT = 4
_TABLE_FLOOR = 1 << 16


class Renumbering:
    """Dense indices of both endpoint arrays and the sorted original ids."""

    __slots__ = ("dst", "src", "vertex_ids")

    def __init__(self, src: Any, dst: Any, vertex_ids: Any) -> None:
        self.src = src
        self.dst = dst
        self.vertex_ids = vertex_ids


def renumber(xp: Any, src: Any, dst: Any, index_dtype: Any) -> Renumbering:
    """Map int64 ids to ``0..n-1`` in ascending id order (``vertex_ids`` is sorted).

    Every id that appears as an endpoint gets an index, including ids whose
    only edges are self loops that edge preparation drops later.
    """
    m = int(src.size)
    if m == 0:
        empty = xp.zeros(0, dtype=index_dtype)
        return Renumbering(empty, empty, xp.zeros(0, dtype=np.int64))
    lo = min(int(src.min()), int(dst.min()))
    hi = max(int(src.max()), int(dst.max()))
    span = hi - lo + 1  # Python ints: no overflow for ids near +-2**63
    if span <= _TABLE_SLOTS_PER_ENDPOINT * 2 * m + _TABLE_FLOOR:
        present = xp.zeros(span, dtype=bool)
        # Ids from 0 (the common case) index the table directly, with no copy.
        src_off = src - lo if lo else src
        dst_off = dst - lo if lo else dst
        present[src_off] = True
        present[dst_off] = True
        vertex_ids = xp.flatnonzero(present).astype(np.int64) + lo
        _check_vertex_count(int(vertex_ids.size), index_dtype)
        dense_of = xp.cumsum(present, dtype=index_dtype)
        dense_of -= 1
        return Renumbering(dense_of[src_off], dense_of[dst_off], vertex_ids)
    vertex_ids, inverse = xp.unique(xp.concatenate([src, dst]), return_inverse=True)
    _check_vertex_count(int(vertex_ids.size), index_dtype)
    inverse = inverse.reshape(-1).astype(index_dtype, copy=False)
    return Renumbering(inverse[:m], inverse[m:], vertex_ids)


def _check_vertex_count(n: int, index_dtype: Any) -> None:
    if n > np.iinfo(index_dtype).max:
        raise GraphInputError(
            f"{n} distinct vertices do not fit vertex_dtype={np.dtype(index_dtype).name}; "
            "build with GraphOptions(vertex_dtype='int64')"
        )


def _segment_reduce(xp: Any, values: Any, is_start: Any, rule: str) -> Any:
    """Reduce runs of ``values`` that start where ``is_start`` is True."""
    starts = xp.flatnonzero(is_start)
    if not is_device_module(xp):
        ufunc = {"sum": np.add, "min": np.minimum, "max": np.maximum}[rule]
        return ufunc.reduceat(values, starts)
    segment = xp.cumsum(is_start, dtype=np.int64) - 1
    k = int(starts.size)
    if rule == "sum":
        out = xp.zeros(k, dtype=values.dtype)
        scatter_add(xp, out, segment, values)
    elif rule == "min":
        out = xp.full(k, np.inf, dtype=values.dtype)
        scatter_min(xp, out, segment, values)
    else:
        out = xp.full(k, -np.inf, dtype=values.dtype)
        scatter_max(xp, out, segment, values)
    return out


def csr_from_arcs(
    xp: Any,
    rows: Any,
    cols: Any,
    weights: Any | None,
    n: int,
    duplicates: str,
    index_dtype: Any,
    count_dtype: Any = None,
) -> tuple[Any, Any, Any | None]:
    """``(indptr, indices, weights)`` of the arcs ``rows[i] -> cols[i]`` (dense ids).

    Columns are sorted within each row. Duplicate arcs are merged with
    ``duplicates`` (``sum``, ``min``, ``max``) or all kept (``keep``). With
    ``count_dtype``, unweighted arcs merged under ``sum`` weigh one each: when
    an arc repeats, the weights returned are the counts (in ``count_dtype``),
    so a repeated edge counts as often as it appears, weighted or not.
    """
    bits = max(1, (max(n, 1) - 1).bit_length())
    if 2 * bits > 62:
        raise GraphInputError(f"{n} vertices are too many to pack an arc into an int64 key")
    key = rows.astype(np.int64)
    key <<= bits
    key |= cols  # in place: no int64 copy of the columns
    if weights is None:
        key = xp.sort(key)
    else:
        order = xp.argsort(key)
        key = key[order]
        weights = weights[order]
        del order
    if duplicates != "keep" and key.size > 1:
        is_start = xp.empty(key.shape, dtype=bool)
        is_start[0] = True
        xp.not_equal(key[1:], key[:-1], out=is_start[1:])
        if weights is not None:
            weights = _segment_reduce(xp, weights, is_start, duplicates)
        elif count_dtype is not None and duplicates == "sum" and not bool(reduce("all", is_start)):
            starts = xp.flatnonzero(is_start)
            weights = xp.empty(starts.shape, dtype=count_dtype)
            weights[:-1] = starts[1:] - starts[:-1]
            weights[-1] = key.size - starts[-1]
            del starts
        key = key[is_start]
        del is_start
    indices = (key & ((1 << bits) - 1)).astype(index_dtype)
    key >>= bits  # now the row of every arc, in ascending order
    # Row starts by binary search in the sorted rows: no atomics, no second pass.
    indptr = xp.searchsorted(key, xp.arange(n + 1, dtype=np.int64), side="left")
    del key
    indptr_dtype = np.int32 if indices.size < np.iinfo(np.int32).max else np.int64
    return indptr.astype(indptr_dtype, copy=False), indices, weights


def rows_of(xp: Any, indptr: Any, n_arcs: int) -> Any:
    """The row of every arc of a CSR (O(n + arcs), no search)."""
    n = int(indptr.size) - 1
    if n_arcs == 0:
        return xp.zeros(0, dtype=np.int64)
    # Mark where each row after the first starts; the running count is the row.
    # int32 marks: a position starts at most n rows, and int32 atomics are universal.
    starts = xp.zeros(n_arcs + 1, dtype=np.int32)
    scatter_add(xp, starts, indptr[1:n], xp.ones(max(n - 1, 0), dtype=np.int32))
    return xp.cumsum(starts[:n_arcs], dtype=np.int64)
