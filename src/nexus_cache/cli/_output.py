"""Shared pieces of every ``nexus-cache`` sub-command: output, progress, errors, exit codes.

A sub-command module (``nexus_cache.cli.<area>``) exposes ``register(subparsers)``
and sets ``func`` on its parsers; ``func(args)`` returns an exit code. Build it
from these helpers so every command behaves the same way:

* **Output.** Call :func:`add_json_option` on every parser that reports, then
  :func:`emit` with the data (JSON-friendly: dicts, lists, numbers, strings)
  and a :class:`Table` for humans. With ``--json`` the data goes to stdout as
  one JSON document; otherwise the table is drawn with ``rich``. Sizes in
  tables go through :func:`size` (IEC units, the package's one formatter),
  times through :func:`utc` and :func:`age`. JSON keeps raw numbers (bytes,
  nanoseconds, ISO-8601 UTC strings) so scripts never parse ``1.5 GiB``; it
  is strict JSON (NaN and infinities become ``null``). Tables print every
  cell, column name and title literally (data is never read as rich markup),
  nulls as a dim ``null`` and control characters escaped.
* **Progress.** Wrap long loops in :func:`progress`; it draws a ``rich`` bar
  on stderr only when stderr is a terminal, so pipes and ``--json`` output
  stay clean.
* **Errors.** Raise :class:`CommandError` (or any ``nexus_cache.errors``
  class) for a failure the user can fix; ``main`` prints it as one line on
  stderr and exits with :func:`exit_code_for`; ``--debug`` adds the
  traceback. Raise :class:`NoCacheError` when the location holds no cache.
* **Exit codes** (one rule for every group): :data:`EXIT_OK` (0) done;
  :data:`EXIT_PROBLEMS` (1) the command ran and found problems (``verify``
  found bad entries), or an unexpected error; :data:`EXIT_USAGE` (2) a bad
  option, a bad configuration value, a missing optional dependency, no cache
  where one was expected, or a location refused as unsafe (a symlink, another
  user's directory);
  :data:`EXIT_INTERRUPTED` (130) Ctrl-C.

Nothing here holds state between calls; every function is thread-safe.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from nexus_cache._numbers import parse_float_text, parse_int_text
from nexus_cache._sizes import SIZE_GRAMMAR, format_size, parse_size
from nexus_cache.errors import (
    BackendUnavailableError,
    CacheSecurityError,
    CommandError,
    ConfigError,
    NoCacheError,
)

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "NULL_TEXT",
    "SIZE_HELP",
    "Advance",
    "CommandError",
    "NoCacheError",
    "Table",
    "add_json_option",
    "count_option",
    "age",
    "emit",
    "exit_code_for",
    "integer_option",
    "literal",
    "number_option",
    "progress",
    "size",
    "size_option",
    "utc",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# CommandError and NoCacheError live in nexus_cache.errors (the one hierarchy);
# they are re-exported here for the command modules.


def exit_code_for(exc: BaseException) -> int:
    """The exit status of a command that raised ``exc`` (see the module docstring)."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, CommandError):
        return exc.exit_code
    if isinstance(exc, (ConfigError, CacheSecurityError, BackendUnavailableError)):
        return EXIT_USAGE
    return EXIT_PROBLEMS


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """Give a reporting command the ``--json`` flag (read back as ``args.json``)."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (raw numbers: bytes, UTC timestamps) instead of a table",
    )


@dataclass
class Table:
    """A table for humans: column headers, rows of cells, an optional title and footer.

    Cells are printed literally, never as rich markup (format sizes with
    :func:`size`); None prints as a dim ``null``; control characters print
    escaped (``\\x1b``). Columns listed in ``right`` are right-aligned
    (numbers, sizes); columns listed in ``whole`` are never shortened on a
    narrow terminal (timestamps, sizes: a cut ``2026-12-03T1…`` says nothing);
    the others fold onto more lines.
    """

    columns: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    title: str | None = None
    footer: str | None = None
    right: Sequence[str] = ()
    whole: Sequence[str] = ()

    def add(self, *cells: Any) -> None:
        self.rows.append(cells)


def _console(file: TextIO) -> Any:
    from rich.console import Console

    # No colour codes when not on a terminal: the output of a pipe should be
    # plain text that grep and cut can work with.
    return Console(file=file, highlight=False)


def _render(renderable: Any, out: TextIO) -> None:
    if out.isatty():
        _console(out).print(renderable)
        return
    # Off a terminal: a wide canvas (no wrapping at 80 columns) and no padding
    # at line ends.
    from rich.console import Console

    console = Console(width=200, highlight=False, color_system=None, record=True)
    with console.capture() as capture:
        console.print(renderable)
    for line in capture.get().splitlines():
        out.write(line.rstrip() + "\n")


def emit(data: Any, table: Table | None, *, as_json: bool, file: TextIO | None = None) -> None:
    """Print ``data`` as JSON (``as_json``) or ``table`` with rich, to ``file`` (stdout).

    A table without rows prints only its footer.
    """
    out = file if file is not None else sys.stdout
    if as_json or table is None:
        json.dump(_strict(data), out, indent=2, default=str, allow_nan=False)
        out.write("\n")
        return
    if table.rows:
        from rich import box
        from rich.table import Table as RichTable

        grid = RichTable(
            title=None if table.title is None else _text(table.title),
            box=box.SIMPLE_HEAD,
            title_justify="left",
        )
        for i, name in enumerate(table.columns):
            widest = None
            if name in table.whole:
                widest = max(len(_plain(row[i])) for row in table.rows)
            grid.add_column(
                _text(name),
                justify="right" if name in table.right else "left",
                min_width=widest,
                no_wrap=widest is not None,
                # fold, not "…": a narrow terminal shows a long name on two lines
                overflow="fold",
            )
        for row in table.rows:
            grid.add_row(*(_text(cell) for cell in row))
        _render(grid, out)
    if table.footer:
        out.write(_plain(table.footer) + "\n")


#: how a null cell (None) reads in a table; JSON keeps ``null``
NULL_TEXT = "null"

# C0 and C1 control characters but newline: an ESC from a cell value must not
# reach the terminal as an escape sequence (colours, cursor moves, titles).
# Surrogates too: a path that is not UTF-8 (b"caf\xe9") reaches Python as
# U+DCE9 (surrogateescape), which a UTF-8 stdout cannot encode (the command
# failed mid-table) and a C/POSIX one writes as the raw byte (0x9b is CSI on
# 8-bit terminals). Such a byte prints as \xe9; any other lone surrogate as \udXXX.
_CONTROLS = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x0A},
    **{c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)},
    **{c: f"\\u{c:04x}" for c in (*range(0xD800, 0xDC80), *range(0xDD00, 0xE000))},
}


def literal(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``), for any line that
    quotes data (paths, values, error messages) on a terminal."""
    return text.translate(_CONTROLS)


