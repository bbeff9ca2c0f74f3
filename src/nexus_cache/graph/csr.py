"""The :class:`Graph` (a CSR on NumPy or CuPy) and :func:`build_graph`."""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache.errors import GraphInputError
from nexus_cache.graph._build import csr_from_arcs, renumber, rows_of
from nexus_cache.graph._reductions import reduce
from nexus_cache.graph.arrays import sparse_module, to_numpy
from nexus_cache.graph.edges import edge_columns, vertex_array
from nexus_cache.graph.options import GraphOptions

__all__ = ["Graph", "build_graph"]


class Graph:
    """A graph in compressed sparse row form, on the array module ``xp``.

    Vertices are the dense indices ``0..n_vertices-1``; ``vertex_ids[i]`` is
    the original (int64) id of index ``i`` and is sorted ascending. Within a
    row, column indices are sorted. Row ``u`` holds the out-neighbours of
    ``u`` unless the options say ``orientation='transposed'`` on a directed
    graph, where it holds the in-neighbours.

    A graph never changes after it is built (algorithms allocate their own
    transient arrays), so one graph may be read by many threads at once.
    ``weight_column`` names the column the weights came from (None when
    unweighted, or when the graph was not built from a named column), so
    errors about weights can name it.

    Build one with :func:`build_graph`; the constructor takes finished CSR
    arrays.

    Parameters
    ----------
    indptr, indices : array
        The CSR row offsets (``n_vertices + 1``) and column indices, of
        ``options.vertex_dtype``.
    weights : array or None
        One weight per stored arc, or None for an unweighted graph.
    vertex_ids : array
        The original int64 id of each dense index, sorted ascending.
    options : GraphOptions
        The construction contract the arrays follow.
    xp : module
        ``numpy`` or ``cupy``: the module the arrays live on.
    input_edges : int
        How many edges the input had before preparation.
    weight_column : str or None, optional
        The column the weights came from, named in errors about weights.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import build_graph
    >>> g = build_graph({"src": np.array([1, 2, 3]), "dst": np.array([2, 3, 1])})
    >>> g
    Graph(directed, n_vertices=3, n_arcs=3, weighted=False, orientation='as_stored', xp=numpy)
    >>> g.vertex_ids.tolist(), g.indptr.tolist(), g.indices.tolist()
    ([1, 2, 3], [0, 1, 2, 3], [1, 2, 0])
    """

    __slots__ = (
        "indices",
        "indptr",
        "input_edges",
        "options",
        "vertex_ids",
        "weight_column",
        "weights",
        "xp",
    )

    def __init__(
        self,
        *,
        indptr: Any,
        indices: Any,
        weights: Any | None,
        vertex_ids: Any,
        options: GraphOptions,
        xp: Any,
        input_edges: int,
        weight_column: str | None = None,
    ) -> None:
        self.indptr = indptr
        self.indices = indices
        self.weights = weights
        self.vertex_ids = vertex_ids
        self.options = options
        self.xp = xp
        self.input_edges = input_edges
        self.weight_column = weight_column

    @property
    def n_vertices(self) -> int:
        return int(self.vertex_ids.size)

    @property
    def n_arcs(self) -> int:
        """Stored arcs (an undirected edge between two vertices is two arcs)."""
        return int(self.indices.size)

    @property
    def directed(self) -> bool:
        return self.options.directed

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    def arrays(self) -> tuple[Any, ...]:
        """Every array the graph keeps (what a cache must charge for)."""
        kept = (self.indptr, self.indices, self.vertex_ids)
        return (*kept, self.weights) if self.weights is not None else kept

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays())

    def device_arrays(self) -> tuple[Any, ...]:
        """The arrays a device cache measures and proves unreachable: ``arrays()``
        less the empty ones, which own no memory (an allocation domain hands a
        zero-length array no allocation, so it has none to measure)."""
        return tuple(a for a in self.arrays() if a.size)

    def copy_into(self, domain: Any) -> Graph:
        """An independent copy whose arrays are allocated in ``domain`` (a cache
        allocation domain); the graph then lives on ``domain.xp``."""
        weights = None if self.weights is None else domain.copy_in(self.weights)
        return Graph(
            indptr=domain.copy_in(self.indptr),
            indices=domain.copy_in(self.indices),
            weights=weights,
            vertex_ids=domain.copy_in(self.vertex_ids),
            options=self.options,
            xp=domain.xp,
            input_edges=self.input_edges,
            weight_column=self.weight_column,
        )

    @property
    def sparse(self) -> Any:
        """``scipy.sparse`` or ``cupyx.scipy.sparse``, matching ``xp``."""
        return sparse_module(self.xp)

    def dense(self, ids: Any, name: str = "vertex ids") -> Any:
        """Dense indices of original ``ids``; GraphInputError names any unknown id."""
        xp = self.xp
        ids = vertex_array(ids, xp, name)
        if self.n_vertices == 0:
            if ids.size:
                raise GraphInputError(f"{name} {to_numpy(ids[:5]).tolist()} are not in the graph")
            return ids.astype(self.indices.dtype)
        pos = xp.searchsorted(self.vertex_ids, ids)
        pos = xp.minimum(pos, self.n_vertices - 1)
        missing = self.vertex_ids[pos] != ids
        if bool(reduce("any", missing)):
            bad = to_numpy(ids[missing][:5]).tolist()
            raise GraphInputError(f"{name} {bad} are not vertices of the graph")
        return pos.astype(self.indices.dtype)

    def original(self, dense: Any) -> Any:
        """Original ids of dense indices."""
        return self.vertex_ids[dense]

    def rows(self) -> Any:
        """The row of every stored arc (a transient array of ``n_arcs``)."""
        return rows_of(self.xp, self.indptr, self.n_arcs)

    def matrix(self, data: Any | None = None) -> Any:
        """The CSR as a SciPy / cupyx sparse matrix sharing this graph's arrays."""
        if data is None:
            data = (
                self.weights
                if self.weights is not None
                else self.xp.ones(self.n_arcs, dtype=self.options.weight_dtype)
            )
        n = self.n_vertices
        return self.sparse.csr_matrix((data, self.indices, self.indptr), shape=(n, n))

    def transpose(self) -> Graph:
        """The same graph stored in the other orientation (itself when undirected)."""
        if not self.directed:
            return self
        flipped = "as_stored" if self.options.orientation == "transposed" else "transposed"
        options = GraphOptions(**{**_fields(self.options), "orientation": flipped})
        indptr, indices, weights = csr_from_arcs(
            self.xp,
            self.indices,
            self.rows(),
            self.weights,
            self.n_vertices,
            "keep",
            self.indices.dtype,
        )
        return Graph(
            indptr=indptr,
            indices=indices,
            weights=weights,
            vertex_ids=self.vertex_ids,
            options=options,
            xp=self.xp,
            input_edges=self.input_edges,
            weight_column=self.weight_column,
        )

    def out_csr(self) -> Graph:
        """A graph whose rows are out-neighbours (itself, or a transient transpose)."""
        return self.transpose() if self.options.stores_in_edges else self

    def in_csr(self) -> Graph:
        """A graph whose rows are in-neighbours (itself, or a transient transpose)."""
        if not self.directed or self.options.stores_in_edges:
            return self
        return self.transpose()

    def __repr__(self) -> str:
        kind = "directed" if self.directed else "undirected"
        return (
            f"Graph({kind}, n_vertices={self.n_vertices}, n_arcs={self.n_arcs}, "
            f"weighted={self.weighted}, orientation={self.options.orientation!r}, "
            f"xp={self.xp.__name__})"
        )


