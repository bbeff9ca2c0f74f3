"""How a graph is built from an edge list: the construction contract.

Every field changes the built graph, so every field is part of a resident
graph's cache key (:class:`GraphOptions` is frozen and hashable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nexus_cache.errors import ConfigError

__all__ = ["DUPLICATE_RULES", "ORIENTATIONS", "GraphOptions"]

#: How repeated (source, destination) edges are combined: their weights are
#: summed, or the smallest or largest weight is kept; ``keep`` keeps every copy
#: (a multigraph: BFS and PageRank accept it, the similarities count copies).
#: Under ``sum`` an edge without a weight column weighs 1, so a repeated edge
#: counts as often as it appears whether or not the graph is weighted (NetworkX
#: ``MultiDiGraph`` semantics); ``min`` and ``max`` of unweighted copies
#: collapse them into one edge.
DUPLICATE_RULES = ("sum", "min", "max", "keep")

#: ``as_stored``: row ``u`` of the CSR lists the out-neighbours of ``u``
#: (push-style work: BFS top-down steps). ``transposed``: row ``v`` lists the
#: in-neighbours of ``v`` (pull-style work: PageRank, BFS bottom-up steps).
#: Undirected graphs are symmetric, so both give the same arrays.
ORIENTATIONS = ("as_stored", "transposed")

_VERTEX_DTYPES = ("int32", "int64")
_WEIGHT_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class GraphOptions:
    """The graph-construction contract. Immutable, hashable, thread-safe.

    ``directed=False`` symmetrizes: every input edge ``(u, v, w)`` is stored as
    both ``u -> v`` and ``v -> u`` with weight ``w``, and duplicates are then
    merged with ``duplicates`` (so ``(u, v, 1)`` and ``(v, u, 2)`` give one
    undirected edge of weight 3 under ``sum``). Under ``sum`` an unweighted
    edge weighs 1: ``k`` copies of an edge become one arc of weight ``k``
    (stored as weights only when some edge repeats).

    ``vertex_dtype`` is the dtype of the dense vertex indices in the CSR (int32
    holds up to 2**31 - 1 vertices and is what the GPU sparse kernels take);
    ``weight_dtype`` is the dtype of stored weights and of PageRank values of
    an unweighted graph.

    Parameters
    ----------
    directed : bool, optional
        Keep edges one-way (True) or symmetrize them (False).
    drop_self_loops : bool, optional
        Drop edges ``u -> u`` before anything else.
    duplicates : {"sum", "min", "max", "keep"}, optional
        How repeated edges merge (:data:`DUPLICATE_RULES`).
    vertex_dtype : {"int32", "int64"}, optional
        The dtype of the dense vertex indices.
    weight_dtype : {"float32", "float64"}, optional
        The dtype of stored weights.
    orientation : {"as_stored", "transposed"}, optional
        Rows hold out-neighbours, or in-neighbours on a directed graph
        (:data:`ORIENTATIONS`).

    Raises
    ------
    ConfigError
        A field's value is not accepted; the message names the field.

    Examples
    --------
    >>> from nexus_cache.graph import GraphOptions
    >>> options = GraphOptions(directed=False, duplicates="max")
    >>> options.directed, options.duplicates, options.vertex_dtype
    (False, 'max', 'int32')
    >>> GraphOptions(duplicates="mean")
    Traceback (most recent call last):
    ...
    nexus_cache.errors.ConfigError: GraphOptions.duplicates='mean' is not accepted; use one of ...
    """

    directed: bool = True
    drop_self_loops: bool = False
    duplicates: Literal["sum", "min", "max", "keep"] = "sum"
    vertex_dtype: Literal["int32", "int64"] = "int32"
    weight_dtype: Literal["float32", "float64"] = "float32"
    orientation: Literal["as_stored", "transposed"] = "as_stored"

    def __post_init__(self) -> None:
        for name in ("directed", "drop_self_loops"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"GraphOptions.{name}={getattr(self, name)!r}: use True or False"
                )
        choices = {
            "duplicates": DUPLICATE_RULES,
            "vertex_dtype": _VERTEX_DTYPES,
            "weight_dtype": _WEIGHT_DTYPES,
            "orientation": ORIENTATIONS,
        }
        for name, accepted in choices.items():
            value = getattr(self, name)
            if value not in accepted:
                raise ConfigError(
                    f"GraphOptions.{name}={value!r} is not accepted; use one of "
                    + ", ".join(repr(a) for a in accepted)
                )

    @property
    def stores_in_edges(self) -> bool:
        """True when CSR rows hold in-neighbours (directed and transposed)."""
        return self.directed and self.orientation == "transposed"
