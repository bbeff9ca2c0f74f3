"""``nexus-cache demo``: the main job, every cache at work on generated data.

Generates an R-MAT edge table (Graph500 parameters) and a fact table as
Parquet in a directory that stands in for the remote lakehouse, warms a
:class:`QueryService` up (GPU kernel compilation, printed on its own line),
runs scan, count, PageRank, PageRank on a time window of the edges (a
filtered query), BFS and Jaccard through it cold and then warm,
and prints one table (times, speedup, cache statuses) and the device cache
report. Exit status 0 only when every warm result equals its cold one.
The program-cache demo is ``nexus-cache program-cache demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import textwrap
from typing import Any

from nexus_cache.backends.kinds import AUTO, BACKEND_NAMES, backend_help, backend_kind
from nexus_cache.cli._output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    SIZE_HELP,
    Advance,
    Table,
    add_json_option,
    emit,
    integer_option,
    progress,
    size,
    size_option,
)

__all__ = ["register"]

_PHASES = {
    "generate": "generating R-MAT edges and facts",
    "warm-up": "warm-up (every query path once)",
    "cold": "cold run (caches start empty)",
    "warm": "warm runs (median of 3)",
}


#: the width the demo's text fits (its tables and lines): an 80-column terminal
WIDTH = 80

# service.demo.DEFAULT_SCALE, spelled out: building the command line must not
# import the service (NumPy, PyArrow); tests/cli checks that the two agree.
DEFAULT_SCALE = 12


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run scan, count, PageRank (also on a time window), BFS and Jaccard cold then "
        "warm through every cache",
        description=(
            "Generate an R-MAT edge table and a fact table as Parquet in a local directory "
            "that stands in for the remote lakehouse, then run a query mix through the query "
            "service twice: cold (empty caches) and warm; one PageRank runs on a time window of "
            "the edges (a filter), after the unfiltered one. Prints the times, the speedup and "
            "the lakehouse, source and graph cache status of each query, then the device "
            "cache report. Uses the GPU when CuPy finds one, else the host backend. Exit "
            "status 0 only when every warm result equals its cold result. (The "
            "compiled-program demo is 'nexus-cache program-cache demo'.)"
        ),
    )
    parser.add_argument(
        "--scale",
        type=integer_option("--scale"),
        default=DEFAULT_SCALE,
        help=f"R-MAT scale: 2**SCALE vertices, 16 * 2**SCALE edges (default {DEFAULT_SCALE})",
    )
    parser.add_argument(
        "--fact-rows",
        type=integer_option("--fact-rows"),
        default=None,
        help="rows of the fact table (default: as edges)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default=AUTO,
        help=f"device backend (default {AUTO}); {backend_help()}",
    )
    parser.add_argument(
        "--cache-cap-bytes",
        type=size_option("--cache-cap-bytes"),
        default=None,
        metavar="SIZE",
        help="cache_cap_bytes of each device (default: 25%% of its managed capacity); "
        + SIZE_HELP,
    )
    parser.add_argument(
        "--workdir",
        default=None,
        help="keep the lake, cache root and evidence here (default: a temporary directory)",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="run a --scale estimated to take more than a few minutes without asking",
    )
    add_json_option(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.service.demo import run_demo

    if not 1 <= args.scale <= 30:
        raise ConfigError(f"--scale={args.scale} is not accepted; use 1..30")
    if args.fact_rows is not None and args.fact_rows < 1:
        raise ConfigError(f"--fact-rows={args.fact_rows} is not accepted; use a number >= 1")
    if not _confirmed(args):
        print(
            "nexus-cache: demo not run; pass a smaller --scale, or --yes to run it unasked",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    with _PhaseBars() as bars:
        report = run_demo(
            scale=args.scale,
            fact_rows=args.fact_rows,
            workdir=args.workdir,
            backend=args.backend,
            cache_cap_bytes=args.cache_cap_bytes,
            progress=bars.tick,
            status=bars.say,
        )
    if args.json:
        emit(report.to_dict(), None, as_json=True)
    else:
        emit(None, _query_table(report), as_json=False)
        sys.stdout.write(_cold_starts(report))
        sys.stdout.write(_window_note(report))
        sys.stdout.write(_warmup_line(report))
        sys.stdout.write(_legend(report))
        sys.stdout.write("\n")
        emit(None, _device_table(report.device_cache_reports), as_json=False)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _confirmed(args: argparse.Namespace) -> bool:
    """Whether to run a demo estimated to take more than a few minutes.

    On a terminal the user is asked (``--yes`` skips the question); off one
    (CI, a pipe) a warning with the estimate goes to stderr and the demo runs:
    a script is never left waiting for an answer.
    """
    from nexus_cache.backends import BACKENDS
    from nexus_cache.service.demo import QUICK_DEMO_S, estimate_demo_seconds

    if max(estimate_demo_seconds(args.scale, kind.name) for kind in BACKENDS) <= QUICK_DEMO_S:
        return True  # quick on the slowest backend: no need to find out which one runs
    backend = args.backend
    if backend == AUTO:
        from nexus_cache.backends import select_backend

        backend = select_backend(AUTO).name
    seconds = estimate_demo_seconds(args.scale, backend)
    if seconds <= QUICK_DEMO_S:
        return True
    line = (
        f"--scale {args.scale} ({16 << args.scale:,} edges) on the {backend} backend is "
        f"estimated to take {_about(seconds)} (each query runs four times)"
    )
    if args.yes:
        return True
    if sys.stdin.isatty() and sys.stderr.isatty():
        sys.stderr.write(f"{line}. Run it? [y/N] ")
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    print(f"nexus-cache: warning: {line}; running it (no terminal to ask)", file=sys.stderr)
    return True


def _about(seconds: float) -> str:
    for unit, span in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * span:
            return f"about {seconds / span:,.0f} {unit}"
    return f"about {seconds:.0f} seconds"


class _PhaseBars:
    """One progress bar per demo phase, its text naming the query that runs
    (drawn only when stderr is a terminal: nothing reaches ``--json``)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._phase: str | None = None
        self._advance: Advance = _no_advance

    def tick(self, phase: str, done: int, total: int) -> None:
        if phase != self._phase:
            self._stack.close()
            self._stack = contextlib.ExitStack()
            self._advance = self._stack.enter_context(progress(_PHASES.get(phase, phase), total))
            self._phase = phase
        if done:
            self._advance(1)

    def say(self, line: str) -> None:
        self._advance(0, description=line)

    def __enter__(self) -> _PhaseBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _no_advance(n: int = 1, *, description: str | None = None) -> None:
    """Before the first phase: nothing to draw."""


