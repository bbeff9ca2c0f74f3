"""The run's context lines and its summary table."""

from __future__ import annotations

import os
import statistics
import sys

from _lakehouse.concurrency import ConcResult
from _lakehouse.measure import Row

__all__ = ["code_version", "load", "print_table", "versions"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def print_table(rows: list[Row], conc: list[ConcResult]) -> None:
    """The summary: one line per ratio row, then the concurrency results."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200, highlight=False, soft_wrap=True)
    table = Table(
        title="Summary (medians; ratio = ours/peer: 'thr' = throughput, higher is better; "
        "'time' = time, lower is better)",
        title_justify="left",
    )
    for name in ("figure", "remote", "ours", "ours ms", "peer", "peer ms", "ratio", "target"):
        table.add_column(name, justify="right" if "ms" in name or name == "ratio" else "left")
    table.add_column("verdict")
    for r in rows:
        target = ""
        if r.limit is not None:
            target = (">=" if r.throughput else "<=") + f"{r.limit:.2f}"
        kind = "thr" if r.throughput else "time"
        table.add_row(
            r.figure,
            r.remote,
            r.ours,
            _ms(statistics.median(r.ours_s)),
            r.peer,
            _ms(statistics.median(r.peer_s)),
            f"{r.ratio:.2f} {kind}",
            target,
            r.verdict,
        )
    console.print(table)
    if not conc:
        return
    table = Table(title="(4) concurrency", title_justify="left")
    for name in ("reader", "remote", "reads", "fetched/round", "fills/round", "correct"):
        table.add_column(name)
    for name in ("partial", "wrong", "errors", "wall ms", "verdict"):
        table.add_column(name)
    for c in conc:
        fills = "-" if c.fills is None else ",".join(map(str, c.fills))
        table.add_row(
            c.kind,
            c.remote,
            str(c.readers),
            f"{c.fetched:.2f}x",
            fills,
            str(c.correct),
            str(c.partial),
            str(c.wrong),
            str(len(c.errors)),
            f"{c.wall_s * 1e3:.0f}",
            c.verdict,
        )
    console.print(table)


def versions() -> str:
    import fsspec
    import moto
    import pyarrow
    import s3fs

    return f"python {sys.version.split()[0]}, pyarrow {pyarrow.__version__}, fsspec {fsspec.__version__}, s3fs {s3fs.__version__}, moto {moto.__version__}"


def code_version() -> str:
    """The last commit of the measured package, and whether it has local changes."""
    import subprocess

    import nexus_cache.lakehouse as pkg

    where = os.path.dirname(pkg.__file__)
    try:
        git = ["git", "-C", where]
        commit = subprocess.run(
            [*git, "log", "-1", "--format=%h", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"nexus_cache.lakehouse from {where} (not a git checkout)"
    return f"nexus_cache.lakehouse at {commit}{' + uncommitted changes' if dirty else ''}"


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
