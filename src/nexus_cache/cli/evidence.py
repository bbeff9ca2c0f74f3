"""``nexus-cache evidence verify DIR``: check the query service's sealed attempt evidence.

Every ``attempt-*.json`` must match its SHA-256 seal, and the attempt it
links to must be present and unchanged; every ``admission.tsv`` line must
have its document. Exit status 0 when all verify (warnings allowed: the
newest line without its document, which a killed service leaves), 1 when
any document was modified, renamed, removed, is too large or cannot be
read, or when ``admission.tsv`` was cut or lost lines; 2 when DIR is not a
directory or holds no evidence (no ``admission.tsv``, no document).
"""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.cli._output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    SIZE_HELP,
    NoCacheError,
    Table,
    add_json_option,
    emit,
    size_option,
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
            "unchanged; every admission.tsv line must have its document. Exit 0 when all "
            "verify (warnings allowed), 1 when any fails."
        ),
    )
    verify.add_argument("directory", metavar="DIR", help="the evidence directory")
    verify.add_argument(
        "--max-document-bytes",
        type=size_option("--max-document-bytes", allow_zero=False),
        default=None,
        metavar="SIZE",
        help="largest attempt document to read; a larger one is reported, not read "
        f"(default 16MiB); {SIZE_HELP}",
    )
    add_json_option(verify)
    verify.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from nexus_cache.service import verify_evidence

    if not args.directory.strip():  # Path("") is the working directory
        raise NoCacheError("DIR is empty; pass the service's evidence_dir")
    limit = (
        {} if args.max_document_bytes is None else {"max_document_bytes": args.max_document_bytes}
    )
    try:
        report = verify_evidence(args.directory, **limit)
    except (FileNotFoundError, NotADirectoryError) as exc:
        # nothing to verify at that location: a bad argument, not a failed check
        raise NoCacheError(f"{exc}; pass the service's evidence_dir") from exc
    footer = f"{len(report.verified)} verified, {len(report.problems)} failed"
    if report.warnings:
        footer += f", {len(report.warnings)} warnings"
    table = Table(["file", "problem"], footer=footer)
    for name, problem in report.problems:
        table.add(name, problem)
    for name, warning in report.warnings:
        table.add(name, f"warning: {warning}")
    emit(report.to_dict(), table, as_json=args.json)
    return EXIT_OK if report.ok else EXIT_PROBLEMS
