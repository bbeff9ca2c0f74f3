"""The one list of graph algorithms: a frozen :class:`AlgorithmSpec` per algorithm.

Everything that names an algorithm reads it from here: the query service
(its validation, defaults and construction contract), the resident-graph
cache (keyability, the function it runs, the memory it reserves), the
server's JSON and the ``nexus-cache graph`` command line (one flag per
parameter, generated). Adding an algorithm means writing its module in
``nexus_cache.graph`` and one :class:`AlgorithmSpec` in :data:`ALGORITHMS`
below (see ``docs/graph.md``, "Adding an algorithm").

The module is light: it imports only the standard library, ``errors`` and
``graph.options``. An algorithm's function and its memory estimate are named
as ``"module:function"`` strings and imported on first use, so building the
command line or validating a query never loads NumPy or Arrow.

Every record is immutable and the registry never changes after import:
thread- and process-safe.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from nexus_cache.errors import ConfigError
from nexus_cache.graph.options import GraphOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from nexus_cache.graph.csr import Graph
    from nexus_cache.graph.result import GraphResult

__all__ = [
    "ALGORITHMS",
    "CONVERGENCE_RULES",
    "AlgorithmSpec",
    "Column",
    "Param",
    "get_spec",
    "option_flag",
]

#: How PageRank reads ``tol``: ``total`` stops when the L1 change of the whole
#: rank vector is below ``tol``; ``networkx`` when it is below ``n_vertices * tol``.
CONVERGENCE_RULES = ("total", "networkx")

# Bytes a row of each result column type takes (Arrow's fixed widths).
_WIDTHS = {"int32": 4, "int64": 8, "float32": 4, "float64": 8}
# vertex ids are int64 in every graph
_INT64 = (-(2**63), 2**63)


def _load(reference: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names (imported on first use)."""
    module, _, name = reference.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


@dataclass(frozen=True)
class Param:
    """One parameter of an algorithm, as a query and the command line take it.

    ``kind`` is ``number`` (a finite int or float), ``int``, ``vertex`` (an
    int64 vertex id) or ``choice`` (one of ``choices``). Numbers and ints lie
    within ``low``/``high`` (exclusive where ``open_low``/``open_high``);
    ``nullable`` accepts None (JSON null). ``keyword`` is the argument of the
    algorithm's function it feeds (its own name unless said otherwise).
    """

    name: str
    kind: Literal["number", "int", "vertex", "choice"]
    help: str
    default: Any = None
    required: bool = False
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    keyword: str = ""

    @property
    def argument(self) -> str:
        """The keyword argument of the algorithm's function this parameter feeds."""
        return self.keyword or self.name

    @property
    def flag(self) -> str:
        """The command-line flag (``max_iter`` -> ``--max-iter``)."""
        return option_flag(self.name)

    def accepted(self) -> str:
        """What the parameter accepts, as the end of an error message."""
        if self.kind == "choice":
            return "use one of: " + ", ".join(self.choices)
        if self.kind == "vertex":
            return "use an integer vertex id"
        noun = "a number" if self.kind == "number" else "an int"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            text = f"{noun} in {left}{_plain(self.low)}, {_plain(self.high)}{right}"
        elif self.low is not None:
            text = f"{noun} {'>' if self.open_low else '>='} {_plain(self.low)}"
        else:
            text = noun
        return f"use {text}" + (" or null" if self.nullable else "")

    def check(self, algorithm: str, value: Any, label: str) -> Any:
        """``value`` validated (ints and floats as the kind says); :class:`ConfigError`
        naming ``label`` and what is accepted otherwise."""
        if value is None and self.nullable:
            return None
        bad = ConfigError(f"{label}={value!r} is not accepted for {algorithm}; {self.accepted()}")
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise bad
            return value
        if isinstance(value, bool):
            raise bad
        if self.kind == "number":
            if not isinstance(value, (int, float)) or not _finite(value):
                raise bad
        elif not isinstance(value, int):
            raise bad
        low, high, open_low, open_high = (
            (*_INT64, False, True)
            if self.kind == "vertex"
            else (self.low, self.high, self.open_low, self.open_high)
        )
        if low is not None and (value <= low if open_low else value < low):
            raise bad
        if high is not None and (value >= high if open_high else value > high):
            raise bad
        return float(value) if self.kind == "number" else value


