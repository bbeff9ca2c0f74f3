"""Compiled host loops (Numba) for the steps NumPy array code cannot do fast.

Imported only by :mod:`nexus_cache.graph._host_engine` once it has found
Numba. Every kernel is ``nogil``, allocates nothing (its caller passes every
array, so NumPy's accounting sees all the memory) and writes only the
arrays it is given, so one kernel may run on many
threads at once over disjoint output ranges (that is how the engine uses
both cores; Numba's own threading layer is not used, because its default
layer aborts when two Python threads start parallel kernels at once).
Compiled code is cached on disk next to this file where that is writable.
"""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["bfs", "orient", "oriented_work", "pair_counts", "triangle_counts"]

_jit = numba.njit(nogil=True, cache=True)


@_jit
def _count(indices: Any, a0: int, a1: int, b0: int, b1: int) -> int:
    """Elements of the sorted slice ``[a0, a1)`` found in ``[b0, b1)`` (the longer).

    Each element of the first slice counts once if present (duplicates of a
    multigraph each count), the same rule as the GPU kernel. A long slice
    is binary-searched from the last hit onwards; similar lengths merge.
    """
    c = 0
    if (a1 - a0) * 8 < b1 - b0:
        lo = b0
        for e in range(a0, a1):
            w = indices[e]
            hi = b1
            while lo < hi:
                mid = (lo + hi) >> 1
                if indices[mid] < w:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < b1 and indices[lo] == w:
                c += 1
        return c
    i = a0
    j = b0
    while i < a1 and j < b1:
        x = indices[i]
        y = indices[j]
        if x < y:
            i += 1
        elif x > y:
            j += 1
        else:
            c += 1
            i += 1
    return c


@_jit
def pair_counts(
    indptr: Any,
    indices: Any,
    short: Any,
    long: Any,
    order: Any,
    marker: Any,
    counts: Any,
    start: int,
    stop: int,
) -> None:
    """``counts[p] = |N(short[p]) & N(long[p])|`` for ``p = order[i]``, ``i`` in
    ``[start, stop)``; ``order`` sorts the pairs by ``long``.

    The pairs that share one longer list either mark it in ``marker`` (one
    zeroed byte per vertex, zero again on return) and look each element of
    their shorter lists up in it, or, where that costs more than searching
    (a long list shared by few short ones), intersect pair by pair.
    """
    i = start
    while i < stop:
        big = long[order[i]]
        b0 = indptr[big]
        b1 = indptr[big + 1]
        j = i
        walked = 0
        while j < stop and long[order[j]] == big:
            s = short[order[j]]
            walked += indptr[s + 1] - indptr[s]
            j += 1
        steps = 1
        while (1 << steps) < b1 - b0:
            steps += 1
        if walked * steps < b1 - b0 + walked:
            for q in range(i, j):
                p = order[q]
                s = short[p]
                counts[p] = _count(indices, indptr[s], indptr[s + 1], b0, b1)
        else:
            for e in range(b0, b1):
                marker[indices[e]] = 1
            for q in range(i, j):
                p = order[q]
                s = short[p]
                c = 0
                for e in range(indptr[s], indptr[s + 1]):
                    c += marker[indices[e]]
                counts[p] = c
            for e in range(b0, b1):
                marker[indices[e]] = 0
        i = j


@_jit
def orient(first: Any, second: Any, rank: Any, ptr: Any, fill: Any, head: Any, edge: Any) -> None:
    """Each edge ``(first[i], second[i])`` as one arc from its lower-ranked end,
    with vertices renumbered by ``rank`` (a permutation).

    Fills a CSR over ranks (``ptr``: n + 1 zeros; ``head``: the rank of the
    higher end) and ``edge``, the input position of each arc; ``fill`` (n
    slots) is scratch. Self loops must not be among the edges. Numbering by
    rank keeps the high-degree vertices, which most rows point to, in one
    small, cache-resident range.
    """
    m = first.size
    n = ptr.size - 1
    for i in range(m):
        ra = rank[first[i]]
        rb = rank[second[i]]
        ptr[min(ra, rb) + 1] += 1
    for v in range(n):
        ptr[v + 1] += ptr[v]
        fill[v] = ptr[v]
    for i in range(m):
        ra = rank[first[i]]
        rb = rank[second[i]]
        if ra > rb:
            ra, rb = rb, ra
        slot = fill[ra]
        head[slot] = rb
        edge[slot] = i
        fill[ra] = slot + 1


