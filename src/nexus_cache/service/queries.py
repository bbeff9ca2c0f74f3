"""The query language: every query, its JSON form, and the one door queries enter by.

* :class:`Scan` reads the projected columns of a Parquet object or directory.
* :class:`Count` counts its rows from the Parquet footers (a synthetic count
  source, which never enters the decoded-source cache), or with a filter the
  rows of the mask over the filter's decoded columns.
* :class:`GraphQuery` runs a graph algorithm on the edges a :class:`Scan` reads
  (its algorithm and parameters: :data:`nexus_cache.graph.registry.ALGORITHMS`).

:func:`as_query` turns a query object, its ``to_dict()`` form (``{"type":
"scan", ...}``) or its JSON text (``str`` or ``bytes``) into a query; every
front end (the service, the server's tickets, the client, the cluster client)
enters by it, so the language and its error texts are written here only.
:func:`as_request` also reads the envelope ``{"query": {...}, "device": N}``
that pins a query to a device. ``query.scan`` is the scan a query reads, and
``query.scan.location`` its source in the one normal form that routing and
``allowed_roots`` use. Every constructor validates its arguments and raises
:class:`ConfigError` naming the field, the value and what is accepted.

A query's dict form holds each of its dataclass fields under its own name, so
a new field of :class:`Scan` is written here (its validation) and nowhere in
the front ends.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from nexus_cache._roots import location_key
from nexus_cache.errors import ConfigError
from nexus_cache.graph.registry import ALGORITHMS as _SPECS
from nexus_cache.graph.registry import get_spec

__all__ = [
    "Count",
    "GraphQuery",
    "Query",
    "Scan",
    "WEIGHTED",
    "as_query",
    "as_request",
    "graph_params",
]

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
    of them (read in name order), or a table: a directory with Hive
    ``key=value`` segments, a Delta table or an Iceberg table
    (:mod:`nexus_cache.tables`).

    ``filter`` keeps the rows that satisfy it, in pyarrow's ``filters``
    convention: a list of ``(column, op, value)`` predicates (AND) or a list of
    such lists (OR of ANDs); it is held as a tuple of AND-clauses of
    ``(column, op, value)`` triples (list values as tuples), so its JSON form
    is lists of lists. It is checked against the table's schema and made
    canonical when the query is planned. ``as_of`` reads a Delta version or
    an Iceberg snapshot id instead of the latest.
    """

    source: str
    columns: tuple[str, ...] | None = None
    batch_rows: int = 65536
    filter: tuple[tuple[tuple[str, str, Any], ...], ...] | None = None
    as_of: int | None = None

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
        if self.filter is not None:
            object.__setattr__(self, "filter", _filter_clauses(self.filter))
        _check_as_of("Scan.as_of", self.as_of)

    kind = "scan"

    @property
    def is_table_read(self) -> bool:
        """Whether the scan filters or reads a version (a table read however its source
        looks)."""
        return self.filter is not None or self.as_of is not None

    def to_dict(self) -> dict[str, Any]:
        """The query as plain JSON values: ``{"type": "scan", <each field>: ...}``.

        Returns
        -------
        dict
            ``type`` and every field by its name (``columns`` as a list);
            :func:`as_query` reads it back.

        Examples
        --------
        >>> Scan("/data/t.parquet", columns=("a",)).to_dict()  # doctest: +NORMALIZE_WHITESPACE
        {'type': 'scan', 'source': '/data/t.parquet', 'columns': ['a'], 'batch_rows': 65536,
         'filter': None, 'as_of': None}
        >>> Scan("/data/t", filter=[("year", "=", 2025)]).to_dict()["filter"]
        [[['year', '=', 2025]]]
        """
        return _dict_of(self)

    @property
    def scan(self) -> Scan:
        """The scan this query reads: itself."""
        return self

    @property
    def location(self) -> str:
        """``source`` in the one normal form of a location, read without touching the
        filesystem: blanks around it, a ``file://`` or ``local://`` prefix and trailing
        slashes dropped, a URL's scheme in lower case. Two spellings of one source
        share it (cluster routing keys on it; ``allowed_roots`` compares the same form,
        local paths then resolved).

        Examples
        --------
        >>> Scan(" file:///data/t/ ").location == Scan("/data/t").location == "/data/t"
        True
        """
        return location_key(self.source)


