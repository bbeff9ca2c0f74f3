"""The queries the service runs, as immutable Python objects and as JSON.

* :class:`Scan` reads the projected columns of a Parquet object or directory.
* :class:`Count` counts its rows from the Parquet footers: a synthetic count
  source, which never enters the decoded-source cache.
* :class:`Graph` runs a graph algorithm on the edges a :class:`Scan` reads.

``query.to_dict()`` and :func:`query_from_dict` convert to and from plain JSON
values (``{"type": "scan", ...}``); :func:`query_from_json` parses text. Every
constructor validates its arguments and raises :class:`ConfigError` naming the
field, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from nexus_cache.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "Count",
    "Graph",
    "Query",
    "Scan",
    "WEIGHTED",
    "graph_params",
    "query_from_dict",
    "query_from_json",
]

#: algorithm -> accepted parameters and their defaults (None: required or optional)
ALGORITHMS: Mapping[str, Mapping[str, Any]] = {
    "pagerank": {"alpha": 0.85, "tol": 1e-6, "max_iter": 100, "convergence": "total"},
    "bfs": {"source": None, "depth_limit": None},
    "jaccard": {},
    "sorensen": {},
    "overlap": {},
    "cosine": {},
}
SIMILARITIES = ("jaccard", "sorensen", "overlap", "cosine")
#: The algorithms that read edge weights; BFS counts hops and the similarities
#: compare neighbour sets, so a weight column is refused for them.
WEIGHTED = ("pagerank",)
# PageRank's convergence rules (nexus_cache.graph.ranking.CONVERGENCE_RULES,
# spelled out: queries must not import the graph layer).
_CONVERGENCE = ("total", "networkx")


def _text(name: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name}={value!r} is not accepted; use a non-empty string")
    return value


@dataclasses.dataclass(frozen=True)
class Scan:
    """Read ``columns`` (all when None) of ``source`` in batches of ``batch_rows`` rows.

    ``source`` is anything the lakehouse cache reads: a local path, ``file://``,
    ``s3://`` or another fsspec URL, naming one Parquet object or a directory
    of them (read in name order).
    """

    source: str
    columns: tuple[str, ...] | None = None
    batch_rows: int = 65536

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _text("Scan.source", self.source))
        if self.columns is not None:
            if not isinstance(self.columns, (list, tuple)):
                raise ConfigError(
                    f"Scan.columns={self.columns!r} is not accepted; use a list of names"
                )
            columns = tuple(_text("Scan.columns[]", c) for c in self.columns)
            if not columns or len(set(columns)) != len(columns):
                raise ConfigError(
                    f"Scan.columns={list(columns)} is not accepted; use distinct names, "
                    "at least one (or None for all)"
                )
            object.__setattr__(self, "columns", columns)
        rows = self.batch_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ConfigError(f"Scan.batch_rows={rows!r} is not accepted; use an int >= 1")

    kind = "scan"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "scan",
            "source": self.source,
            "columns": None if self.columns is None else list(self.columns),
            "batch_rows": self.batch_rows,
        }


@dataclasses.dataclass(frozen=True)
class Count:
    """The number of rows of ``source`` (from the Parquet footers; no decode)."""

    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _text("Count.source", self.source))

    kind = "count"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "count", "source": self.source}


def _field(name: str) -> str:
    """How a parameter is named in the messages of the Python and JSON query."""
    return f"Graph.params[{name!r}]"


def _param(algorithm: str, name: str, value: Any, label: str) -> Any:
    bad = ConfigError(
        f"{label}={value!r} is not accepted for {algorithm}; "
        + {
            "alpha": "use a number in (0, 1)",
            "tol": "use a number > 0",
            "max_iter": "use an int >= 1",
            "convergence": "use one of: " + ", ".join(_CONVERGENCE),
            "source": "use an integer vertex id",
            "depth_limit": "use an int >= 0 or null",
        }[name]
    )
    if name == "convergence":
        if value not in _CONVERGENCE:
            raise bad
        return value
    if isinstance(value, bool):
        raise bad
    if name == "alpha":
        if not isinstance(value, (int, float)) or not 0 < value < 1:
            raise bad
        return float(value)
    if name == "tol":
        if not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise bad
        return float(value)
    if name == "max_iter":
        if not isinstance(value, int) or value < 1:
            raise bad
        return value
    if name == "source":
        # vertex ids are int64 in every graph
        if not isinstance(value, int) or not -(2**63) <= value < 2**63:
            raise bad
        return value
    if value is None:
        return None
    if not isinstance(value, int) or value < 0:  # depth_limit
        raise bad
    return value


def graph_params(
    algorithm: str, given: Mapping[str, Any], label: Callable[[str], str] = _field
) -> dict[str, Any]:
    """Every parameter of ``algorithm``: the defaults of :data:`ALGORITHMS`
    updated with ``given``, each validated.

    :class:`ConfigError` names a parameter as ``label(name)`` says (the
    command line passes its flags) and says what is accepted.
    """
    accepted = ALGORITHMS[algorithm]
    params = dict(accepted)
    for name, value in given.items():
        if name not in accepted:
            names = ", ".join(label(a) for a in accepted) or "none"
            raise ConfigError(
                f"{label(name)} does not apply to {algorithm}; leave it out (accepted: {names})"
            )
        params[name] = _param(algorithm, name, value, label(name))
    if algorithm == "bfs" and params["source"] is None:
        raise ConfigError(f"{label('source')} is required for bfs; give a vertex id")
    return params


@dataclasses.dataclass(frozen=True)
class Graph:
    """Run ``algorithm`` on the edge list ``edges`` reads.

    ``src``/``dst`` name the endpoint columns (integer vertex ids), ``weight``
    an optional weight column. ``directed=False`` symmetrizes the edges.
    ``params`` are the algorithm's (:data:`ALGORITHMS`); missing ones take
    their defaults, BFS needs ``source``.
    """

    edges: Scan
    src: str
    dst: str
    algorithm: str
    weight: str | None = None
    directed: bool = True
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.edges, Scan):
            raise ConfigError(f"Graph.edges={self.edges!r} is not accepted; use a Scan")
        for name in ("src", "dst"):
            _text(f"Graph.{name}", getattr(self, name))
        if self.weight is not None:
            _text("Graph.weight", self.weight)
        algorithm = str(self.algorithm).strip().lower()
        if algorithm not in ALGORITHMS:
            raise ConfigError(
                f"Graph.algorithm={self.algorithm!r} is not accepted; use one of: "
                f"{', '.join(ALGORITHMS)}"
            )
        object.__setattr__(self, "algorithm", algorithm)
        if self.weight is not None and algorithm not in WEIGHTED:
            raise ConfigError(
                f"Graph.weight={self.weight!r} is not accepted for {algorithm}, which ignores "
                "edge weights; leave it out (weights apply to: " + ", ".join(WEIGHTED) + ")"
            )
        if self.src == self.dst:
            raise ConfigError(f"Graph.src and Graph.dst are both {self.src!r}; use two columns")
        if self.edges.columns is not None:
            needed = [c for c in (self.src, self.dst, self.weight) if c is not None]
            missing = [c for c in needed if c not in self.edges.columns]
            if missing:
                raise ConfigError(
                    f"Graph.edges.columns={list(self.edges.columns)} leaves out {missing}; "
                    "add them, or leave columns out to read every column"
                )
        if not isinstance(self.directed, bool):
            raise ConfigError(f"Graph.directed={self.directed!r} is not accepted; use a bool")
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"Graph.params={self.params!r} is not accepted; use a mapping")
        params = graph_params(algorithm, self.params)
        object.__setattr__(self, "params", _FrozenParams(params))

    kind = "graph"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "graph",
            "edges": self.edges.to_dict(),
            "src": self.src,
            "dst": self.dst,
            "weight": self.weight,
            "directed": self.directed,
            "algorithm": self.algorithm,
            "params": dict(self.params),
        }


class _FrozenParams(dict):  # type: ignore[type-arg]
    """A read-only, hashable parameter mapping (keeps Graph hashable)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Graph.params is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))