def option_flag(name: str) -> str:
    """The command-line flag of parameter ``name`` (``max_iter`` -> ``--max-iter``)."""
    return "--" + name.replace("_", "-")


def _finite(number: float) -> bool:
    """Whether ``number`` is a finite float; an int beyond float's range (JSON
    carries any) is not."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _plain(number: float) -> str:
    """``1.0`` -> ``1``: bounds read as written."""
    return str(int(number)) if float(number).is_integer() else str(number)


@dataclass(frozen=True)
class Column:
    """One column of an algorithm's result: its name, Arrow type name, nullability.

    The type is that of the service's results (its graphs store float64
    weights; a float32 graph's PageRank is float32)."""

    name: str
    type: Literal["int32", "int64", "float32", "float64"]
    nullable: bool = False

    @property
    def row_bytes(self) -> int:
        """Bytes a row takes: the value, and for a nullable column two more (the
        graph layer's one-byte mask and the Arrow bitmap, rounded up)."""
        return _WIDTHS[self.type] + (2 if self.nullable else 0)

    def arrow_type(self) -> pa.DataType:
        """The ``pyarrow`` type (imports pyarrow)."""
        import pyarrow as pa

        return pa.type_for_alias(self.type)


@dataclass(frozen=True)
class AlgorithmSpec:
    """Everything the package knows about one graph algorithm. Immutable.

    Every spec lives in :data:`ALGORITHMS`; look one up with :func:`get_spec`.

    Parameters
    ----------
    name, help : str
        The algorithm's name (a query's ``algorithm``) and a one-line help.
    runner : str
        ``"module:function"`` of the function, called as
        ``function(graph, **arguments)``.
    transient : str
        ``"module:function"`` of its memory estimate,
        ``estimate(graph, arguments) -> bytes`` it allocates besides the graph
        while it runs (the resident-graph cache reserves it before a run on a
        parked graph).
    params : tuple of Param
        Its parameters, as a query and the command line take them.
    columns : tuple of Column
        Its result columns.
    rows : {"vertex", "pair"}
        One result row per ``vertex`` or per scored ``pair`` (each input edge
        at most once): with ``columns`` this bounds the result's bytes.
    orientation : {"as_stored", "transposed"}, optional
        How the service builds its graph (:class:`~nexus_cache.graph.GraphOptions`):
        ``transposed`` rows hold in-neighbours (pull-style work).
    duplicates : {"sum", "max"}, optional
        ``sum`` counts every copy of an edge (a multigraph), ``max`` sees
        neighbour sets.
    weighted : bool, optional
        Reads edge weights (a weight column is refused otherwise).
    directed : bool, optional
        Whether its graph is directed when a query does not say
        (``GraphQuery(directed=None)``, a JSON query without ``directed``, the
        command line without ``--directed``/``--undirected``).
    undirected_only : bool, optional
        A directed graph is refused.
    keyable : bool, optional
        A run may use a parked graph of the resident-graph cache.
    include_edges : bool, optional
        The function can also return the edges of its tree, keyed by the
        attempt's edges (such a run is never cached).
    facts : tuple of str, optional
        The run facts (``GraphResult.info``) the service reports.
    demo : bool, optional
        Part of the query mix of ``nexus-cache demo``.

    Examples
    --------
    >>> from nexus_cache.graph import get_spec
    >>> spec = get_spec("pagerank")
    >>> spec.rows, spec.orientation, [c.name for c in spec.columns]
    ('vertex', 'transposed', ['vertex', 'pagerank'])
    >>> spec.defaults()
    {'alpha': 0.85, 'tol': 1e-06, 'max_iter': 100, 'convergence': 'total'}
    """

    name: str
    help: str
    runner: str
    transient: str
    params: tuple[Param, ...]
    columns: tuple[Column, ...]
    rows: Literal["vertex", "pair"]
    orientation: Literal["as_stored", "transposed"] = "as_stored"
    duplicates: Literal["sum", "max"] = "max"
    weighted: bool = False
    directed: bool = True
    undirected_only: bool = False
    keyable: bool = True
    include_edges: bool = False
    facts: tuple[str, ...] = ()
    demo: bool = False
    _by_name: Mapping[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({p.name: p for p in self.params}))

    def param(self, name: str) -> Param:
        return self._by_name[name]

    def defaults(self) -> dict[str, Any]:
        """Every parameter and its default (None: required, or optional)."""
        return {p.name: p.default for p in self.params}

    def validate(
        self, given: Mapping[str, Any], label: Callable[[str], str] = lambda n: n
    ) -> dict[str, Any]:
        """Every parameter: the defaults updated with ``given``, each checked.

        :class:`ConfigError` names a parameter as ``label(name)`` says (the
        command line passes its flags) and says what is accepted.
        """
        params = self.defaults()
        for name, value in given.items():
            spec = self._by_name.get(name)
            if spec is None:
                names = ", ".join(label(p.name) for p in self.params) or "none"
                raise ConfigError(
                    f"{label(name)} does not apply to {self.name}; leave it out "
                    f"(accepted: {names})"
                )
            params[name] = spec.check(self.name, value, label(name))
        for spec in self.params:
            if spec.required and params[spec.name] is None:
                raise ConfigError(
                    f"{label(spec.name)} is required for {self.name}; {spec.accepted()}"
                )
        return params

    def sample_params(self, vertex: int) -> dict[str, Any]:
        """Parameters that run the algorithm on any graph holding ``vertex``: that
        vertex for each vertex parameter it requires (the rest take defaults)."""
        return {p.name: vertex for p in self.params if p.required and p.kind == "vertex"}

    def arguments(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The function's keyword arguments for validated query ``params``."""
        return {p.argument: params[p.name] for p in self.params}

    def options(self, directed: bool, **fields: Any) -> GraphOptions:
        """The construction contract of this algorithm's graph (``fields``: the rest)."""
        return GraphOptions(
            directed=directed, orientation=self.orientation, duplicates=self.duplicates, **fields
        )

    def run(self, graph: Graph, **arguments: Any) -> GraphResult:
        """Run the algorithm on ``graph`` (imports its module on first use)."""
        result: GraphResult = _load(self.runner)(graph, **arguments)
        return result

    def transient_bytes(self, graph: Graph, arguments: Mapping[str, Any]) -> int:
        """Bytes a run allocates besides ``graph`` (its result included)."""
        return int(_load(self.transient)(graph, arguments))

    def result_bytes(self, n_edges: int, n_vertices: int) -> int:
        """Upper bound of the result table's bytes on ``n_edges`` input edges and at
        most ``n_vertices`` vertices (plus a few KiB of Arrow padding)."""
        rows = n_vertices if self.rows == "vertex" else n_edges
        return rows * sum(c.row_bytes for c in self.columns) + (1 << 12)


def _similarity(name: str, title: str) -> AlgorithmSpec:
    return AlgorithmSpec(
        name=name,
        help=f"{title} similarity of the two ends of every edge",
        runner=f"nexus_cache.graph.similarities:{name}",
        transient="nexus_cache.graph.memory:similarity_transient_bytes",
        params=(),
        columns=(Column("first", "int64"), Column("second", "int64"), Column(name, "float64")),
        rows="pair",
        directed=False,
        demo=name == "jaccard",
    )


#: name -> spec, in the order help texts list them.
ALGORITHMS: Mapping[str, AlgorithmSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            AlgorithmSpec(
                name="pagerank",
                help="PageRank of every vertex",
                runner="nexus_cache.graph.ranking:pagerank",
                transient="nexus_cache.graph.memory:pagerank_transient_bytes",
                params=(
                    Param(
                        "alpha",
                        "number",
                        "damping factor",
                        0.85,
                        low=0,
                        high=1,
                        open_low=True,
                        open_high=True,
                    ),
                    Param("tol", "number", "tolerance", 1e-6, low=0, open_low=True),
                    Param("max_iter", "int", "iterations at most", 100, low=1),
                    Param(
                        "convergence",
                        "choice",
                        "how --tol is read: total stops when the L1 change of the whole rank "
                        "vector is below it; networkx when it is below vertices x tol",
                        "total",
                        choices=CONVERGENCE_RULES,
                    ),
                ),
                columns=(Column("vertex", "int64"), Column("pagerank", "float64")),
                rows="vertex",
                orientation="transposed",
                duplicates="sum",
                weighted=True,
                facts=("iterations", "converged", "error", "threshold"),
                demo=True,
            ),
            AlgorithmSpec(
                name="bfs",
                help="hops and a parent on a shortest path from a source vertex",
                runner="nexus_cache.graph.traversal:bfs",
                transient="nexus_cache.graph.memory:bfs_transient_bytes",
                params=(
                    Param("source", "vertex", "start vertex", required=True, keyword="sources"),
                    Param("depth_limit", "int", "depth limit", low=0, nullable=True),
                ),
                columns=(
                    Column("vertex", "int64"),
                    Column("distance", "int32", nullable=True),
                    Column("predecessor", "int64", nullable=True),
                ),
                rows="vertex",
                include_edges=True,
                facts=("levels",),
                demo=True,
            ),
            _similarity("jaccard", "Jaccard"),
            _similarity("sorensen", "Sorensen-Dice"),
            _similarity("overlap", "Overlap"),
            _similarity("cosine", "Cosine"),
            AlgorithmSpec(
                name="triangles",
                help="triangles through every vertex (undirected; self loops ignored)",
                runner="nexus_cache.graph.triangle_counts:triangles",
                transient="nexus_cache.graph.triangle_counts:transient_bytes",
                params=(),
                columns=(Column("vertex", "int64"), Column("triangles", "int64")),
                rows="vertex",
                directed=False,
                undirected_only=True,
            ),
            AlgorithmSpec(
                name="degree",
                help="edges at every vertex (out, in or total; a self loop counts twice in total)",
                runner="nexus_cache.graph.degrees:degree",
                transient="nexus_cache.graph.degrees:transient_bytes",
                params=(
                    Param(
                        "direction",
                        "choice",
                        "which arcs a directed graph's degree counts: out, in or total "
                        "(undirected graphs: every edge)",
                        "total",
                        choices=("total", "out", "in"),
                    ),
                ),
                columns=(Column("vertex", "int64"), Column("degree", "int64")),
                rows="vertex",
            ),
        )
    }
)


def get_spec(name: str, label: str = "algorithm") -> AlgorithmSpec:
    """The spec of ``name``; :class:`ConfigError` naming ``label`` and the choices.

    Parameters
    ----------
    name : str
        An algorithm's name, a key of :data:`ALGORITHMS`.
    label : str, optional
        What the error calls the setting (a query field, a flag).

    Returns
    -------
    AlgorithmSpec
        The algorithm's spec.

    Raises
    ------
    ConfigError
        ``name`` is not an algorithm; the message lists the accepted names.

    Examples
    --------
    >>> from nexus_cache.graph import get_spec
    >>> get_spec("bfs").runner
    'nexus_cache.graph.traversal:bfs'
    >>> get_spec("pagernk")
    Traceback (most recent call last):
    ...
    nexus_cache.errors.ConfigError: algorithm='pagernk' is not accepted; use one of: pagerank, ...
    """
    spec = ALGORITHMS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ConfigError(f"{label}={name!r} is not accepted; use one of: {', '.join(ALGORITHMS)}")
    return spec
