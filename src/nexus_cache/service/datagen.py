"""Synthetic data for the demo and the tests: an R-MAT edge table and a fact table.

:func:`rmat_edges` draws a Kronecker (R-MAT) graph with the Graph500
parameters: ``2**scale`` vertices, ``edge_factor * 2**scale`` edges,
quadrant probabilities A=0.57, B=0.19, C=0.19 (D=0.05), vertex labels
permuted at random, optionally with a timestamp per edge. :func:`ring_edges`
is a directed ring with one chord, on which PageRank with ``alpha`` near 1
converges very slowly (long-running queries on demand). :func:`fact_table`
draws a small sales-like table.
:func:`write_parquet` writes either as Parquet with several row groups.
Deterministic for a given seed.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["EDGE_YEAR", "GRAPH500_ABC", "fact_table", "ring_edges", "rmat_edges", "write_parquet"]

#: Graph500's R-MAT quadrant probabilities A, B, C (D = 1 - A - B - C)
GRAPH500_ABC = (0.57, 0.19, 0.19)


#: the year the edges' ``ts`` column spans (UTC, seconds)
EDGE_YEAR = 2025
_YEAR_START_S = 1735689600  # 2025-01-01T00:00:00Z
_YEAR_S = 365 * 86400


def rmat_edges(
    scale: int, edge_factor: int = 16, seed: int = 1, *, timestamps: bool = False
) -> pa.Table:
    """Columns ``src``, ``dst`` (int64) of an R-MAT graph; may hold loops and duplicates.

    With ``timestamps``, a third column ``ts`` (``timestamp[s, UTC]``) spreads the
    edges uniformly over the year :data:`EDGE_YEAR`, for time-window filters; the
    ``src`` and ``dst`` columns are the same either way.
    """
    if not 1 <= scale <= 40 or edge_factor < 1:
        raise ValueError(f"scale={scale} must be in 1..40 and edge_factor={edge_factor} >= 1")
    a, b, c = GRAPH500_ABC
    rng = np.random.default_rng(seed)
    m = edge_factor << scale
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    # Per bit: the row half is the lower one with probability A+B; given it,
    # the column half is the left one with A/(A+B), else C/(C+D).
    ab = a + b
    left_given_top, left_given_bottom = a / ab, c / (1 - ab)
    for bit in range(scale):
        bottom = rng.random(m) > ab
        threshold = np.where(bottom, left_given_bottom, left_given_top)
        right = rng.random(m) > threshold
        src |= bottom.astype(np.int64) << bit
        dst |= right.astype(np.int64) << bit
    labels = rng.permutation(1 << scale).astype(np.int64)
    order = rng.permutation(m)
    columns = {"src": labels[src[order]], "dst": labels[dst[order]]}
    if not timestamps:
        return pa.table(columns)
    seconds = _YEAR_START_S + rng.integers(0, _YEAR_S, m, dtype=np.int64)
    return pa.table({**columns, "ts": pa.array(seconds, pa.timestamp("s", tz="UTC"))})


def ring_edges(n_vertices: int) -> pa.Table:
    """Columns ``src``, ``dst`` (int64): the ring ``v -> v+1 (mod n)`` and the chord
    ``0 -> n//2``. Its walk is nearly periodic, so PageRank's change per
    iteration stays near ``1 - alpha``: with ``alpha=0.99999`` and a small
    ``tol`` it runs until ``max_iter`` (about 1 ms an iteration at 100k
    vertices on the host backend)."""
    if n_vertices < 3:
        raise ValueError(f"n_vertices={n_vertices} must be >= 3")
    src = np.arange(n_vertices, dtype=np.int64)
    dst = (src + 1) % n_vertices
    return pa.table(
        {"src": np.append(src, 0), "dst": np.append(dst, n_vertices // 2).astype(np.int64)}
    )


def fact_table(rows: int, seed: int = 2) -> pa.Table:
    """``order_id`` int64, ``customer`` int32, ``amount`` float64, ``region`` string."""
    rng = np.random.default_rng(seed)
    regions = np.array(["north", "south", "east", "west", "central"])
    return pa.table(
        {
            "order_id": np.arange(rows, dtype=np.int64),
            "customer": rng.integers(0, max(1, rows // 10), rows, dtype=np.int32),
            "amount": np.round(rng.gamma(2.0, 40.0, rows), 2),
            "region": pa.array(regions[rng.integers(0, len(regions), rows)]),
        }
    )


def write_parquet(table: pa.Table, path: str | os.PathLike[str], row_groups: int = 8) -> None:
    """Write ``table`` as one Parquet file of about ``row_groups`` row groups."""
    size = max(1, -(-table.num_rows // max(1, row_groups)))
    pq.write_table(table, path, row_group_size=size)
