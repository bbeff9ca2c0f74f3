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
concurrent services do not interleave.

Writers are thread-safe; documents are published atomically (temp, fsync,
rename), so a crash leaves whole documents or none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from nexus_cache._storage import atomic_write, ensure_private_dir, write_all
from nexus_cache.errors import CacheSecurityError, EvidenceWriteError
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
ADMISSION_FILE = "admission.tsv"
#: the largest attempt document :func:`verify_evidence` reads (a service writes
#: a few KiB); a larger one is reported, not read, so memory stays bounded
MAX_DOCUMENT_BYTES = 16 << 20
#: the longest ``admission.tsv`` line it reads (a service writes about 300 bytes)
MAX_TSV_LINE_BYTES = 64 << 10
ADMISSION_COLUMNS = (
    "time_utc",
    "query_id",
    "attempt_id",
    "device_id",
    "decision",
    "requested_bytes",
    "waited_s",
    "grant_bytes",
    "grant_count",
    "managed_capacity_bytes",
    "cache_charged_bytes",
    "free_managed_bytes",
    "cache_evictable_resident_bytes",
    "cache_pinned_in_use_bytes",
    "reason",
)


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
    tsv = _admission_attempts(root, problems, expect=bool(links))
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
    tsv: _Admissions,
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


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """The open file and its size; ``OSError`` for anything but a regular file.

    A FIFO named like a document would block a plain open or read forever,
    and the verifier must finish whatever the directory holds.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            yield f, st.st_size
    finally:
        os.close(fd)


def _read_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; reads no more than that."""
    with _open_regular(path) as (f, size):
        # size first (nothing read), then a bounded read: the file may grow between
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise _TooLarge(
            f"too large: {max(size, len(data))} bytes, over the limit of {limit} bytes "
            "per document (max_document_bytes); not read"
        )
    return data


@dataclasses.dataclass
class _Admissions:
    """What ``admission.tsv`` says: per attempt its (device, requested bytes) claims,
    the attempts that must have a document (with their line), and the last line."""

    claims: dict[str, set[tuple[str, str]]]
    needs_document: dict[str, int]
    last_line: int


def _admission_attempts(
    root: Path, problems: list[tuple[str, str]], *, expect: bool
) -> _Admissions | None:
    """Read ``admission.tsv`` line by line; records its defects in ``problems``.

    ``None`` when there is no readable TSV to compare documents with.
    """
    path = root / ADMISSION_FILE
    try:
        with _open_regular(path) as (f, _size):
            return _parse_admissions(f, problems)
    except FileNotFoundError:
        if expect:
            problems.append((ADMISSION_FILE, "missing, but attempt documents exist"))
        return None
    except OSError as exc:
        problems.append((ADMISSION_FILE, f"unreadable: {exc}"))
        return None


def _parse_admissions(f: BinaryIO, problems: list[tuple[str, str]]) -> _Admissions | None:
    width = len(ADMISSION_COLUMNS)
    column = ADMISSION_COLUMNS.index("attempt_id")
    device = ADMISSION_COLUMNS.index("device_id")
    requested = ADMISSION_COLUMNS.index("requested_bytes")
    decision = ADMISSION_COLUMNS.index("decision")
    seen: dict[str, set[tuple[str, str]]] = {}
    needs: dict[str, int] = {}
    number = last = 0
    while True:
        raw = f.readline(MAX_TSV_LINE_BYTES + 1)
        if not raw:
            break
        number += 1
        if len(raw) > MAX_TSV_LINE_BYTES:
            while raw and not raw.endswith(b"\n"):  # skip the rest, bounded reads
                raw = f.readline(MAX_TSV_LINE_BYTES)
            problems.append(
                (ADMISSION_FILE, f"line {number} is longer than {MAX_TSV_LINE_BYTES} bytes")
            )
            continue
        if not raw.endswith(b"\n"):
            problems.append((ADMISSION_FILE, "the last line is cut (no line end)"))
            break
        try:
            line = raw[:-1].decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append((ADMISSION_FILE, f"unreadable: line {number}: {exc}"))
            return None
        fields = line.split("\t")
        if number == 1:
            if fields == list(ADMISSION_COLUMNS):
                continue
            problems.append((ADMISSION_FILE, "the header line is missing or changed"))
            if not line[:4].isdigit():  # a changed header; else it was deleted: data
                continue
        if len(fields) != width:
            problems.append(
                (ADMISSION_FILE, f"line {number} has {len(fields)} fields, not {width}")
            )
            continue
        attempt = fields[column]
        seen.setdefault(attempt, set()).add((fields[device], fields[requested]))
        last = number
        if fields[decision] != "closed":  # a shutting-down service seals nothing
            needs.setdefault(attempt, number)
    if number == 0:
        problems.append((ADMISSION_FILE, "the header line is missing or changed"))
    return _Admissions(seen, needs, last)


