"""Property test: the sort-based CSR equals a plain-Python reference for any edge list."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_cache.graph import GraphOptions, build_graph

INT64 = st.integers(-(2**63), 2**63 - 1)
RULES = {"sum": sum, "min": min, "max": max}


@st.composite
def edge_lists(draw: st.DrawFn) -> tuple[list[int], list[int], list[float]]:
    # A few distinct ids anywhere in int64 (so both renumbering paths run),
    # reused so that duplicates and self loops are common.
    base = draw(INT64)
    spread = draw(st.sampled_from([1, 10, 2**40]))
    ids = draw(
        st.lists(
            st.integers(0, 12).map(lambda k: max(-(2**63), min(2**63 - 1, base + k * spread))),
            min_size=1,
            max_size=12,
        )
    )
    m = draw(st.integers(0, 30))
    src = draw(st.lists(st.sampled_from(ids), min_size=m, max_size=m))
    dst = draw(st.lists(st.sampled_from(ids), min_size=m, max_size=m))
    weights = draw(st.lists(st.integers(1, 8).map(float), min_size=m, max_size=m))
    return src, dst, weights


@settings(max_examples=100, deadline=None)
@given(
    edges=edge_lists(),
    directed=st.booleans(),
    drop=st.booleans(),
    rule=st.sampled_from(["sum", "min", "max"]),
    transposed=st.booleans(),
)
def test_csr_equals_the_reference(
    edges: tuple[list[int], list[int], list[float]],
    directed: bool,
    drop: bool,
    rule: str,
    transposed: bool,
) -> None:
    src, dst, weights = edges
    options = GraphOptions(
        directed=directed,
        drop_self_loops=drop,
        duplicates=rule,  # type: ignore[arg-type]
        vertex_dtype="int64",
        weight_dtype="float64",
        orientation="transposed" if transposed else "as_stored",
    )
    frame = {
        "src": np.array(src, dtype=np.int64),
        "dst": np.array(dst, dtype=np.int64),
        "w": np.array(weights, dtype=np.float64),
    }
    graph = build_graph(frame, weight="w", options=options)
    groups: dict[tuple[int, int], list[float]] = {}
    for u, v, w in zip(src, dst, weights, strict=True):
        if drop and u == v:
            continue
        arcs = [(u, v)] if directed or u == v else [(u, v), (v, u)]
        for a, b in arcs:
            row, col = (b, a) if directed and transposed else (a, b)
            groups.setdefault((row, col), []).append(w)
    expected = {arc: RULES[rule](ws) for arc, ws in groups.items()}
    ids = graph.vertex_ids.tolist()
    assert ids == sorted(set(src) | set(dst))
    got = {}
    for i, row in enumerate(ids):
        lo, hi = graph.indptr[i], graph.indptr[i + 1]
        cols = graph.indices[lo:hi].tolist()
        assert cols == sorted(cols)
        for j, w in zip(cols, graph.weights[lo:hi].tolist(), strict=True):
            got[(row, ids[j])] = w
    assert got == expected
