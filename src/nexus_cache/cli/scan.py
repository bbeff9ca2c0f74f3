"""``nexus-cache scan URL``: read Parquet through the query service and its caches;
``nexus-cache count URL``: count its rows (those a filter keeps).

URL is anything the lakehouse cache reads (a local path, ``file://``,
``s3://``), one object or a directory. Without ``--out`` the first rows are
printed as a table, with the cache statuses below; ``--out FILE.parquet``
writes the whole result instead. The service is configured from the
environment (``NEXUS_LAKEHOUSE_*``, ``NEXUS_DEVICE_*``, ``NEXUS_SERVICE_*``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from nexus_cache.cli._output import (
    EXIT_OK,
    CommandError,
    Table,
    add_json_option,
    count_option,
    emit,
    integer_option,
    progress,
)
from nexus_cache.cli._remote import absolute_sources, add_server_option, client_for, server_url

__all__ = [
    "add_output_options",
    "add_table_options",
    "register",
    "report_result",
    "table_options",
    "write_parquet_atomically",
]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "scan",
        help="read Parquet (a file or a directory) through the caches; print or save the rows",
        description=(
            "Scan Parquet through the query service: the lakehouse cache, then the decoded "
            "source cache. URL is a local path, file:// or s3:// (any fsspec URL), naming one "
            "object or a directory of them. Settings come from the environment "
            "(NEXUS_LAKEHOUSE_*, NEXUS_DEVICE_BACKEND, NEXUS_SERVICE_*)."
        ),
    )
    parser.add_argument("url", metavar="URL", help="Parquet object or directory")
    parser.add_argument(
        "--columns",
        default=None,
        metavar="A,B",
        help="comma-separated columns to read (default: all)",
    )
    parser.add_argument(
        "--batch-rows",
        type=integer_option("--batch-rows"),
        default=65536,
        help="rows per decoded batch (default 65536)",
    )
    parser.add_argument(
        "--count",
        action="store_true",
        help="print the number of rows instead of the rows (with --filter: the rows it "
        "keeps, counted over the filter's decoded columns; without: from the Parquet "
        "footers, nothing decoded)",
    )
    add_table_options(parser)
    add_output_options(parser)
    parser.set_defaults(func=_run)

    count = subparsers.add_parser(
        "count",
        help="count the rows of Parquet (a file, a directory or a table); with --filter, "
        "those it keeps",
        description=(
            "Count rows through the query service, as `scan URL --count` does: without "
            "--filter from the Parquet footers (nothing decoded), with --filter over the "
            "filter's decoded columns (a source-cache hit when a scan read them). Settings "
            "come from the environment (NEXUS_LAKEHOUSE_*, NEXUS_DEVICE_BACKEND, "
            "NEXUS_SERVICE_*)."
        ),
    )
    count.add_argument("url", metavar="URL", help="Parquet object, directory or table")
    add_table_options(count)
    _add_device_option(count)
    add_json_option(count)
    add_server_option(count)
    count.set_defaults(func=_run, count=True, columns=None, out=None, limit=20)


def add_table_options(parser: argparse.ArgumentParser) -> None:
    """``--filter`` (repeatable, AND) and ``--as-of``, shared by ``scan`` and ``graph``."""
    parser.add_argument(
        "--filter",
        action="append",
        default=None,
        metavar="EXPR",
        help="keep the rows where EXPR holds: col=value, col!=value, col<value, col<=value, "
        "col>value, col>=value, 'col in a,b,c' or 'col not in a,b,c' (values read as the "
        "column's type); repeat for AND",
    )
    parser.add_argument(
        "--as-of",
        type=count_option("--as-of"),
        default=None,
        metavar="N",
        help="read this Delta version or Iceberg snapshot id (default: the latest)",
    )


def table_options(args: argparse.Namespace) -> dict[str, Any]:
    """``filter`` and ``as_of`` of a Scan or Count from ``--filter`` / ``--as-of``. The
    expressions are read against the table's schema (resolved here, from this
    machine), so that each value is read as its column's type."""
    if not args.filter:
        return {"filter": None, "as_of": args.as_of}
    from nexus_cache.tables import parse_filter_arg, resolve_table

    schema = resolve_table(args.url, args.as_of).schema
    return {
        "filter": [parse_filter_arg(text, schema) for text in args.filter],
        "as_of": args.as_of,
    }


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--out``, ``--limit`` and ``--json``, shared by ``scan`` and ``graph``."""
    _add_device_option(parser)
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE.parquet",
        help="write the result as Parquet (to a temp beside FILE, renamed over it when whole)",
    )
    parser.add_argument(
        "--limit",
        type=count_option("--limit"),
        default=20,
        metavar="N",
        help="rows to print without --out (default 20; 0 prints only the summary)",
    )
    add_json_option(parser)
    add_server_option(parser)


def _add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        type=count_option("--device"),
        default=None,
        metavar="ID",
        help="run on this device id (default: the device whose caches hold the source, "
        "else the one with the most free memory)",
    )


def _run(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.service.queries import Count, Scan

    if args.count:
        if args.columns is not None:
            raise ConfigError(
                f"--columns={args.columns!r} with --count: a count has no columns; "
                "leave --columns out (--filter may name any column)"
            )
        return run_query(Count(args.url, **table_options(args)), args)
    columns = None
    if args.columns is not None:
        columns = tuple(c.strip() for c in args.columns.split(",") if c.strip())
        if not columns:
            raise ConfigError(f"--columns={args.columns!r} names no column; use e.g. a,b")
    scan = Scan(args.url, columns=columns, batch_rows=args.batch_rows, **table_options(args))
    return run_query(scan, args)


def run_query(query: Any, args: argparse.Namespace) -> int:
    """Execute ``query`` on a service configured from the environment and report it.

    Errors of the query's input (a missing source, data that is not Parquet,
    columns that cannot be vertex ids, a BFS source not in the graph, a grant
    the device can never admit) exit with :data:`EXIT_USAGE`, like a bad
    option: the user has to change the command line, not retry it.
    """
    from nexus_cache.errors import (
        CacheIntegrityError,
        FrameTypeError,
        GrantTooLargeError,
        GraphInputError,
        SourceFormatError,
    )

    _check_out(args.out)  # before the query runs: a bad --out must not cost a whole query
    label = f"{query.kind} {getattr(query, 'algorithm', '')}".strip()
    url = server_url(args)
    try:
        with progress(label, None):
            if url is not None:
                with client_for(url, args) as client:
                    result = client.execute(absolute_sources(query), device=args.device)
            else:
                # only here: the service (its caches, NumPy, fsspec) costs a second of
                # imports that a query sent to a server does not need
                from nexus_cache.service import QueryService

                try:
                    service = QueryService()
                except CacheIntegrityError as exc:
                    # the configured lakehouse root holds something else (another
                    # cache, a home directory): a setting to change, not to retry
                    raise CommandError(" ".join(str(exc).split())) from exc
                with service:
                    result = service.execute(query, device=args.device)
    except (
        FileNotFoundError,
        NotADirectoryError,
        FrameTypeError,
        GrantTooLargeError,
        GraphInputError,
        SourceFormatError,
    ) as exc:
        raise CommandError(" ".join(str(exc).split())) from exc
    report_result(result, args)
    return EXIT_OK


def report_result(result: Any, args: argparse.Namespace) -> None:
    """Write ``--out``, or print the first ``--limit`` rows; then the statuses."""
    table, diag = result.table, result.diagnostics
    ranking = _convergence(diag.algorithm)
    if ranking and not diag.algorithm["converged"]:
        # the result is still written or printed: the last vector, flagged
        print(f"nexus-cache: warning: {ranking}", file=sys.stderr)
    if args.out is not None:
        try:
            write_parquet_atomically(table, args.out)
        except OSError as exc:
            raise CommandError(
                f"--out={args.out!r} cannot be written ({' '.join(str(exc).split())})"
            ) from exc
    head = table.slice(0, max(0, args.limit))
    if args.json:
        data = {
            "rows": table.num_rows,
            "columns": table.column_names,
            "out": args.out,
            "head": [] if args.out is not None else head.to_pylist(),
            "diagnostics": diag.to_dict(),
        }
        emit(data, None, as_json=True)
        return
    footer = (
        f"{table.num_rows} rows"
        + (f" written to {args.out}" if args.out is not None else "")
        + f"; lakehouse {_status(diag.lakehouse)} (read {diag.lakehouse['read_mode']})"
        + f", source cache {_status(diag.source_cache)}, graph cache {_status(diag.graph_cache)}"
        + (f"; {ranking}" if ranking else "")
        + f"; {diag.timings.get('total_s', 0.0) * 1000:.1f} ms"
    )
    if args.out is not None:
        emit(None, Table(table.column_names, footer=footer), as_json=False)
        return
    out = Table(table.column_names, footer=footer)
    for row in head.to_pylist():
        out.add(*(row[name] for name in table.column_names))
    emit(None, out, as_json=False)


def write_parquet_atomically(table: Any, out: str) -> None:
    """Write ``table`` as Parquet to a temp beside ``out``, fsync it, rename it over ``out``.

    Crash-safe: a kill or a failure at any instant leaves the previous
    ``out`` whole (or no file), never a torn one; at most a temp named
    ``.NAME.*.tmp`` stays beside it after a kill. A failed write removes its
    temp. ``out`` that is a symlink is followed: its target is replaced, as
    a plain write would change it. The new file gets the old one's
    permissions, else those the umask gives a new file. Temps beside ``out``
    that a killed earlier write left (``.NAME.<host>-<pid>-<random>.tmp`` of
    a dead process of this host) are removed first.
    """
    import pyarrow.parquet as pq

    from nexus_cache._storage import new_temp, publish_temp, unlink_quietly

    final = os.path.realpath(out)
    _sweep_dead_temps(final)
    fd, tmp = new_temp(os.path.dirname(final), prefix=f".{os.path.basename(final)}.")
    try:
        os.fchmod(fd, _mode_for(final))
        with open(fd, "wb", closefd=False) as f:
            pq.write_table(table, f)
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    publish_temp(fd, tmp, final)  # fsync, close, rename; removes the temp on error


def _sweep_dead_temps(final: str) -> None:
    """Remove the temps of ``final`` whose writer, a process of this host, is dead.

    Only names :func:`write_parquet_atomically` makes, regular files of ours;
    a temp of a live process (a concurrent write) or of another host is kept.
    """
    import re
    import stat

    from nexus_cache._storage import host_tag, pid_alive, unlink_quietly

    parent, name = os.path.split(final)
    pattern = re.compile(re.escape(f".{name}.") + r"([0-9a-f]{8})-([0-9]+)-[0-9a-f]{16}\.tmp\Z")
    try:
        names = os.listdir(parent)
    except OSError:
        return
    me, uid = host_tag(), os.geteuid()
    for entry in names:
        m = pattern.match(entry)
        if m is None or m.group(1) != me or pid_alive(int(m.group(2))):
            continue
        path = os.path.join(parent, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
            unlink_quietly(path)


def _mode_for(path: str) -> int:
    """The permissions a rewrite of ``path`` keeps: its own, else 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # /proc, not os.umask(): setting the umask to read it would race with the
    # service's threads creating cache files meanwhile.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _check_out(out: str | None) -> None:
    """Refuse an ``--out`` that cannot be a file: a directory, or a missing parent."""
    if out is None:
        return
    path = Path(out)
    if path.is_dir():
        raise CommandError(f"--out={out!r} is a directory; name a .parquet file")
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"--out={out!r}: directory {str(parent)!r} does not exist; create it")
    if not os.access(parent, os.W_OK):
        raise CommandError(f"--out={out!r}: directory {str(parent)!r} is not writable")


def _convergence(facts: dict[str, Any]) -> str:
    """PageRank's convergence in words ('' for other queries)."""
    if "converged" not in facts:
        return ""
    steps = f"{facts['iterations']} iterations (last L1 change {facts['error']:.3g}"
    if facts["converged"]:
        return f"pagerank converged in {steps} < {facts['threshold']:.3g})"
    return (
        f"pagerank did not converge in {steps}, needed < {facts['threshold']:.3g}); "
        "the ranks are the last iteration's: raise --max-iter or --tol"
    )


def _status(part: dict[str, Any]) -> str:
    reason = part.get("reason")
    return part["status"] + (f" ({reason})" if reason else "")