@_jit
def oriented_work(ptr: Any, head: Any, work: Any) -> None:
    """``work[v]``: the wedge checks of rows ``0..v`` of an oriented CSR, summed."""
    total = 0
    for u in range(ptr.size - 1):
        for e in range(ptr[u], ptr[u + 1]):
            v = head[e]
            total += ptr[v + 1] - ptr[v] + 1
        work[u] = total


@_jit
def triangle_counts(
    ptr: Any, head: Any, edge: Any, marker: Any, counts: Any, start: int, stop: int
) -> None:
    """Add each triangle whose lowest rank is in ``[start, stop)`` to its three edges.

    ``marker`` (one slot per vertex, all -1) and ``counts`` (per input edge)
    belong to the calling thread; ``marker`` is all -1 again on return.
    """
    for u in range(start, stop):
        a0 = ptr[u]
        a1 = ptr[u + 1]
        for e in range(a0, a1):
            marker[head[e]] = edge[e]
        for e in range(a0, a1):
            v = head[e]
            found = 0
            for f in range(ptr[v], ptr[v + 1]):
                other = marker[head[f]]
                if other >= 0:
                    found += 1
                    counts[edge[f]] += 1
                    counts[other] += 1
            counts[edge[e]] += found
        for e in range(a0, a1):
            marker[head[e]] = -1


@_jit
def bfs(
    indptr: Any,
    indices: Any,
    sources: Any,
    depth_limit: int,
    mode: int,
    alpha: int,
    beta: int,
    dist: Any,
    pred: Any,
    front: Any,
    nxt: Any,
    steps: Any,
) -> int:
    """Level-synchronous BFS; returns the number of levels stepped.

    ``mode`` 1: top-down steps over out-rows only; 2: bottom-up steps over
    in-rows only; 0: rows are both (an undirected graph) and each level
    picks its step as Beamer's rule says (``alpha``, ``beta``). A vertex's
    parent is the smallest vertex of the previous level with an arc to it:
    a top-down step scans every frontier arc and keeps the minimum, a
    bottom-up step takes the first hit of a sorted row. ``dist`` and
    ``pred`` start at -1; ``depth_limit < 0`` means none; ``front`` and
    ``nxt`` (n slots each) are scratch; ``steps`` counts the top-down
    (``[0]``) and bottom-up (``[1]``) steps.
    """
    n = dist.size
    size = 0
    frontier_arcs = 0
    for s in sources:
        if dist[s] != 0:
            dist[s] = 0
            front[size] = s
            size += 1
            frontier_arcs += indptr[s + 1] - indptr[s]
    unexplored = indptr[n] - frontier_arcs
    pushing = mode != 2
    level = 0
    while size and (depth_limit < 0 or level < depth_limit):
        if mode == 0:
            if pushing and frontier_arcs * alpha > unexplored:
                pushing = False
            elif not pushing and size * beta < n:
                pushing = True
        level += 1
        found = 0
        frontier_arcs = 0
        if pushing:
            steps[0] += 1
            for q in range(size):
                u = front[q]
                for e in range(indptr[u], indptr[u + 1]):
                    w = indices[e]
                    d = dist[w]
                    if d == -1:
                        dist[w] = level
                        pred[w] = u
                        nxt[found] = w
                        found += 1
                        frontier_arcs += indptr[w + 1] - indptr[w]
                    elif d == level and u < pred[w]:
                        pred[w] = u
        else:
            steps[1] += 1
            for v in range(n):
                if dist[v] != -1:
                    continue
                for e in range(indptr[v], indptr[v + 1]):
                    u = indices[e]
                    if dist[u] == level - 1:
                        dist[v] = level
                        pred[v] = u
                        nxt[found] = v
                        found += 1
                        frontier_arcs += indptr[v + 1] - indptr[v]
                        break
        unexplored -= frontier_arcs
        front, nxt = nxt, front
        size = found
    return level
