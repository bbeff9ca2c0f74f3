"""``nexus-cache graph ALGORITHM URL --src COL --dst COL``: a graph algorithm on Parquet edges.

Runs a registered graph algorithm (:data:`nexus_cache.graph.registry.ALGORITHMS`)
on the edge list URL holds, through the query service: the lakehouse cache,
the decoded-source cache and the resident-graph cache. Without ``--out`` the
first rows are printed as a table.

The algorithm's choices, each parameter's flag (``max_iter`` ->
``--max-iter``), its type, choices and help all come from the registry, which
imports neither NumPy nor Arrow: building the command line stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from nexus_cache.cli._output import integer_option, number_option
from nexus_cache.cli.scan import add_output_options, add_table_options, run_query, table_options
from nexus_cache.graph.registry import ALGORITHMS, Param, option_flag

__all__ = ["register"]


def _listed(names: list[str], last: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _parameters() -> dict[str, list[tuple[str, Param]]]:
    """Each parameter name -> the algorithms that take it, with their spec."""
    out: dict[str, list[tuple[str, Param]]] = {}
    for spec in ALGORITHMS.values():
        for param in spec.params:
            out.setdefault(param.name, []).append((spec.name, param))
    return out


def _option_help(uses: list[tuple[str, Param]]) -> str:
    """``pagerank: damping factor (default 0.85)``, one clause per algorithm."""
    parts = []
    for algorithm, param in uses:
        if param.required:
            note = "required"
        elif param.default is None:
            note = "default: none"
        else:
            note = f"default: {param.default}"
        parts.append(f"{algorithm}: {param.help} ({note})")
    return "; ".join(parts)


def _option_type(param: Param) -> dict[str, Any]:
    if param.kind == "choice":
        return {"choices": list(param.choices)}
    parse: Callable[[str], Any]
    if param.kind == "number":
        parse, metavar = number_option(param.flag), "X"
    else:
        parse, metavar = integer_option(param.flag), "V" if param.kind == "vertex" else "N"
    return {"type": parse, "metavar": metavar}


def register(subparsers: Any) -> None:
    names = list(ALGORITHMS)
    directed = [n for n, spec in ALGORITHMS.items() if spec.directed]
    undirected = [n for n, spec in ALGORITHMS.items() if not spec.directed]
    weighted = [n for n, spec in ALGORITHMS.items() if spec.weighted]
    only = [n for n, spec in ALGORITHMS.items() if spec.undirected_only]
    defaults = (
        (f" {_listed(directed, 'and')} default to --directed" if directed else "")
        + ("; " if directed and undirected else "")
        + (f"{_listed(undirected, 'and')} to --undirected" if undirected else "")
        + (
            f" ({_listed(only, 'and')} {'refuses' if len(only) == 1 else 'refuse'} --directed)"
            if only
            else ""
        )
    )
    parser = subparsers.add_parser(
        "graph",
        help=f"run {_listed(names)} on Parquet edges",
        description=(
            "Run a graph algorithm on the edge list in URL (a Parquet object or directory; a "
            "local path, file:// or s3://). Vertex ids are the integer values of --src and "
            f"--dst.{defaults}."
        ),
    )
    parser.add_argument(
        "algorithm",
        choices=names,
        metavar="ALGORITHM",
        help="; ".join(f"{n}: {spec.help}" for n, spec in ALGORITHMS.items()),
    )
    parser.add_argument("url", metavar="URL", help="Parquet edges (object or directory)")
    parser.add_argument("--src", required=True, metavar="COL", help="source vertex column")
    parser.add_argument("--dst", required=True, metavar="COL", help="destination vertex column")
    parser.add_argument(
        "--weight",
        default=None,
        metavar="COL",
        help=f"edge weight column ({_listed(weighted)} only: the others ignore weights)",
    )
    orientation = parser.add_mutually_exclusive_group()
    orientation.add_argument(
        "--directed", dest="directed", action="store_true", default=None, help="edges are directed"
    )
    orientation.add_argument(
        "--undirected", dest="directed", action="store_false", help="edges are symmetrized"
    )
    for uses in _parameters().values():
        param = uses[0][1]
        parser.add_argument(
            param.flag,
            dest=param.name,
            default=None,
            help=_option_help(uses),
            **_option_type(param),
        )
    add_table_options(parser)
    add_output_options(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.service import WEIGHTED, GraphQuery, Scan, graph_params

    given = {name: getattr(args, name) for name in _parameters()}
    given = {name: value for name, value in given.items() if value is not None}
    # validated here so that every message names the flag, not the query field
    params = graph_params(args.algorithm, given, option_flag)
    if args.weight is not None and args.algorithm not in WEIGHTED:
        raise ConfigError(
            f"--weight does not apply to {args.algorithm}, which ignores edge weights; "
            "leave it out (weights apply to: " + ", ".join(WEIGHTED) + ")"
        )
    for flag, column in (("--src", args.src), ("--dst", args.dst), ("--weight", args.weight)):
        if column is not None and not column.strip():
            raise ConfigError(f"{flag}={column!r} names no column; give a column name")
    if args.src == args.dst:
        raise ConfigError(f"--src and --dst are both {args.src!r}; name two columns")
    if not args.url.strip():
        raise ConfigError("URL is empty; name a Parquet object or directory")
    # None (neither flag): GraphQuery takes the algorithm's default from the registry
    if args.directed and ALGORITHMS[args.algorithm].undirected_only:
        raise ConfigError(
            f"--directed does not apply to {args.algorithm}, which needs an undirected graph; "
            "leave it out"
        )
    # dict.fromkeys: a weight that is also an id column is read once
    columns = tuple(dict.fromkeys(c for c in (args.src, args.dst, args.weight) if c is not None))
    query = GraphQuery(
        Scan(args.url, columns=columns, **table_options(args)),
        args.src,
        args.dst,
        args.algorithm,
        weight=args.weight,
        directed=args.directed,
        params=params,
    )
    return run_query(query, args)
