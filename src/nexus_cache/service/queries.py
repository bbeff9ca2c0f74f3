"""The queries the service runs, as immutable Python objects and as JSON.

* :class:`Scan` reads the projected columns of a Parquet object or directory.
* :class:`Count` counts its rows from the Parquet footers: a synthetic count
  source, which never enters the decoded-source cache.
* :class:`GraphQuery` runs a graph algorithm on the edges a :class:`Scan` reads
  (its algorithm and parameters: :data:`nexus_cache.graph.registry.ALGORITHMS`).

``query.to_dict()`` and :func:`query_from_dict` convert to and from plain JSON
values (``{"type": "scan", ...}``); :func:`query_from_json` parses text. Every
constructor validates its arguments and raises :class:`ConfigError` naming the
field, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

from nexus_cache.errors import ConfigError
from nexus_cache.graph.registry import ALGORITHMS as _SPECS
from nexus_cache.graph.registry import get_spec

__all__ = [
    "ALGORITHMS",
    "Count",
    "GraphQuery",
    "Query",
    "Scan",
    "WEIGHTED",
    "graph_params",
    "query_from_dict",
    "query_from_json",
]

#: algorithm -> accepted parameters and their defaults (None: required or optional)
ALGORITHMS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {name: MappingProxyType(spec.defaults()) for name, spec in _SPECS.items()}
)
#: The algorithms that read edge weights; the others count hops or neighbours,
#: so a weight column is refused for them.
WEIGHTED = tuple(name for name, spec in _SPECS.items() if spec.weighted)


def _text(name: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name}={value!r} is not accepted; use a non-empty string")
    if "\x00" in value:
        # no path, URL or column name holds one; the OS refuses it deep inside
        raise ConfigError(f"{name}={value!r} holds a NUL byte (\\x00); remove it")
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
    return f"GraphQuery.params[{name!r}]"


def graph_params(
    algorithm: str, given: Mapping[str, Any], label: Callable[[str], str] = _field
) -> dict[str, Any]:
    """Every parameter of ``algorithm``: the defaults of :data:`ALGORITHMS`
    updated with ``given``, each validated.

    :class:`ConfigError` names a parameter as ``label(name)`` says (the
    command line passes its flags) and says what is accepted.
    """
    return get_spec(algorithm).validate(given, label)


@dataclasses.dataclass(frozen=True)
class GraphQuery:
    """Run ``algorithm`` on the edge list ``edges`` reads.

    ``src``/``dst`` name the endpoint columns (integer vertex ids), ``weight``
    an optional weight column. ``directed=False`` symmetrizes the edges;
    ``directed=None`` (the default) takes the algorithm's default from its
    spec (:attr:`~nexus_cache.graph.registry.AlgorithmSpec.directed`:
    directed for PageRank, BFS and degree, undirected for the similarities
    and triangles), resolved here, so ``directed`` always reads as a bool and
    the query's JSON and cache key are the same however it was given.
    ``params`` are the algorithm's (:data:`ALGORITHMS`); missing ones take
    their defaults, BFS needs ``source``. Immutable and hashable.
    """

    edges: Scan
    src: str
    dst: str
    algorithm: str
    weight: str | None = None
    directed: bool | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.edges, Scan):
            raise ConfigError(f"GraphQuery.edges={self.edges!r} is not accepted; use a Scan")
        for name in ("src", "dst"):
            _text(f"GraphQuery.{name}", getattr(self, name))
        if self.weight is not None:
            _text("GraphQuery.weight", self.weight)
        algorithm = str(self.algorithm).strip().lower()
        if algorithm not in _SPECS:
            get_spec(self.algorithm, "GraphQuery.algorithm")  # raises, naming the choices
        object.__setattr__(self, "algorithm", algorithm)
        if self.weight is not None and algorithm not in WEIGHTED:
            raise ConfigError(
                f"GraphQuery.weight={self.weight!r} is not accepted for {algorithm}, which "
                "ignores edge weights; leave it out (weights apply to: "
                + ", ".join(WEIGHTED)
                + ")"
            )
        if self.src == self.dst:
            raise ConfigError(
                f"GraphQuery.src and GraphQuery.dst are both {self.src!r}; use two columns"
            )
        if self.edges.columns is not None:
            needed = [c for c in (self.src, self.dst, self.weight) if c is not None]
            missing = [c for c in needed if c not in self.edges.columns]
            if missing:
                raise ConfigError(
                    f"GraphQuery.edges.columns={list(self.edges.columns)} leaves out {missing}; "
                    "add them, or leave columns out to read every column"
                )
        if self.directed is None:
            object.__setattr__(self, "directed", _SPECS[algorithm].directed)
        if not isinstance(self.directed, bool):
            raise ConfigError(
                f"GraphQuery.directed={self.directed!r} is not accepted; use a bool, or None "
                "(leave it out) for the algorithm's default"
            )
        if self.directed and _SPECS[algorithm].undirected_only:
            raise ConfigError(
                f"GraphQuery.directed=True is not accepted for {algorithm}, which needs an "
                "undirected graph; pass directed=False"
            )
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"GraphQuery.params={self.params!r} is not accepted; use a mapping")
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


class _FrozenParams(dict[str, Any]):
    """A read-only, hashable parameter mapping (keeps GraphQuery hashable)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("GraphQuery.params is read-only")

    def __setitem__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def __delitem__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def clear(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def pop(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def popitem(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def setdefault(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    # dict declares itself unhashable; these parameters never change
    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: kv[0])))


Query = Scan | Count | GraphQuery


def query_from_dict(data: Mapping[str, Any]) -> Query:
    """Build a query from its :meth:`to_dict` form; :class:`ConfigError` when malformed."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"query={data!r} is not accepted; use a JSON object with a 'type'")
    kind = data.get("type")
    fields = {k: v for k, v in data.items() if k != "type"}
    builders: dict[str, Any] = {"scan": Scan, "count": Count, "graph": GraphQuery}
    if not isinstance(kind, str) or kind not in builders:  # a list or object is unhashable
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


def __getattr__(name: str) -> Any:
    # the query class's old name, deprecated with the package's (one warning per process)
    if name == "Graph":
        import nexus_cache.service as service

        return service.Graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