def _check_as_of(name: str, as_of: Any) -> None:
    if as_of is not None and (isinstance(as_of, bool) or not isinstance(as_of, int)):
        raise ConfigError(
            f"{name}={as_of!r} is not accepted; use an int (a Delta version or an "
            "Iceberg snapshot id), or None for the latest"
        )


_FILTER_FORM = (
    "use pyarrow's filters form: a list of [column, op, value] predicates (AND), or a "
    "list of such lists (OR of ANDs)"
)


def _filter_value(value: Any, shown: Any, name: str) -> Any:
    """A JSON scalar, or a list of them as a tuple (hashable)."""
    if isinstance(value, (list, tuple)):
        return tuple(_filter_value(v, shown, name) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{name} predicate {shown!r}: value {value!r} is not accepted; NaN and "
            "infinities are not JSON numbers (a query travels as JSON): use a finite "
            "number, or leave the bound out"
        )
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(
        f"{name} predicate {shown!r}: value {value!r} is not accepted; use a JSON "
        "scalar (number, string, true/false, null) or a list of them"
    )


def _filter_clauses(
    raw: Any, name: str = "Scan.filter"
) -> tuple[tuple[tuple[str, str, Any], ...], ...]:
    """``raw`` in pyarrow's filters form as a tuple of AND-clauses (the shape only: the
    columns and values are checked against the table when the query is planned);
    messages name the field ``name``."""
    from nexus_cache.tables.filters import OPS

    def predicate(item: Any) -> bool:
        return isinstance(item, (list, tuple)) and bool(item) and isinstance(item[0], str)

    if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{name}={raw!r} is not accepted; {_FILTER_FORM}")
    if all(predicate(item) for item in raw):
        clauses = [raw]
    elif all(isinstance(c, (list, tuple)) and c and not predicate(c) for c in raw):
        clauses = list(raw)
    else:
        raise ConfigError(f"{name}={raw!r} is not accepted; {_FILTER_FORM}")
    out = []
    for clause in clauses:
        triples = []
        for item in clause:
            if not predicate(item) or len(item) != 3:
                raise ConfigError(f"{name} predicate {item!r} is not accepted; {_FILTER_FORM}")
            column, op, value = item
            if not isinstance(op, str) or op not in OPS:
                raise ConfigError(
                    f"{name} predicate {list(item)!r}: op {op!r} is not accepted; use "
                    "one of: " + ", ".join(OPS)
                )
            if isinstance(value, (list, tuple)) and any(
                isinstance(v, (list, tuple)) for v in value
            ):
                raise ConfigError(
                    f"{name} predicate {list(item)!r}: a nested list is not accepted; "
                    "use a list of scalars for in / not in"
                )
            triples.append((column, op, _filter_value(value, list(item), name)))
        out.append(tuple(triples))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Count:
    """The number of rows of ``source``, or of its rows that satisfy ``filter``.

    Without a filter the count comes from the Parquet footers (or a table
    snapshot's data files), with no decode. With a ``filter`` (the form of
    :attr:`Scan.filter`) the filter's columns are decoded through the
    decoded-source cache and the rows of the mask counted. ``as_of`` reads a
    Delta version or an Iceberg snapshot id instead of the latest.
    """

    source: str
    filter: tuple[tuple[tuple[str, str, Any], ...], ...] | None = None
    as_of: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _text("Count.source", self.source))
        if self.filter is not None:
            object.__setattr__(self, "filter", _filter_clauses(self.filter, "Count.filter"))
        _check_as_of("Count.as_of", self.as_of)

    kind = "count"

    def to_dict(self) -> dict[str, Any]:
        """The query as plain JSON values: ``{"type": "count", "source": ...}``.

        Examples
        --------
        >>> Count("/data/t.parquet").to_dict()
        {'type': 'count', 'source': '/data/t.parquet', 'filter': None, 'as_of': None}
        >>> Count("/data/t", filter=[("year", "=", 2025)]).to_dict()["filter"]
        [[['year', '=', 2025]]]
        """
        return _dict_of(self)

    @property
    def scan(self) -> Scan:
        """The scan this query reads: without a filter every column of ``source`` (a
        count then reads only the footers, but plans, routes and is refused by
        ``allowed_roots`` as a scan of its source is); with one, the filter's columns
        only, filtered."""
        if self.filter is None:
            return Scan(self.source, as_of=self.as_of)
        columns = tuple(dict.fromkeys(c for clause in self.filter for c, _op, _v in clause))
        return Scan(self.source, columns=columns, filter=self.filter, as_of=self.as_of)