def _pair(cold: Any, warm: Any) -> str:
    return str(cold) if cold == warm else f"{cold}→{warm}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f}s"
    ms = seconds * 1000
    return f"{ms:.1f}ms" if ms < 10 else f"{ms:.0f}ms"


def _short(status: Any) -> str:
    return "-" if status == "not_applicable" else str(status)


def _query_table(report: Any) -> Table:
    """One row a query; narrow enough for an 80-column terminal (which cold run
    started warm is said below it, by :func:`_cold_starts`)."""
    differ = [q.name for q in report.queries if not q.equal]
    table = Table(
        ["query", "cold", "warm", "speedup", "lakehouse", "source", "graph"],
        title=(
            f"nexus-cache demo on {report.backend}: R-MAT scale {report.scale} "
            f"({report.edges} edges), {report.fact_rows} fact rows"
        ),
        right=["cold", "warm", "speedup"],
        whole=["query", "cold", "warm", "speedup", "lakehouse", "source", "graph"],
        footer=(
            "every warm result equals its cold result"
            if not differ
            else f"warm results DIFFER from cold ones: {', '.join(differ)}"
        ),
    )
    for q in report.queries:
        table.add(
            q.name,
            _duration(q.cold_s),
            _duration(q.warm_s),
            f"{q.speedup:.1f}x",
            _pair(q.cold["lakehouse"], q.warm["lakehouse"]),
            _pair(q.cold["source_cache"], q.warm["source_cache"]),
            _pair(_short(q.cold["graph_cache"]), _short(q.warm["graph_cache"])),
        )
    return table