def _fields(options: GraphOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}


def build_graph(
    edges: Any,
    *,
    source: str = "src",
    destination: str = "dst",
    weight: str | None = None,
    options: GraphOptions | None = None,
    xp: Any | None = None,
) -> Graph:
    """Build a :class:`Graph` from the edge frame ``edges``.

    ``edges`` is a ``pyarrow.Table``, a ``DeviceFrame``, or a mapping of
    column name to array (a dict of NumPy / CuPy arrays). ``source`` and
    ``destination`` name integer id columns (any int64 ids, renumbered to a
    dense range); ``weight`` optionally names a numeric column. With ``xp``
    the graph is built on that module (``cupy`` copies host columns to the
    GPU); without, it stays where the columns are.

    Edge preparation, in order: drop self loops (``drop_self_loops``),
    symmetrize (undirected), merge duplicates (``duplicates``). Thread-safe:
    it only reads ``edges``, which must not change during the call.

    Parameters
    ----------
    edges : pyarrow.Table, DeviceFrame or mapping of str to array
        The edge list, one row per edge.
    source, destination : str, optional
        The integer id columns of each edge's ends (``"src"``, ``"dst"``).
    weight : str or None, optional
        A numeric column of edge weights; None builds an unweighted graph.
    options : GraphOptions or None, optional
        The construction contract (default ``GraphOptions()``: directed,
        duplicates summed).
    xp : module or None, optional
        Build on this array module (``numpy`` or ``cupy``) instead of the
        columns' own.

    Returns
    -------
    Graph
        The CSR graph, on ``xp`` or the columns' module.

    Raises
    ------
    GraphInputError
        A column is missing or not integer (numeric for ``weight``), a
        weight is not finite, or the weights overflow ``options.weight_dtype``.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphOptions, build_graph
    >>> edges = {"src": np.array([10, 20, 30, 30]), "dst": np.array([20, 30, 10, 40])}
    >>> build_graph(edges, options=GraphOptions(directed=False))
    Graph(undirected, n_vertices=4, n_arcs=8, weighted=False, orientation='as_stored', xp=numpy)
    """
    options = options or GraphOptions()
    src, dst, weights, xp = edge_columns(edges, source, destination, weight, xp)
    index_dtype = np.dtype(options.vertex_dtype)
    input_edges = int(src.size)
    numbered = renumber(xp, src, dst, index_dtype)
    del src, dst
    rows, cols = numbered.src, numbered.dst
    # Overflow (a float64 weight beyond float32, a sum of repeats) shows as
    # infinite weights, refused below with the column's name; NumPy's warning
    # would only repeat it.
    if weights is not None:
        with np.errstate(over="ignore"):
            weights = weights.astype(options.weight_dtype, copy=False)
    if options.drop_self_loops:
        keep = rows != cols
        rows, cols = rows[keep], cols[keep]
        weights = weights[keep] if weights is not None else None
    if not options.directed:
        # The reverse copy skips self loops: a loop is one arc, as in NetworkX.
        loop_free = rows != cols
        rows, cols = (
            xp.concatenate([rows, cols[loop_free]]),
            xp.concatenate([cols, rows[loop_free]]),
        )
        if weights is not None:
            weights = xp.concatenate([weights, weights[loop_free]])
    if options.stores_in_edges:
        rows, cols = cols, rows
    n = int(numbered.vertex_ids.size)
    with np.errstate(over="ignore"):
        indptr, indices, weights = csr_from_arcs(
            xp, rows, cols, weights, n, options.duplicates, index_dtype, options.weight_dtype
        )
    finite = weights is None or weight is None or bool(reduce("all", xp.isfinite(weights)))
    if not finite:
        # the input was finite (edge_columns checks): the cast or the sum overflowed
        # float64 is the widest: only scaling the weights down helps there
        wider = (
            "build with GraphOptions(weight_dtype='float64'), or scale the weights down"
            if options.weight_dtype == "float32"
            else "scale the weights down"
        )
        raise GraphInputError(
            f"weight column {weight!r} has weights beyond the range of "
            f"weight_dtype={options.weight_dtype} (after duplicate edges were summed); {wider}"
        )
    return Graph(
        indptr=indptr,
        indices=indices,
        weights=weights,
        vertex_ids=numbered.vertex_ids,
        options=options,
        xp=xp,
        input_edges=input_edges,
        weight_column=weight,
    )
