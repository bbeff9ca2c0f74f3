"""The memory estimates against what the host algorithms really allocate (tracemalloc
counts NumPy's buffers): high enough to reserve, close enough to be useful."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from nexus_cache.graph import GraphOptions, build_graph, similarities
from nexus_cache.graph._host_engine import ENV_HOST_ENGINE
from nexus_cache.graph.memory import transient_bytes
from nexus_cache.service.datagen import rmat_edges


@pytest.fixture(autouse=True)
def host_engine(monkeypatch: pytest.MonkeyPatch) -> str:
    """The estimates model the NumPy walk; the Numba engine stays below them."""
    monkeypatch.setenv(ENV_HOST_ENGINE, "numpy")
    return "numpy"


def _undirected(src: np.ndarray, dst: np.ndarray):  # type: ignore[no-untyped-def]
    options = GraphOptions(directed=False, vertex_dtype="int32", weight_dtype="float64")
    return build_graph({"src": src, "dst": dst}, options=options)


def _peak_of_jaccard(graph) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        similarities.jaccard(graph)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _star_with_a_path(leaves: int) -> tuple[np.ndarray, np.ndarray]:
    """One hub joined to every leaf, and the leaves in a path: one long neighbour
    list, every other one short."""
    ids = np.arange(1, leaves + 1, dtype=np.int64)
    src = np.concatenate([np.zeros(leaves, dtype=np.int64), ids[:-1]])
    dst = np.concatenate([ids, ids[1:]])
    return src, dst


def test_the_similarity_headroom_follows_the_walk_not_the_longest_list() -> None:
    # count x longest list x 64 B asked for 256 MiB here (the budget), for a
    # graph of 84 KB whose walk peaks near 1.7 MB
    graph = _undirected(*_star_with_a_path(3000))
    peak = _peak_of_jaccard(graph)
    estimate = transient_bytes(graph, "jaccard", {})
    assert peak <= estimate <= 4 * peak


@pytest.mark.parametrize("scale", [8, 10])
def test_the_similarity_headroom_covers_the_measured_peak(scale: int) -> None:
    edges = rmat_edges(scale)
    graph = _undirected(edges["src"].to_numpy(), edges["dst"].to_numpy())
    peak = _peak_of_jaccard(graph)
    estimate = transient_bytes(graph, "jaccard", {})
    assert peak <= estimate <= 2 * peak + (2 << 20)