def _field(name: str) -> str:
    """How a parameter is named in the messages of the Python and JSON query."""
    return f"GraphQuery.params[{name!r}]"


def graph_params(
    algorithm: str, given: Mapping[str, Any], label: Callable[[str], str] = _field
) -> dict[str, Any]:
    """Every parameter of ``algorithm``: the defaults of its spec in
    :data:`nexus_cache.graph.registry.ALGORITHMS` updated with ``given``, each validated.

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
    ``params`` are the algorithm's (its spec in
    :data:`nexus_cache.graph.registry.ALGORITHMS`); missing ones take
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
        """The query as plain JSON values: ``{"type": "graph", "edges": {...}, ...}``.

        Returns
        -------
        dict
            ``type`` and every field by its name (``edges`` in its own dict form,
            ``params`` with every parameter, defaults included).

        Examples
        --------
        >>> q = GraphQuery(Scan("/data/e.parquet"), "src", "dst", "bfs", params={"source": 0})
        >>> q.to_dict()["params"]
        {'source': 0, 'depth_limit': None}
        """
        return _dict_of(self)

    @property
    def scan(self) -> Scan:
        """The scan this query reads: ``edges``."""
        return self.edges


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

# The query kinds by their JSON ``type``: the one table the dict form is read by.
_KINDS: dict[str, Any] = {"scan": Scan, "count": Count, "graph": GraphQuery}
_ACCEPTED = "use a Scan, Count or GraphQuery, its to_dict() form or its JSON text"


#: values that are their own JSON form (exact types: a subclass goes the long way)
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (Scan, Count, GraphQuery)):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dict_of(query: Any) -> dict[str, Any]:
    """``{"type": kind, <field>: <plain value>, ...}`` of a query dataclass."""
    out: dict[str, Any] = {"type": query.kind}
    kind: type = type(query)
    for name in _field_names(kind):
        out[name] = _plain(getattr(query, name))
    return out


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    """The field names of query dataclass ``kind``, in order (found once per class)."""
    return tuple(field.name for field in dataclasses.fields(kind))


def _load(text: str | bytes) -> Any:
    """The JSON value of a query's text; :class:`ConfigError` when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:  # not UTF-8, not JSON, an integer of too many digits
        if "integer string conversion" in str(exc):
            # Python's own text tells the reader to raise a limit in the parsing
            # process, which a server's client cannot do and no query needs
            raise ConfigError(
                "query JSON is malformed: it holds an integer of more digits than any "
                f"query field takes (over {sys.get_int_max_str_digits()})"
            ) from None
        raise ConfigError(f"query JSON is malformed: {exc}") from None
    except RecursionError:  # json's answer to deep nesting; no query is that deep
        raise ConfigError(
            "query JSON is nested too deeply to parse; a query is a flat object whose "
            "'edges' holds one scan"
        ) from None


