"""PageRank by power iteration, one sparse matrix-vector product per iteration.

Semantics follow NetworkX's ``pagerank``: an arc ``u -> v`` of weight ``w``
passes ``w / out_weight(u)`` of ``u``'s rank to ``v``; the rank of
dangling vertices (no out-arcs, or out-weight 0) is spread by ``dangling``
(default: the personalization vector); the teleport share ``1 - alpha``
follows ``personalization`` (default: uniform). Iteration stops when the
L1 change is below ``n_vertices * tol``.

The transition matrix is built once per call in pull orientation (rows =
destinations) so that each iteration is a plain CSR SpMV; a directed graph
built ``orientation='transposed'`` gives it without a transient transpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache.errors import ConfigError, GraphConvergenceError, GraphInputError
from nexus_cache.graph.arrays import scatter_add
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.result import GraphResult

__all__ = ["pagerank"]

VertexValues = tuple[Any, Any]


def _check(name: str, value: Any, lo: float, hi: float, *, closed_lo: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and np.isfinite(value) and (value >= lo if closed_lo else value > lo) and value <= hi
    if not ok:
        bound = "[" if closed_lo else "("
        raise ConfigError(f"pagerank {name}={value!r}: use a number in {bound}{lo}, {hi}]")


def _vector(graph: Graph, given: VertexValues | None, name: str, dtype: Any) -> Any | None:
    """A normalized dense vector from ``(vertex ids, values)``; None when not given."""
    if given is None:
        return None
    xp = graph.xp
    try:
        ids, values = given
    except (TypeError, ValueError) as exc:
        raise GraphInputError(f"pagerank {name} must be a pair (vertex ids, values)") from exc
    dense = graph.dense(ids, f"pagerank {name} vertices")
    values = xp.asarray(values, dtype=dtype).reshape(-1)
    if values.shape != dense.shape:
        raise GraphInputError(
            f"pagerank {name}: {dense.size} vertices but {values.size} values; give one each"
        )
    if bool((values < 0).any()) or not bool(xp.isfinite(values).all()):
        raise GraphInputError(f"pagerank {name} values must be finite and >= 0")
    vector = xp.zeros(graph.n_vertices, dtype=dtype)
    vector[dense] = values
    total = float(vector.sum())
    if total <= 0:
        raise GraphInputError(f"pagerank {name} values sum to 0; give a positive total")
    vector /= total
    return vector


def pagerank(
    graph: Graph,
    *,
    alpha: float = 0.85,
    tol: float = 1.0e-6,
    max_iter: int = 100,
    personalization: VertexValues | None = None,
    dangling: VertexValues | None = None,
    initial: VertexValues | None = None,
    fail_on_nonconvergence: bool = False,
    dtype: Any = None,
) -> GraphResult:
    """PageRank of every vertex: columns ``vertex`` (original id) and ``pagerank``.

    ``personalization``, ``dangling`` and ``initial`` are optional pairs
    ``(vertex ids, values)``; vertices left out get 0, values are normalized
    to sum 1. ``info`` holds ``iterations``, ``converged`` and ``error`` (the
    last L1 change). When the tolerance is not met within ``max_iter``
    iterations the last vector is returned with ``converged=False``, or
    :class:`~nexus_cache.errors.GraphConvergenceError` is raised if
    ``fail_on_nonconvergence``. ``dtype`` is the arithmetic type (default:
    the graph's ``weight_dtype``). Reads ``graph`` only; thread-safe.
    """
    _check("alpha", alpha, 0.0, 1.0)
    _check("tol", tol, 0.0, float("inf"), closed_lo=False)
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ConfigError(f"pagerank max_iter={max_iter!r}: use an int >= 1")
    xp = graph.xp
    dtype = np.dtype(dtype or graph.options.weight_dtype)
    n = graph.n_vertices
    if n == 0:
        empty = GraphResult({"vertex": graph.vertex_ids, "pagerank": xp.zeros(0, dtype)})
        empty.info.update(iterations=0, converged=True, error=0.0)
        return empty
    pull = graph.in_csr()
    if pull.weights is not None and pull.n_arcs:
        w = pull.weights
        # an infinite weight turns every rank into NaN; a negative one is no
        # transition probability: refuse both rather than return garbage
        if bool((~xp.isfinite(w)).any()) or bool((w < 0).any()):
            raise GraphInputError(
                "pagerank needs finite edge weights >= 0; the graph has infinite or negative "
                "weights (after duplicate edges were summed); fix or drop those edges"
            )
    sources = pull.indices  # the tail u of every arc u -> v (row v)
    weights = (
        pull.weights.astype(dtype, copy=False)
        if pull.weights is not None
        else xp.ones(pull.n_arcs, dtype=dtype)
    )
    out_weight = xp.zeros(n, dtype=dtype)
    scatter_add(xp, out_weight, sources, weights)
    is_dangling = out_weight == 0
    share = xp.where(is_dangling, 1, out_weight).astype(dtype)
    matrix = pull.matrix(weights / share[sources])
    del weights, share
    p = _vector(graph, personalization, "personalization", dtype)
    if p is None:
        p = xp.full(n, 1.0 / n, dtype=dtype)
    spread = _vector(graph, dangling, "dangling", dtype)
    spread = p if spread is None else spread
    x = _vector(graph, initial, "initial", dtype)
    x = xp.full(n, 1.0 / n, dtype=dtype) if x is None else x
    teleport = (1 - alpha) * p
    dangling_index = xp.flatnonzero(is_dangling)
    error = float("inf")
    iterations = 0
    converged = False
    while iterations < max_iter:
        iterations += 1
        dangling_mass = x[dangling_index].sum() if dangling_index.size else 0.0
        new = matrix @ x
        new *= alpha
        new += teleport
        if dangling_index.size:
            new += (alpha * dangling_mass) * spread
        error = float(xp.abs(new - x).sum())
        x = new
        if error < n * tol:
            converged = True
            break
    if not converged and fail_on_nonconvergence:
        raise GraphConvergenceError(
            f"pagerank did not converge in max_iter={max_iter} iterations (last L1 change "
            f"{error:.3g}, needed < n_vertices * tol = {n * tol:.3g}); raise max_iter or tol"
        )
    result = GraphResult({"vertex": graph.vertex_ids, "pagerank": x})
    result.info.update(iterations=iterations, converged=converged, error=error)
    return result