Query = Scan | Count | Graph


def query_from_dict(data: Mapping[str, Any]) -> Query:
    """Build a query from its :meth:`to_dict` form; :class:`ConfigError` when malformed."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"query={data!r} is not accepted; use a JSON object with a 'type'")
    kind = data.get("type")
    fields = {k: v for k, v in data.items() if k != "type"}
    builders: dict[str, Any] = {"scan": Scan, "count": Count, "graph": Graph}
    if kind not in builders:
        raise ConfigError(f"query type={kind!r} is not accepted; use one of: scan, count, graph")
    allowed = {f.name for f in dataclasses.fields(builders[kind])}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(
            f"{kind} query has unknown field(s) {unknown}; accepted: {', '.join(sorted(allowed))}"
        )
    if kind == "graph":
        edges = fields.get("edges")
        if isinstance(edges, Mapping):
            edges = query_from_dict({"type": "scan", **{k: v for k, v in edges.items()}})
        fields["edges"] = edges
        if not isinstance(fields.get("params", {}), Mapping):
            raise ConfigError(f"graph query params={fields['params']!r}; use a JSON object")
    if kind == "scan" and isinstance(fields.get("columns"), list):
        fields["columns"] = tuple(fields["columns"])  # anything else: Scan refuses it
    try:
        return builders[kind](**fields)
    except TypeError as exc:
        raise ConfigError(f"{kind} query: {exc}") from None


def query_from_json(text: str) -> Query:
    """Parse a query from JSON text (see :func:`query_from_dict`)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"query JSON is malformed: {exc}") from None
    except RecursionError:  # json's answer to deep nesting; no query is that deep
        raise ConfigError(
            "query JSON is nested too deeply to parse; a query is a flat object whose "
            "'edges' holds one scan"
        ) from None
    return query_from_dict(data)
