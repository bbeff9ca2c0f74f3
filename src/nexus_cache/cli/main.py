"""Entry point of the ``nexus-cache`` command.

Each area registers its own sub-command from a module of this package that
exposes ``register(subparsers)``; the module is imported only when the command
line is built, so heavy imports stay inside the areas that need them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

# sub-command modules under nexus_cache.cli, in help order
_AREAS = ("demo", "program", "lakehouse", "device")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexus-cache",
        description="Caches for GPU data work: compiled programs, lakehouse bytes, GPU residency.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for area in _AREAS:
        try:
            module = importlib.import_module(f"nexus_cache.cli.{area}")
        except ModuleNotFoundError as exc:
            if exc.name == f"nexus_cache.cli.{area}":
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clean line for expected failures
        from nexus_cache.errors import NexusCacheError

        if isinstance(exc, (NexusCacheError, OSError)):
            print(f"nexus-cache: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
