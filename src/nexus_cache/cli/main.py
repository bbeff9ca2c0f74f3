"""Entry point of the ``nexus-cache`` command.

Each area registers its own sub-command from a module of this package that
exposes ``register(subparsers)``; the module is imported only when the command
line is built, so heavy imports stay inside the areas that need them. Shared
output, progress, error and exit-code rules live in :mod:`nexus_cache.cli._output`.
"""

from __future__ import annotations

import sys

try:
    import argparse
    import importlib
    import os
    from collections.abc import Sequence
    from typing import NoReturn

    from nexus_cache.cli._output import EXIT_INTERRUPTED, EXIT_PROBLEMS, exit_code_for, literal
    from nexus_cache.cli._remote import quiet_grpc
except KeyboardInterrupt:
    # A Ctrl-C while the command starts (these imports take tens of ms) is as
    # much an interrupt as one inside it: exit 130 quietly, not with the
    # traceback an uncaught KeyboardInterrupt prints.
    raise SystemExit(130) from None

__all__ = ["build_parser", "entry", "main"]

# sub-command modules under nexus_cache.cli, in help order
_AREAS = (
    "demo",
    "scan",
    "graph",
    "warmup",
    "evidence",
    "program",
    "lakehouse",
    "device",
    "cluster",
    "serve",
)
#: commands registered by another area's module
_ALIASES = {"count": "scan"}


def _version() -> str:
    from nexus_cache import __version__

    return f"nexus-cache {__version__}"


class _OneLineParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line like every other error (exit 2).

    Sub-command parsers inherit the class (``add_subparsers`` uses the
    parent's), so every group behaves the same; ``--help`` still shows usage.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (an area's name), only that area's
    sub-command: its module alone is imported, so a quick command (``scan
    --server``) does not pay for the imports of every other area."""
    parser = _OneLineParser(
        prog="nexus-cache",
        description="Caches for GPU data work: compiled programs, lakehouse bytes, GPU residency.",
        epilog=(
            "Exit status: 0 done; 1 problems found (verify) or an unexpected error; "
            "2 bad option, bad configuration, missing extra, no cache at the location, or an "
            "unsafe location; 130 interrupted."
        ),
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the full traceback instead of one line",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for area in _AREAS if command is None else (command,):
        try:
            module = importlib.import_module(f"nexus_cache.cli.{area}")
        except ModuleNotFoundError as exc:
            if exc.name == f"nexus_cache.cli.{area}":
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names, or None when that is not plain to see (a
    top-level ``--help`` before it, or no known command)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("-"):
            return arg if arg in _AREAS else _ALIASES.get(arg)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; returns the exit status (never raises, except SystemExit).

    Every error becomes one line on stderr (``nexus-cache: error: ...``) and a
    non-zero status chosen by :func:`nexus_cache.cli._output.exit_code_for`;
    ``--debug`` prints the traceback as well. gRPC's own log lines are kept
    off the terminal (:func:`~nexus_cache.cli._remote.quiet_grpc`).
    """
    quiet_grpc()
    try:
        # Building the parser imports every area's command module: a Ctrl-C
        # there is as much an interrupt as one inside the command.
        args = build_parser(_command(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): nothing is wrong and nothing can be
        # said. Point stdout at /dev/null so the interpreter's final flush does
        # not fail again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PROBLEMS
    except Exception as exc:
        if args.debug:
            import traceback

            traceback.print_exc(file=sys.stderr)
        message = " ".join(str(exc).split()) or type(exc).__name__
        if not type(exc).__module__.startswith("nexus_cache") and not isinstance(exc, OSError):
            # A foreign error (NVRTC, botocore, ...): its class is part of the story.
            message = f"{type(exc).__name__}: {message}"
        print(f"nexus-cache: error: {literal(message)}", file=sys.stderr)
        return exit_code_for(exc)


def entry() -> NoReturn:
    """The ``nexus-cache`` console script: exit with :func:`main`'s status.

    After a Ctrl-C that gave up a server call still running (its worker thread
    inside gRPC, past the moment the interrupt waits for it), the process exits
    at once, its output flushed, without the interpreter's teardown: gRPC can
    crash there under a live call.
    """
    code = main()
    calls = sys.modules.get("nexus_cache.client._calls")  # not imported: no call made
    if code == EXIT_INTERRUPTED and calls is not None and calls.abandoned_calls():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe, a closed stream
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