def _fill(text: str) -> str:
    """``text`` as lines of at most :data:`WIDTH` columns, broken between words."""
    return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False) + "\n"


def _cold_starts(report: Any) -> str:
    """Which cold runs found an earlier query's caches (the same source)."""
    warmed = [f"{q.name} after {', '.join(q.warmed_by)}" for q in report.queries if q.warmed_by]
    empty = [q.name for q in report.queries if not q.warmed_by]
    if not warmed:
        return ""
    return _fill(
        f"cold start: {'; '.join(warmed)}: each cold run finds what the earlier queries of "
        f"its source cached; {', '.join(empty)} start on empty caches."
    )


def _window_note(report: Any) -> str:
    """What the filtered query reads, and why its cold run is a source hit."""
    for q in report.queries:
        edges = q.query.get("edges") or {}
        if not edges.get("filter"):
            continue
        window = " and ".join(f"{c} {op} {v}" for clause in edges["filter"] for c, op, v in clause)
        unfiltered = [w for w in q.warmed_by if w != q.name]
        after = f" after {unfiltered[0]}" if unfiltered else ""
        return _fill(
            f"filtered: {q.name} is PageRank on the edges where {window}. It reads the "
            f"columns {', '.join(edges['columns'] or ())} as the unfiltered queries do, so "
            f"its cold run{after} is a source-cache hit (only the filter's mask and "
            "gather run) and a graph-cache miss (a graph of its own, keyed by the filter)."
        )
    return ""


_LEGEND = """\
cold: each query's first run, in the order above; warm: the median of 3 more.
speedup: cold / warm. Near or below 1x when the cold run found its data cached
  already, or when the time is the algorithm itself (Jaccard), which no cache
  removes: both runs do the same work and the ratio is timing noise.
statuses, cold->warm. lakehouse: miss (copied into the local cache, then read),
  miss-followed (another run made the copy), hit (read from the local cache),
  bypass (read remotely). source cache:
  miss-led (decoded the Parquet, offered the frames to the device cache),
  miss-followed (waited for another run's decode), hit (copied cached frames),
  bypass (not cached). graph cache: miss (built and kept the graph), hit (ran
  on a kept graph), bypass (built for this run only), - (not a graph query).
"""


def _legend(report: Any) -> str:
    slow = [f"{q.name} {q.speedup:.1f}x" for q in report.queries if q.speedup < 1]
    note = ""
    if slow:
        note = _fill(f"below 1x here: {', '.join(slow)} (see speedup above)")
    return "\n" + _LEGEND.replace("->", "→") + note


def _warmup_line(report: Any) -> str:
    """The one-time warm-up, apart from the cold column (which excludes it): GPU
    kernels on a device backend, Numba's loops (when installed) on the host."""
    if backend_kind(report.backend).host_memory:
        what = "host backend: Numba's loops compiled once per machine, loaded once per process"
    else:
        what = "GPU kernels compiled once per machine, loaded once per process"
    return _fill(
        f"compile/warm-up: {_duration(report.warmup_s)} before the cold run, not part of the "
        f"cold times ({what})"
    )


def _device_table(rows: Any) -> Table:
    table = Table(
        ["device", "cache cap", "evictable", "pinned", "domain used", "source", "graph"],
        title="device cache report (source, graph: cache hits/misses)",
        right=["cache cap", "evictable", "pinned", "domain used"],
        whole=["device", "cache cap", "evictable", "pinned", "domain used", "source", "graph"],
    )
    for row in rows:
        table.add(
            f"{row['device_id']} ({row['backend']})",
            size(row["cache_cap_bytes"]),
            size(row["cache_evictable_resident_bytes"]),
            size(row["cache_pinned_in_use_bytes"]),
            size(row["domain_used_bytes"]),
            _counts(row, "source"),
            _counts(row, "graph"),
        )
    return table


def _counts(row: dict[str, Any], kind: str) -> str:
    hits, misses = row.get(f"{kind}_hits"), row.get(f"{kind}_misses")
    return "-" if hits is None else f"{hits}/{misses}"
