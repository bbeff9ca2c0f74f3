"""``nexus-cache warmup``: compile and load every GPU kernel the queries use, now.

On a fresh machine the first query of each kind pays for compiling its GPU
kernels (seconds). This command runs the query service's warm-up once:
each served device loads the package's own kernels through the program
cache and runs every query path on a tiny built-in table, so CuPy's kernel
cache and the program cache on disk hold everything later processes need.
It prints the kernels it made ready (and where each came from), the steps it
ran and the time. Nothing is cached or charged; no data is read.
"""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.backends.kinds import (
    AUTO,
    BACKEND_NAMES,
    ENV_DEVICE_BACKEND,
    backend_help,
    backend_kind,
)
from nexus_cache.cli._output import EXIT_OK, Table, add_json_option, emit, progress

__all__ = ["register"]

_ORIGIN_TEXT = {
    "program-cache": "program cache (no compile)",
    "compiled": "compiled, stored in the program cache",
    "cupy": "compiled by CuPy",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "warmup",
        help="compile and load every GPU kernel the queries use, so no query pays for it",
        description=(
            "Run the query service's warm-up: on each served device, load the package's GPU "
            "kernels through the program cache (NEXUS_PROGRAM_CACHE_DIR) and run every query "
            "path (Parquet decode, scan, BFS, PageRank, Jaccard, Sorensen, Overlap, Cosine) "
            "once on a tiny built-in table, so CuPy's kernel cache and the program cache hold "
            "every kernel. Run it once on a fresh machine, or after a CUDA or driver upgrade. "
            "Nothing is cached or charged and no data is read. Settings come from the "
            "environment (NEXUS_DEVICE_BACKEND, NEXUS_SERVICE_*)."
        ),
    )
    parser.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default=None,
        help=f"device backend (default: {ENV_DEVICE_BACKEND}, else {AUTO}); {backend_help()}",
    )
    add_json_option(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nexus_cache.errors import CacheIntegrityError, CommandError
    from nexus_cache.program import default_filestream_root
    from nexus_cache.service import QueryService, ServiceConfig

    overrides = {} if args.backend is None else {"backend": args.backend}
    config = ServiceConfig.from_env(**overrides)
    with progress("warming up (compiling GPU kernels)", None):
        try:
            service = QueryService(config)
        except CacheIntegrityError as exc:
            # the configured lakehouse root holds something else: a setting to change
            raise CommandError(" ".join(str(exc).split())) from exc
        with service:
            report = service.warm_up_report()
    data = report.to_dict()
    data["program_cache"] = str(default_filestream_root())
    if args.json:
        emit(data, None, as_json=True)
        return EXIT_OK
    emit(None, _table(report, data["program_cache"]), as_json=False)
    return EXIT_OK


def _table(report: Any, cache_dir: str) -> Table:
    kernels = [k for d in report.devices for k in d.kernels]
    steps = sum(len(d.steps) for d in report.devices)
    devices = len(report.devices)
    footer = (
        f"warm-up: {report.seconds:.2f} s on {devices} device{'s' if devices != 1 else ''} "
        f"({report.backend} backend), {steps} steps"
    )
    if backend_kind(report.backend).cuda_kernels:
        counts = {o: sum(k.origin == o for k in kernels) for o in _ORIGIN_TEXT}
        footer += (
            f"; {len(kernels)} kernels newly loaded: {counts['program-cache']} from the program "
            f"cache, {counts['compiled']} compiled, {counts['cupy']} compiled by CuPy; "
            f"program cache: {cache_dir}"
        )
    else:
        footer += f"; the {report.backend} backend compiles nothing"
    table = Table(
        ["device", "kernel", "target", "from", "time"],
        title="GPU kernels made ready",
        right=["time"],
        footer=footer,
    )
    for k in kernels:
        origin = _ORIGIN_TEXT.get(k.origin, k.origin)
        if k.detail:
            origin += f" ({k.detail})"
        table.add(str(k.device_id), k.kernel, k.arch or "-", origin, f"{k.seconds * 1000:.1f} ms")
    return table
