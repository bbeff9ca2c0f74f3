"""``nexus-cache graph ALGORITHM URL --src COL --dst COL``: a graph algorithm on Parquet edges.

Runs PageRank, BFS or a similarity (Jaccard, Sorensen, Overlap, Cosine) on
the edge list URL holds, through the query service: the lakehouse cache, the
decoded-source cache and the resident-graph cache. Without ``--out`` the
first rows are printed as a table.
"""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.cli._output import integer_option, number_option
from nexus_cache.cli.scan import add_output_options, run_query

__all__ = ["register"]

# The keys of service.ALGORITHMS, spelled out: building the command line must
# not import the service (NumPy, PyArrow); tests/cli checks that they agree.
ALGORITHMS = ("pagerank", "bfs", "jaccard", "sorensen", "overlap", "cosine")
# PageRank's convergence rules, spelled out for the same reason.
CONVERGENCE = ("total", "networkx")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "graph",
        help="run pagerank, bfs, jaccard, sorensen, overlap or cosine on Parquet edges",
        description=(
            "Run a graph algorithm on the edge list in URL (a Parquet object or directory; a "
            "local path, file:// or s3://). Vertex ids are the integer values of --src and "
            "--dst. PageRank and BFS default to --directed, the similarities to --undirected."
        ),
    )
    parser.add_argument(
        "algorithm", choices=list(ALGORITHMS), metavar="ALGORITHM", help=" | ".join(ALGORITHMS)
    )
    parser.add_argument("url", metavar="URL", help="Parquet edges (object or directory)")
    parser.add_argument("--src", required=True, metavar="COL", help="source vertex column")
    parser.add_argument("--dst", required=True, metavar="COL", help="destination vertex column")
    parser.add_argument(
        "--weight",
        default=None,
        metavar="COL",
        help="edge weight column (pagerank only: BFS and the similarities ignore weights)",
    )
    orientation = parser.add_mutually_exclusive_group()
    orientation.add_argument(
        "--directed", dest="directed", action="store_true", default=None, help="edges are directed"
    )
    orientation.add_argument(
        "--undirected", dest="directed", action="store_false", help="edges are symmetrized"
    )
    parser.add_argument(
        "--source",
        type=integer_option("--source"),
        default=None,
        metavar="V",
        help="BFS start vertex (required for bfs)",
    )
    parser.add_argument(
        "--depth-limit", type=integer_option("--depth-limit"), default=None, help="BFS depth limit"
    )
    parser.add_argument(
        "--alpha", type=number_option("--alpha"), default=None, help="PageRank damping (0.85)"
    )
    parser.add_argument(
        "--tol", type=number_option("--tol"), default=None, help="PageRank tolerance (1e-6)"
    )
    parser.add_argument(
        "--max-iter",
        type=integer_option("--max-iter"),
        default=None,
        help="PageRank iterations (100)",
    )
    parser.add_argument(
        "--convergence",
        choices=CONVERGENCE,
        default=None,
        help="how PageRank reads --tol: total (default) stops when the L1 change of the "
        "whole rank vector is below it; networkx when it is below vertices x tol",
    )
    add_output_options(parser)
    parser.set_defaults(func=_run)


def _flag(name: str) -> str:
    """The command-line flag of a query parameter (``max_iter`` -> ``--max-iter``)."""
    return "--" + name.replace("_", "-")


def _run(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.service import WEIGHTED, GraphQuery, Scan, graph_params

    given = {
        "source": args.source,
        "depth_limit": args.depth_limit,
        "alpha": args.alpha,
        "tol": args.tol,
        "max_iter": args.max_iter,
        "convergence": args.convergence,
    }
    given = {name: value for name, value in given.items() if value is not None}
    # validated here so that every message names the flag, not the query field
    params = graph_params(args.algorithm, given, _flag)
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
    directed = args.directed
    if directed is None:
        directed = args.algorithm in ("pagerank", "bfs")
    # dict.fromkeys: a weight that is also an id column is read once
    columns = tuple(dict.fromkeys(c for c in (args.src, args.dst, args.weight) if c is not None))
    query = GraphQuery(
        Scan(args.url, columns=columns),
        args.src,
        args.dst,
        args.algorithm,
        weight=args.weight,
        directed=directed,
        params=params,
    )
    return run_query(query, args)
