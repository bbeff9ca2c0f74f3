"""PageRank by power iteration, one sparse matrix-vector product per iteration.

Semantics follow NetworkX's ``pagerank``: an arc ``u -> v`` of weight ``w``
passes ``w / out_weight(u)`` of ``u``'s rank to ``v``; the rank of
dangling vertices (no out-arcs, or out-weight 0) is spread by ``dangling``
(default: the personalization vector); the teleport share ``1 - alpha``
follows ``personalization`` (default: uniform). Iteration stops when the
L1 change between two iterations is below ``tol`` (``convergence="total"``,
the default, as cuGraph reads its ``tol``), or below ``n_vertices * tol``
(``convergence="networkx"``, NetworkX's rule, which stops a graph of
millions of vertices after one or two iterations).

Out-weights are summed and divided in float64 whatever the arithmetic type,
so float32 weights near the type's limit (``2e38 + 2e38``) cannot overflow a
vertex's total and drop its rank.

The transition matrix is built once per call in pull orientation (rows =
destinations) so that each iteration is a plain CSR SpMV; a directed graph
built ``orientation='transposed'`` gives it without a transient transpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache.errors import ConfigError, GraphConvergenceError, GraphInputError
from nexus_cache.graph._reductions import reduce
from nexus_cache.graph.arrays import occurrences
from nexus_cache.graph.csr import Graph
from nexus_cache.graph.options import _WEIGHT_DTYPES
from nexus_cache.graph.registry import CONVERGENCE_RULES, _finite
from nexus_cache.graph.result import GraphResult
from nexus_cache.graph.stopping import checkpoint

__all__ = ["CONVERGENCE_RULES", "pagerank"]

VertexValues = tuple[Any, Any]


def _check(name: str, value: Any, lo: float, hi: float, *, closed_lo: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and _finite(value) and (value >= lo if closed_lo else value > lo) and value <= hi
    if not ok:
        bound = "[" if closed_lo else "("
        raise ConfigError(f"pagerank {name}={value!r}: use a number in {bound}{lo}, {hi}]")


def _arithmetic_type(dtype: Any, default: str) -> np.dtype[Any]:
    """``dtype`` (default ``default``) as float32 or float64; ConfigError otherwise."""
    try:
        chosen = np.dtype(dtype or default)
    except TypeError:
        chosen = None
    if chosen is None or chosen.name not in _WEIGHT_DTYPES:
        raise ConfigError(
            f"pagerank dtype={dtype!r} is not accepted; use one of "
            + ", ".join(repr(t) for t in _WEIGHT_DTYPES)
            + " (or None for the graph's weight_dtype)"
        )
    return chosen


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
    try:
        values = xp.asarray(values, dtype=dtype).reshape(-1)
    except (TypeError, ValueError) as exc:  # text, or values of no numeric form
        raise GraphInputError(
            f"pagerank {name} values must be numbers ({exc}); give one number per vertex"
        ) from exc
    if values.shape != dense.shape:
        raise GraphInputError(
            f"pagerank {name}: {dense.size} vertices but {values.size} values; give one each"
        )
    if bool(reduce("any", values < 0)) or not bool(reduce("all", xp.isfinite(values))):
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
    convergence: str = "total",
) -> GraphResult:
    """PageRank of every vertex: columns ``vertex`` (original id) and ``pagerank``.

    ``personalization``, ``dangling`` and ``initial`` are optional pairs
    ``(vertex ids, values)``; vertices left out get 0, values are normalized
    to sum 1. ``convergence`` says how ``tol`` is read (:data:`CONVERGENCE_RULES`):
    ``total`` (default) stops when the L1 change of the rank vector is below
    ``tol``, ``networkx`` when it is below ``n_vertices * tol``. ``info``
    holds ``iterations``, ``converged``, ``error`` (the last L1 change) and
    ``threshold`` (what it had to drop below). When the threshold is not met
    within ``max_iter`` iterations the last vector is returned with
    ``converged=False``, or :class:`~nexus_cache.errors.GraphConvergenceError`
    is raised if ``fail_on_nonconvergence``. ``dtype`` is the arithmetic type
    (default: the graph's ``weight_dtype``). Reads ``graph`` only; thread-safe.

    Parameters
    ----------
    graph : Graph
        The graph; edge weights, when it has them, weight the transitions.
    alpha : float, optional
        The damping factor, in [0, 1].
    tol : float, optional
        The convergence tolerance, > 0 (read as ``convergence`` says).
    max_iter : int, optional
        The most power iterations, >= 1.
    personalization, dangling, initial : (ids, values) or None, optional
        The teleport distribution, the dangling vertices' distribution and
        the start vector (default: uniform).
    fail_on_nonconvergence : bool, optional
        Raise instead of returning an unconverged vector.
    dtype : {"float32", "float64"} or None, optional
        The arithmetic type (default: the graph's ``weight_dtype``).
    convergence : {"total", "networkx"}, optional
        How ``tol`` is read.

    Returns
    -------
    GraphResult
        Columns ``vertex`` and ``pagerank``; ``info`` holds ``iterations``,
        ``converged``, ``error`` and ``threshold``.

    Raises
    ------
    ConfigError
        A parameter is out of range or not accepted.
    GraphInputError
        A weight is infinite or negative, or a vector names no vertex of the
        graph.
    GraphConvergenceError
        ``fail_on_nonconvergence`` and no convergence within ``max_iter``.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph, pagerank
    >>> edges = {"src": np.array([1, 2, 3, 3]), "dst": np.array([2, 3, 1, 4])}
    >>> ranks = pagerank(build_graph(edges, options=GraphOptions(directed=False)))
    >>> [round(float(rank), 3) for rank in ranks["pagerank"]]
    [0.246, 0.246, 0.367, 0.141]
    >>> ranks.info["converged"]
    True
    """
    _check("alpha", alpha, 0.0, 1.0)
    _check("tol", tol, 0.0, float("inf"), closed_lo=False)
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ConfigError(f"pagerank max_iter={max_iter!r}: use an int >= 1")
    if convergence not in CONVERGENCE_RULES:
        raise ConfigError(
            f"pagerank convergence={convergence!r} is not accepted; use one of "
            + ", ".join(repr(r) for r in CONVERGENCE_RULES)
        )
    xp = graph.xp
    dtype = _arithmetic_type(dtype, graph.options.weight_dtype)
    n = graph.n_vertices
    threshold = tol * n if convergence == "networkx" else tol
    if n == 0:
        empty = GraphResult({"vertex": graph.vertex_ids, "pagerank": xp.zeros(0, dtype)})
        empty.info.update(iterations=0, converged=True, error=0.0, threshold=threshold)
        return empty
    pull = graph.in_csr()
    if pull.weights is not None and pull.n_arcs:
        w = pull.weights
        # an infinite weight turns every rank into NaN; a negative one is no
        # transition probability: refuse both rather than return garbage
        if bool(reduce("any", ~xp.isfinite(w))) or bool(reduce("any", w < 0)):
            column = f"weight column {graph.weight_column!r}" if graph.weight_column else "weights"
            raise GraphInputError(
                f"pagerank needs finite edge weights >= 0; the graph's {column} has "
                "infinite or negative weights (after duplicate edges were summed); fix or "
                "drop those edges"
            )
    sources = pull.indices  # the tail u of every arc u -> v (row v)
    # Out-weights in float64 (bincount's type): float32 weights near their
    # limit would overflow the sum, and every arc of that vertex would carry 0.
    if pull.weights is None:
        out_weight = occurrences(xp, sources, n).astype(np.float64)
        transition = 1.0 / xp.where(out_weight == 0, 1.0, out_weight)[sources]
    else:
        weights = pull.weights.astype(np.float64, copy=False)
        out_weight = xp.bincount(sources, weights=weights, minlength=n)
        transition = weights / xp.where(out_weight == 0, 1.0, out_weight)[sources]
        del weights
    is_dangling = out_weight == 0
    del out_weight
    matrix = pull.matrix(transition.astype(dtype, copy=False))
    del transition
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
        checkpoint()  # a caller's stop request is honoured between iterations
        iterations += 1
        dangling_mass = x[dangling_index].sum() if dangling_index.size else 0.0
        new = matrix @ x
        new *= alpha
        new += teleport
        if dangling_index.size:
            new += (alpha * dangling_mass) * spread
        error = float(xp.abs(new - x).sum())
        x = new
        if error < threshold:
            converged = True
            break
    if not converged and fail_on_nonconvergence:
        needed = "n_vertices * tol" if convergence == "networkx" else "tol"
        raise GraphConvergenceError(
            f"pagerank did not converge in max_iter={max_iter} iterations (last L1 change "
            f"{error:.3g}, needed < {needed} = {threshold:.3g}); raise max_iter or tol"
        )
    result = GraphResult({"vertex": graph.vertex_ids, "pagerank": x})
    result.info.update(
        iterations=iterations, converged=converged, error=error, threshold=threshold
    )
    return result