def _plain(cell: Any) -> str:
    """A cell as the text a table shows: ``null`` for None, control characters escaped."""
    return NULL_TEXT if cell is None else literal(str(cell))


def _text(cell: Any) -> Any:
    """A cell as rich ``Text``: printed literally, never parsed as markup.

    Cell values, column names and titles come from data (Parquet columns,
    paths, evidence file names): ``[red]x[/red]`` must print as written and
    ``[/]`` must not raise. None prints as a dim ``null``, distinct from an
    empty string.
    """
    from rich.text import Text

    if cell is None:
        return Text(NULL_TEXT, style="dim")
    return Text(_plain(cell))


def _strict(data: Any) -> Any:
    """``data`` with NaN and infinities as null: JSON has no spelling for them, and
    strict parsers (jq, JavaScript) refuse Python's ``NaN``."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_strict(v) for v in data]
    return data


class Advance(Protocol):
    """What :func:`progress` yields: ``advance(n)``, and ``description=`` to say
    what runs now (the bar's text changes; nothing is drawn off a terminal)."""

    def __call__(self, n: int = 1, *, description: str | None = None) -> None: ...


def _no_progress(n: int = 1, *, description: str | None = None) -> None:
    """The ``advance`` of a progress display that draws nothing."""


def size_option(name: str, *, allow_zero: bool = True) -> Callable[[str], int]:
    """An argparse ``type=`` for a byte-size option ``name``: the package's one grammar.

    Accepts ``1048576``, ``64M``, ``10GiB``, ``500MB`` (see ``SIZE_HELP``);
    a bad value is an argparse usage error (exit 2) that names the option.
    """

    def parse(text: str) -> int:
        try:
            return parse_size(text, name=name, allow_zero=allow_zero)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def count_option(name: str, *, minimum: int = 0) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole-number option ``name`` (``--limit``, ``--device``).

    ASCII digits only: ``int()`` alone also takes ``1_000`` and non-ASCII
    digits. A bad value is an argparse usage error (exit 2) naming the option.
    """

    def parse(text: str) -> int:
        try:
            number = parse_int_text(text)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r} is not accepted; use a whole number >= {minimum}"
            )
        return number

    return parse


def integer_option(name: str) -> Callable[[str], int]:
    """An argparse ``type=`` for a signed whole number; ASCII digits only.

    ``int()`` alone also takes ``1_000`` and Arabic-Indic or fullwidth digits;
    the range is checked where the value is used.
    """

    def parse(text: str) -> int:
        try:
            return parse_int_text(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r} is not accepted; use a whole number"
            ) from None

    return parse


def number_option(name: str) -> Callable[[str], float]:
    """An argparse ``type=`` for a decimal number (``0.85``, ``1e-6``); ASCII only.

    ``float()`` alone also takes ``1_0`` and non-ASCII digits. ``nan`` and
    ``inf`` pass here, so that the query names the accepted range for them.
    """

    def parse(text: str) -> float:
        try:
            return parse_float_text(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r} is not accepted; use a decimal number such as 0.85 or 1e-6"
            ) from None

    return parse


#: the size grammar, for option help texts
SIZE_HELP = SIZE_GRAMMAR.replace("%", "%%")


def size(nbytes: int | None) -> str:
    """Bytes in IEC units (``1.5 GiB``); ``-`` for None."""
    return "-" if nbytes is None else format_size(int(nbytes))


def utc(ns: int) -> str:
    """A nanosecond Unix time as ISO-8601 UTC (``2026-12-03T13:37:00Z``)."""
    stamp = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def age(ns: int, *, now_ns: int | None = None) -> str:
    """How long ago ``ns`` was, shortest unit first (``42s``, ``3m``, ``5h``, ``2d``)."""
    now = time.time_ns() if now_ns is None else now_ns
    seconds = max(0, (now - ns) // 1_000_000_000)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span}{unit}"
    return f"{seconds}s"


@contextlib.contextmanager
def progress(
    description: str, total: int | None, *, file: TextIO | None = None
) -> Iterator[Advance]:
    """Yield ``advance(n)``; draw a bar on stderr while the block runs, if it is a terminal.

    ``advance(0, description="...")`` changes the text beside the bar (what
    runs now) without moving it.

    ``total=None`` draws a spinner with elapsed time (work of unknown size).
    Off a terminal (pipes, CI, tests) nothing is drawn and ``advance`` is a
    no-op, so output captured by scripts is never mixed with progress.
    """
    out = file if file is not None else sys.stderr
    if not out.isatty():
        yield _no_progress
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    # markup=False: a description may quote a path or a query name
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=_console(out), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1, *, description: str | None = None) -> None:
            if description is not None:
                bar.update(task, description=description, refresh=True)
            bar.advance(task, n)

        yield advance
