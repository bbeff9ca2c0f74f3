"""``nexus-cache evidence verify DIR``: check the query service's sealed attempt evidence.

Every ``attempt-*.json`` must match its SHA-256 seal, and the attempt it
links to must be present and unchanged. Exit status 0 when all verify, 1 when
any document was modified, renamed, removed from the chain or cannot be read,
or when ``admission.tsv`` was cut or lost lines; 2 when DIR is not a directory
or holds no evidence (no ``admission.tsv``, no document).
"""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.cli._output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    NoCacheError,
    Table,
    add_json_option,
    emit,
)

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evidence",
        help="verify the query service's sealed attempt evidence",
        description="Work with the sealed attempt evidence the query service writes.",
    )
    sub = parser.add_subparsers(dest="evidence_command", metavar="SUBCOMMAND")
    sub.required = True
    verify = sub.add_parser(
        "verify",
        help="check every attempt document's seal and chain link; exit 1 on tampering",
        description=(
            "Check every attempt-*.json in DIR (NEXUS_SERVICE_EVIDENCE_DIR): its content must "
            "match its SHA-256 seal, and the attempt it links to must be present and "
            "unchanged. Exit 0 when all verify, 1 when any fails."
        ),
    )
    verify.add_argument("directory", metavar="DIR", help="the evidence directory")
    add_json_option(verify)
    verify.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from nexus_cache.service import verify_evidence

    if not args.directory.strip():  # Path("") is the working directory
        raise NoCacheError("DIR is empty; pass the service's evidence_dir")
    try:
        report = verify_evidence(args.directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        # nothing to verify at that location: a bad argument, not a failed check
        raise NoCacheError(f"{exc}; pass the service's evidence_dir") from exc
    table = Table(
        ["file", "problem"],
        footer=f"{len(report.verified)} verified, {len(report.problems)} failed",
    )
    for name, problem in report.problems:
        table.add(name, problem)
    emit(report.to_dict(), table, as_json=args.json)
    return EXIT_OK if report.ok else EXIT_PROBLEMS