#: admission decisions an :class:`AdmissionLog` keeps in memory (the newest)
ADMISSION_MEMORY_LINES = 10_000


class AdmissionLog:
    """Appends one TSV line per admission decision to ``directory/admission.tsv``.

    ``lines`` holds the newest :data:`ADMISSION_MEMORY_LINES` decisions in
    memory (all of them stay in the file), so a service that runs for months
    does not grow. ``directory=None`` writes no file. Thread-safe.
    A log removed while the service runs (rotated away, deleted) is recreated
    with its header at the next decision. :meth:`record` never follows a
    symlink (:class:`CacheSecurityError`) and raises :class:`EvidenceWriteError`
    naming the path when the line cannot be written (disk full, a directory or
    FIFO in its place); the line is then not in ``lines`` either.
    """

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._path = None if directory is None else ensure_private_dir(directory) / ADMISSION_FILE
        self._lock = threading.Lock()
        self.lines: list[dict[str, Any]] = []
        if self._path is not None:
            _publish_header(self._path)

    @property
    def path(self) -> Path | None:
        return self._path

    def record(self, row: Mapping[str, Any]) -> None:
        values = {**row, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path = self._path
        line = None  # formatted only where it is written
        if path is not None:
            line = "\t".join(_cell(values.get(c)) for c in ADMISSION_COLUMNS) + "\n"
        with self._lock:
            if path is not None and line is not None:
                _append(path, line.encode())
            self.lines.append(values)
            if len(self.lines) > ADMISSION_MEMORY_LINES:
                # a memmove of the list's pointers: microseconds per decision
                del self.lines[: len(self.lines) - ADMISSION_MEMORY_LINES]


def _publish_header(path: Path) -> None:
    """Publish ``path`` with its header in one step (hard link of a complete temp;
    a no-op when it exists): creating it empty and writing the header after
    would let another service's line land first."""
    header = ("\t".join(ADMISSION_COLUMNS) + "\n").encode()
    atomic_write(path, header, tmp_dir=path.parent, replace=False)


# O_NOFOLLOW: a symlink planted in the log's place must not redirect the
# appends; O_NONBLOCK: opening a FIFO for writing would block until a reader
# came (it fails with ENXIO instead).
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` to the admission log at ``path``, recreating a removed log."""
    try:
        try:
            fd = os.open(path, _APPEND_FLAGS)
        except FileNotFoundError:  # rotated away or deleted: recreate it, as a start does
            ensure_private_dir(path.parent)
            _publish_header(path)
            fd = os.open(path, _APPEND_FLAGS)
    except CacheSecurityError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheSecurityError(
                f"admission log {str(path)!r} is a symlink; nexus-cache never appends through "
                "one: remove it (the service recreates the log) or use another "
                "NEXUS_SERVICE_EVIDENCE_DIR"
            ) from exc
        raise _write_error(path, exc) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EvidenceWriteError(
                f"admission log {str(path)!r} is not a regular file; remove what is there "
                "(the service recreates the log) or use another NEXUS_SERVICE_EVIDENCE_DIR"
            )
        write_all(fd, data)
    except OSError as exc:
        if isinstance(exc, EvidenceWriteError):
            raise
        raise _write_error(path, exc) from exc
    finally:
        os.close(fd)


def _write_error(path: Path, exc: OSError) -> EvidenceWriteError:
    """One line naming the path; ``errno`` kept for callers that test it."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "the disk is full" if exc.errno == errno.ENOSPC else "the disk quota is exhausted"
        error = EvidenceWriteError(
            f"admission log {str(path)!r} cannot be written: {what}; free space there or "
            "use another NEXUS_SERVICE_EVIDENCE_DIR"
        )
    else:
        reason = exc.strerror or str(exc)
        error = EvidenceWriteError(
            f"admission log {str(path)!r} cannot be written ({reason}); fix the path or use "
            "another NEXUS_SERVICE_EVIDENCE_DIR"
        )
    error.errno = exc.errno
    return error


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value).replace("\t", " ").replace("\n", " ")
