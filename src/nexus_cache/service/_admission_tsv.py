"""The admission TSV (``admission.tsv``): its columns, its writer and its reader.

:class:`AdmissionLog` appends one line per admission decision, with the
ledger's two cache fields (:data:`ADMISSION_COLUMNS`), with one ``write``
each so lines of concurrent services do not interleave; it publishes the
file with its header in one step, never appends through a symlink, and
recreates a log removed while the service runs. :func:`read_admissions`
reads the file back for :func:`~nexus_cache.service.evidence.verify_evidence`
(:class:`Admissions`: what each attempt's lines claim), line by line, each
line bounded by :data:`MAX_TSV_LINE_BYTES`, and records its defects;
:func:`open_regular` opens a file the verifier reads without blocking on a
FIFO. The log is thread-safe; the reader holds no state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from nexus_cache._storage import atomic_write, ensure_private_dir, write_all
from nexus_cache.errors import CacheSecurityError, EvidenceWriteError

__all__ = [
    "ADMISSION_COLUMNS",
    "ADMISSION_FILE",
    "ADMISSION_MEMORY_LINES",
    "MAX_TSV_LINE_BYTES",
    "AdmissionLog",
    "Admissions",
    "open_regular",
    "read_admissions",
]

ADMISSION_FILE = "admission.tsv"
#: the longest ``admission.tsv`` line :func:`read_admissions` reads (a service
#: writes about 300 bytes)
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


@contextlib.contextmanager
def open_regular(path: Path) -> Iterator[tuple[BinaryIO, int]]:
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


@dataclasses.dataclass
class Admissions:
    """What ``admission.tsv`` says: per attempt its (device, requested bytes) claims,
    the attempts that must have a document (with their line), and the last line."""

    claims: dict[str, set[tuple[str, str]]]
    needs_document: dict[str, int]
    last_line: int


def read_admissions(
    root: Path, problems: list[tuple[str, str]], *, expect: bool
) -> Admissions | None:
    """Read ``admission.tsv`` line by line; records its defects in ``problems``.

    ``None`` when there is no readable TSV to compare documents with.
    """
    path = root / ADMISSION_FILE
    try:
        with open_regular(path) as (f, _size):
            return _parse_admissions(f, problems)
    except FileNotFoundError:
        if expect:
            problems.append((ADMISSION_FILE, "missing, but attempt documents exist"))
        return None
    except OSError as exc:
        problems.append((ADMISSION_FILE, f"unreadable: {exc}"))
        return None


def _parse_admissions(f: BinaryIO, problems: list[tuple[str, str]]) -> Admissions | None:
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
    return Admissions(seen, needs, last)


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
