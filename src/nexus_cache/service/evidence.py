"""Sealed attempt evidence and the admission TSV.

**Attempt evidence**: one JSON document per attempt (the plan, the lakehouse,
source and graph cache statuses, a ledger snapshot, timings and a result
fingerprint). It is *sealed*: ``seal.digest`` is the SHA-256 of the
document's canonical JSON (sorted keys, no spaces, ASCII) without the seal.
Every document also names the digest of the attempt sealed before it by the
same service (``previous_digest``), so the documents of one service form a
chain: changing, removing or resealing one document breaks either its own
seal or the next document's link. :func:`verify_evidence` checks both.

The seal detects modification; it does not prove who wrote a document (anyone
who can write the directory could rewrite a whole chain). Keep the directory
where only the service writes.

**Admission TSV** (``admission.tsv``): one line per admission decision, with
the ledger's two cache fields, appended with one ``write`` each so lines of
concurrent services do not interleave (:class:`AdmissionLog`, its columns and
its reader are in :mod:`._admission_tsv`; exported here). :func:`verify_evidence`
checks the documents and the TSV against each other.

Writers are thread-safe; documents are published atomically (temp, fsync,
rename), so a crash leaves whole documents or none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nexus_cache._storage import atomic_write, ensure_private_dir
from nexus_cache.service._admission_tsv import (
    ADMISSION_COLUMNS,
    ADMISSION_FILE,
    MAX_TSV_LINE_BYTES,
    AdmissionLog,
    Admissions,
    open_regular,
    read_admissions,
)
from nexus_cache.service.fingerprint import table_fingerprint

__all__ = [
    "ADMISSION_COLUMNS",
    "EVIDENCE_FORMAT",
    "MAX_DOCUMENT_BYTES",
    "MAX_TSV_LINE_BYTES",
    "AdmissionLog",
    "EvidenceReport",
    "EvidenceWriter",
    "canonical_json",
    "seal_digest",
    "table_fingerprint",
    "verify_evidence",
]

EVIDENCE_FORMAT = "nexus-cache.attempt-evidence/1"
#: the largest attempt document :func:`verify_evidence` reads (a service writes
#: a few KiB); a larger one is reported, not read, so memory stays bounded
MAX_DOCUMENT_BYTES = 16 << 20


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """The one byte form a document is sealed in (sorted keys, compact, ASCII)."""
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def seal_digest(doc: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of ``doc`` without its ``seal`` field."""
    body = {k: v for k, v in doc.items() if k != "seal"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


class EvidenceWriter:
    """Seals and publishes one JSON document per attempt under ``directory``.

    ``directory=None`` seals documents without writing them. Thread-safe: the
    chain link and the publication happen under one lock.
    """

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._dir = None if directory is None else ensure_private_dir(directory)
        self._lock = threading.Lock()
        self._previous: str | None = None

    @property
    def directory(self) -> Path | None:
        return self._dir

    def digest(self, make: Callable[[], Mapping[str, Any]]) -> str | Callable[[], str]:
        """The seal's digest of the document ``make()`` returns: made, sealed and
        published now (:meth:`seal`) where documents are written; where they are
        not, a function that makes the document and seals it alone (not chained:
        nothing records the chain) when first called, so an attempt whose digest
        nobody reads neither builds nor serialises its document. ``make`` must then
        read only what no longer changes."""
        if self._dir is not None:
            return str(self.seal(make())["seal"]["digest"])
        return lambda: seal_digest({**make(), "format": EVIDENCE_FORMAT, "previous_digest": None})

    def seal(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Link ``doc`` to the previous attempt, seal it, publish it; returns it sealed."""
        with self._lock:
            body = {**doc, "format": EVIDENCE_FORMAT, "previous_digest": self._previous}
            digest = seal_digest(body)
            sealed = {**body, "seal": {"algorithm": "sha256", "digest": digest}}
            if self._dir is not None:
                name = f"attempt-{_safe(str(doc['attempt_id']))}.json"
                data = json.dumps(sealed, sort_keys=True, indent=1, allow_nan=False).encode()
                atomic_write(self._dir / name, data + b"\n", tmp_dir=self._dir)
            self._previous = digest
            return sealed


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


@dataclasses.dataclass(frozen=True)
class EvidenceReport:
    """What :func:`verify_evidence` found; ``ok`` when every document verified.

    ``warnings`` are findings that a crash explains as well as tampering (the
    newest TSV line without its document); they do not make ``ok`` false.

    Parameters
    ----------
    verified : tuple of str
        The documents whose seal and chain link verified.
    problems : tuple of (str, str)
        ``(file, problem)`` for each finding.
    warnings : tuple of (str, str), optional
        ``(file, warning)`` for each finding a crash explains.

    Examples
    --------
    >>> from nexus_cache.service import EvidenceReport
    >>> report = EvidenceReport(verified=("attempt-q1-1.json",), problems=())
    >>> report.ok, report.to_dict()["verified"]
    (True, ['attempt-q1-1.json'])
    """

    verified: tuple[str, ...]
    problems: tuple[tuple[str, str], ...]
    warnings: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": list(self.verified),
            "problems": [{"file": f, "problem": p} for f, p in self.problems],
            "warnings": [{"file": f, "warning": w} for f, w in self.warnings],
        }


def verify_evidence(
    directory: str | os.PathLike[str],
    *,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
) -> EvidenceReport:
    """Check every ``attempt-*.json`` under ``directory``: its seal and its chain link.

    A document fails when it is not valid JSON, lacks a seal, its digest does
    not match its content, its file name is not the one its ``attempt_id``
    gives (a renamed or swapped document), its ``previous_digest`` names no
    document in the directory, or another document names the same
    predecessor (a chain has no forks). ``admission.tsv`` fails when it is
    missing while documents exist, when a line is cut or has the wrong number
    of fields, and when a document's attempt has no line in it (lines removed)
    or only lines whose device or requested bytes disagree with the document.
    Every TSV line is checked the other way as well: a line whose attempt has
    no document (documents deleted) is a problem, except for the newest line,
    which a service killed between admitting an attempt and sealing it leaves
    behind: a warning. Lines of ``closed`` admissions (a service shutting
    down) have no document by design. A document larger than
    ``max_document_bytes`` (default :data:`MAX_DOCUMENT_BYTES`) is a problem
    and is not read; ``admission.tsv`` is read line by line, each line bounded
    by :data:`MAX_TSV_LINE_BYTES`, so memory stays bounded whatever the
    directory holds. Reads only; never raises for a bad document. Raises ``FileNotFoundError``
    or ``NotADirectoryError`` when ``directory`` is not a directory, and
    ``FileNotFoundError`` when it holds no evidence at all (neither
    ``admission.tsv``, which a service writes as it starts, nor a document).

    Parameters
    ----------
    directory : str or os.PathLike
        A service's ``evidence_dir``.
    max_document_bytes : int, optional
        The largest document read.

    Returns
    -------
    EvidenceReport
        The verified documents, the problems and the warnings.

    Raises
    ------
    FileNotFoundError
        ``directory`` does not exist or holds no evidence.
    NotADirectoryError
        ``directory`` is not a directory.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> from nexus_cache.service import QueryService, Scan, ServiceConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> edges = pa.table({"src": [1, 2, 3, 3], "dst": [2, 3, 1, 4]})
    >>> pq.write_table(edges, root / "edges.parquet")
    >>> config = ServiceConfig(
    ...     backend="host",
    ...     lakehouse=LakehouseCacheConfig(root=root / "cache"),
    ...     evidence_dir=root / "evidence",
    ... )
    >>> from nexus_cache.service import verify_evidence
    >>> with QueryService(config) as service:
    ...     _ = service.execute(Scan(str(root / "edges.parquet")))
    >>> report = verify_evidence(root / "evidence")
    >>> report.ok, len(report.verified)
    (True, 1)
    >>> tmp.cleanup()
    """
    root = Path(directory)
    if not root.exists():
        raise FileNotFoundError(f"evidence directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"evidence path {str(root)!r} is not a directory")
    if not (root / ADMISSION_FILE).exists() and next(root.glob("attempt-*.json"), None) is None:
        # A service writes admission.tsv as it starts: a directory without it
        # and without documents is not evidence (a wrong path, or all of it
        # removed), and must not verify as "0 failed".
        raise FileNotFoundError(
            f"evidence directory {str(root)!r} holds no evidence (no {ADMISSION_FILE}, "
            "no attempt-*.json)"
        )
    verified: list[str] = []
    problems: list[tuple[str, str]] = []
    digests: dict[str, str] = {}
    links: dict[str, str | None] = {}
    attempts: dict[str, str] = {}
    claims: dict[str, tuple[str, str]] = {}  # what the TSV line must say: device, bytes
    for path in sorted(root.glob("attempt-*.json")):
        name = path.name
        try:
            doc = json.loads(_read_file(path, max_document_bytes))
        except _TooLarge as exc:
            problems.append((name, str(exc)))
            continue
        except (OSError, ValueError, RecursionError) as exc:  # Recursion: deep nesting
            problems.append((name, f"unreadable: {exc}"))
            continue
        seal = doc.get("seal") if isinstance(doc, dict) else None
        if not isinstance(seal, dict) or seal.get("algorithm") != "sha256":
            problems.append((name, "no sha256 seal"))
            continue
        try:
            actual = seal_digest(doc)
        except ValueError as exc:
            problems.append((name, f"cannot be canonicalized: {exc}"))
            continue
        if actual != seal.get("digest"):
            problems.append((name, f"seal mismatch: content digest {actual[:16]}... != sealed"))
            continue
        expected = f"attempt-{_safe(str(doc.get('attempt_id')))}.json"
        if name != expected:
            problems.append((name, f"renamed: its attempt_id gives the file name {expected}"))
            continue
        previous = doc.get("previous_digest")
        if previous is not None and not isinstance(previous, str):
            # sealed by someone else: a list here would not even be a dict key
            problems.append((name, f"malformed previous_digest {previous!r:.40}"))
            continue
        digests[actual] = name
        links[name] = previous
        attempts[name] = str(doc.get("attempt_id"))
        plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else {}
        claims[name] = (str(doc.get("device_id")), str(plan.get("grant_bytes")))
    successors: dict[str, list[str]] = {}
    for name, previous in links.items():
        if previous is not None:
            successors.setdefault(previous, []).append(name)
    tsv = read_admissions(root, problems, expect=bool(links))
    logged = None if tsv is None else tsv.claims
    for name, previous in links.items():
        if previous is not None and previous not in digests:
            problems.append(
                (name, "chain broken: the previous attempt's evidence is missing or was changed")
            )
        elif previous is not None and len(successors[previous]) > 1:
            others = ", ".join(n for n in successors[previous] if n != name)
            problems.append((name, f"chain fork: {others} links to the same previous attempt"))
        elif logged is not None and attempts[name] not in logged:
            problems.append((name, f"no line in {ADMISSION_FILE} for its attempt"))
        elif logged is not None and claims[name] not in logged[attempts[name]]:
            device, nbytes = claims[name]
            problems.append(
                (
                    name,
                    f"its {ADMISSION_FILE} line disagrees (the document says device {device}, "
                    f"{nbytes} bytes requested)",
                )
            )
        else:
            verified.append(name)
    warnings: list[tuple[str, str]] = []
    if tsv is not None:
        _documents_of_lines(root, tsv, set(attempts.values()), problems, warnings)
    return EvidenceReport(
        tuple(sorted(verified)), tuple(sorted(problems)), tuple(sorted(warnings))
    )


def _documents_of_lines(
    root: Path,
    tsv: Admissions,
    documented: set[str],
    problems: list[tuple[str, str]],
    warnings: list[tuple[str, str]],
) -> None:
    """Record every TSV line whose attempt has no document (deleted documents)."""
    for attempt, number in tsv.needs_document.items():
        if attempt in documented:
            continue
        name = f"attempt-{_safe(attempt)}.json"
        if (root / name).exists() or os.path.islink(root / name):
            continue  # there, but it failed its own checks: reported already
        if number == tsv.last_line:
            warnings.append(
                (
                    name,
                    f"missing: the newest {ADMISSION_FILE} line ({number}) logs this attempt; "
                    "a service killed before sealing it leaves this, so does a deletion",
                )
            )
        else:
            problems.append(
                (
                    name,
                    f"missing: {ADMISSION_FILE} line {number} logs this attempt, but its "
                    "document is gone",
                )
            )


class _TooLarge(Exception):
    """A document over the size limit; its message is the problem to report."""


def _read_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; reads no more than that."""
    with open_regular(path) as (f, size):
        # size first (nothing read), then a bounded read: the file may grow between
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise _TooLarge(
            f"too large: {max(size, len(data))} bytes, over the limit of {limit} bytes "
            "per document (max_document_bytes); not read"
        )
    return data
