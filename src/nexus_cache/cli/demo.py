"""``nexus-cache demo``: the README's main job (program cache, miss then hit)."""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.cli.program import parse_arch

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from nexus_cache import program

    return int(program.run_demo(args.path, arch=args.arch))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="compile a real CUDA kernel through the program cache twice; print miss/hit timings",
        description=(
            "Compile a templated kernel with NVRTC through a FileStreamProgramCache twice "
            "(the second time through a fresh cache object on the same directory) and print "
            "the miss and hit timings. Needs cuda.core (the 'cuda' extra), not a GPU."
        ),
    )
    parser.add_argument(
        "--path",
        default=None,
        help="cache directory to use and keep (default: a temporary one, removed afterwards)",
    )
    parser.add_argument(
        "--arch", type=parse_arch, default="sm_90", help="target architecture (default: sm_90)"
    )
    parser.set_defaults(func=_run)