def _from_dict(data: Any) -> Query:
    """Build a query from its :meth:`to_dict` form; :class:`ConfigError` when malformed."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"query={data!r} is not accepted; use a JSON object with a 'type'")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _KINDS:  # a list or object is unhashable
        raise ConfigError(f"query type={kind!r} is not accepted; use one of: {', '.join(_KINDS)}")
    fields = {k: v for k, v in data.items() if k != "type"}
    allowed = {f.name for f in dataclasses.fields(_KINDS[kind])}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigError(
            f"{kind} query has unknown field(s) {unknown}; accepted: {', '.join(sorted(allowed))}"
        )
    if kind == "graph":
        edges = fields.get("edges")
        if isinstance(edges, Mapping):
            fields["edges"] = _from_dict({"type": "scan", **edges})
        if not isinstance(fields.get("params", {}), Mapping):
            raise ConfigError(f"graph query params={fields['params']!r}; use a JSON object")
    try:
        query: Query = _KINDS[kind](**fields)
    except TypeError as exc:
        raise ConfigError(f"{kind} query: {exc}") from None
    return query


def as_query(query: Query | Mapping[str, Any] | str | bytes) -> Query:
    """The query ``query`` is: a query object as it is, else built from its dict form
    or JSON text, validated.

    Every front end (:meth:`QueryService.execute`, the server's tickets, the
    client, the cluster client) reads queries through this function.

    Parameters
    ----------
    query : Scan, Count, GraphQuery, mapping, str or bytes
        A query; its ``to_dict()`` form (``{"type": "scan", ...}``); or that
        form as JSON text (``str``, or UTF-8 ``bytes`` as a ticket holds it).

    Returns
    -------
    Scan, Count or GraphQuery
        The query, immutable and hashable; ``as_query(q.to_dict()) == q``.

    Raises
    ------
    ConfigError
        When the JSON is malformed or nested too deeply, the ``type`` is not
        ``scan``, ``count`` or ``graph``, a field is unknown, or a value is
        refused (the message names the field and what is accepted).

    Examples
    --------
    >>> as_query('{"type": "count", "source": "/data/t.parquet"}')
    Count(source='/data/t.parquet', filter=None, as_of=None)
    >>> q = as_query({"type": "scan", "source": "s3://b/t", "columns": ["a", "b"]})
    >>> q.columns, q.scan is q
    (('a', 'b'), True)
    """
    if isinstance(query, (Scan, Count, GraphQuery)):
        return query
    if isinstance(query, (str, bytes, bytearray)):
        return _from_dict(_load(query))
    if isinstance(query, Mapping):
        return _from_dict(query)
    raise ConfigError(f"query={query!r} is not accepted; {_ACCEPTED}")


def as_request(request: Query | Mapping[str, Any] | str | bytes) -> tuple[Query, int | None]:
    """``(query, device)`` of a query as a front end receives it: a query (any form
    :func:`as_query` takes), or the envelope ``{"query": {...}, "device": N}`` that pins
    it to device ``N``.

    Parameters
    ----------
    request : query, mapping, str or bytes
        A query, or the envelope, as an object, dict or JSON text (a server's
        ticket or command descriptor holds its bytes).

    Returns
    -------
    tuple of (query, int or None)
        The query, and the device id the envelope names (None: not pinned).

    Raises
    ------
    ConfigError
        What :func:`as_query` raises, and for an envelope with another field or
        a device that is not an id >= 0.

    Examples
    --------
    >>> as_request(b'{"query": {"type": "count", "source": "/t"}, "device": 1}')
    (Count(source='/t', filter=None, as_of=None), 1)
    >>> as_request('{"type": "count", "source": "/t"}')
    (Count(source='/t', filter=None, as_of=None), None)
    """
    data: Any = request
    if isinstance(request, (str, bytes, bytearray)):
        data = _load(request)
    if not (isinstance(data, Mapping) and "type" not in data and "query" in data):
        return as_query(data), None
    extra = sorted(set(data) - {"query", "device"})
    if extra:
        raise ConfigError(
            f"ticket has unknown field(s) {extra}; accepted: a query object, or "
            '{"query": {...}, "device": N}'
        )
    device = data.get("device")
    if device is not None and (
        isinstance(device, bool) or not isinstance(device, int) or device < 0
    ):
        raise ConfigError(f"ticket device={device!r} is not accepted; use a device id >= 0")
    return as_query(data["query"]), device
