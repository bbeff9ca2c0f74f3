"""What a person recognises in a persistent program cache, and what a path holds.

:func:`describe_entries` lists the entries of a :class:`FileStreamProgramCache`
or :class:`SQLiteProgramCache` with the program's name and symbols (from the
metadata sidecar written by :func:`cached_compile`), the code type and the
target architecture (read from the binary itself: the ELF header of a cubin,
the ``.target`` line of PTX), the size and the last access. Sidecars are
matched to binaries by the binary's SHA-256, which the sidecar records.

(:func:`identify_cache_path`, which says what a path holds, lives in
:mod:`nexus_cache.program._identify` and is re-exported here.)

It only reads: no entry is stamped, counted, moved or removed, so listing a
cache never changes its eviction order. Safe to call while other threads and
processes use the cache (an entry replaced meanwhile is listed as found).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nexus_cache.program._identify import CACHE_KINDS, identify_cache_path
from nexus_cache.program._integrity import entry_relpath, open_entry
from nexus_cache.program._sidecar import SIDECAR_SUFFIX
from nexus_cache.program._sqlite import SQLiteProgramCache
from nexus_cache.program.filestream import FileStreamProgramCache

__all__ = ["CACHE_KINDS", "ProgramEntry", "describe_entries", "identify_cache_path"]

_META_FORMAT = "nexus-cache/program-meta"
_PTX_TARGET_RE = re.compile(rb"^\s*\.target\s+([A-Za-z0-9_]+)", re.MULTILINE)
_EM_CUDA = 190
_META_LIMIT = 1 << 20  # a sidecar is a small JSON document; larger entries are binaries


@dataclass(frozen=True)
class ProgramEntry:
    """One stored binary as a person would describe it.

    ``name`` is the on-disk entry name (64 hex digits from the key for
    FileStream, the key's hex for SQLite); ``program`` and ``symbols`` come from the
    sidecar and are ``None``/empty when the entry has none (for example a
    binary stored through ``Program.compile(cache=)``); ``code_type`` is
    ``cubin``, ``ptx``, ``ltoir`` or ``None`` when unknown; ``target`` is the
    architecture read from the binary (``sm_90``) or ``None``.
    """

    name: str
    size: int
    atime_ns: int
    program: str | None
    code_type: str | None
    target: str | None
    symbols: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "atime_ns": self.atime_ns,
            "program": self.program,
            "code_type": self.code_type,
            "target": self.target,
            "symbols": list(self.symbols),
        }


def _target_of(data: bytes) -> tuple[str | None, str | None]:
    """``(code_type, arch)`` read from the binary itself."""
    if data[:4] == b"\x7fELF" and len(data) >= 52:
        machine = struct.unpack_from("<H", data, 18)[0]
        if machine != _EM_CUDA:
            return None, None
        flags = struct.unpack_from("<I", data, 48)[0]
        # ELF ABI version 8 and later put the SM number in bits 8-15; older
        # ones in bits 0-7.
        sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
        return "cubin", f"sm_{sm}" if sm else None
    match = _PTX_TARGET_RE.search(data[:65536])
    if match is not None:
        return "ptx", match.group(1).decode("ascii")
    return None, None


def _meta(data: bytes) -> dict[str, Any] | None:
    if len(data) > _META_LIMIT or not data.startswith(b"{"):
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # deep nesting: not a sidecar
        return None
    if not isinstance(doc, dict) or doc.get("format") != _META_FORMAT:
        return None
    return doc


def _symbols(doc: dict[str, Any]) -> tuple[str, ...]:
    out = []
    for pair in doc.get("symbols") or ():
        try:
            out.append(str(pair[0][1]))
        except (IndexError, TypeError):
            continue
    return tuple(out)


def _read_regular(path: str) -> bytes | None:
    # open_entry: O_NOATIME (a plain read lets relatime stamp an entry never
    # read since its write, i.e. move it in the LRU order) and O_NONBLOCK (a
    # FIFO swapped in after the scan must not hang the listing).
    try:
        fd = open_entry(path)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _filestream_items(cache: FileStreamProgramCache) -> Iterator[tuple[str, int, int, bytes]]:
    entries = cache.path / "entries"
    for info in cache.iter_entries():
        data = _read_regular(str(entries / entry_relpath(info.name)))
        if data is not None:
            yield info.name, info.size, info.atime_ns, data


def _sqlite_items(cache: SQLiteProgramCache) -> Iterator[tuple[str, int, int, bytes]]:
    # A read-only connection of our own: reading through the cache object
    # would count hits and move entries in the LRU order.
    uri = f"{cache.path.resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = conn.execute(
            "SELECT key, size, last_access, value FROM entries ORDER BY last_access, key"
        )
        for key, size, ts, value in rows:
            yield bytes(key).hex(), int(size), int(ts), bytes(value)
    finally:
        conn.close()


def describe_entries(
    cache: FileStreamProgramCache | SQLiteProgramCache,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[ProgramEntry]:
    """Every binary of ``cache``, least recently used first, with its sidecar's names.

    Sidecar documents themselves are not listed. ``progress(1)`` is called
    once per stored item read (binaries and sidecars), for progress bars.
    """
    if isinstance(cache, FileStreamProgramCache):
        items: Iterator[tuple[str, int, int, bytes]] = _filestream_items(cache)
    elif isinstance(cache, SQLiteProgramCache):
        items = _sqlite_items(cache)
    else:
        raise TypeError(f"describe_entries needs a persistent program cache, got {cache!r}")
    # Keep only digests and targets of the binaries, not their bytes: a cache
    # of many gigabytes lists in constant memory per entry.
    binaries: list[tuple[str, int, int, str, str | None, str | None]] = []
    metas: dict[str, dict[str, Any]] = {}
    for name, nbytes, atime_ns, data in items:
        if progress is not None:
            progress(1)
        doc = _meta(data)
        if doc is not None and isinstance(doc.get("binary_sha256"), str):
            metas[doc["binary_sha256"]] = doc
            continue
        if name.endswith(SIDECAR_SUFFIX.hex()):  # SQLite: the key itself says sidecar
            continue
        code_type, target = _target_of(data)
        digest = hashlib.sha256(data).hexdigest()
        binaries.append((name, nbytes, atime_ns, digest, code_type, target))
    out = []
    for name, nbytes, atime_ns, digest, code_type, target in binaries:
        doc = metas.get(digest)
        program = None
        symbols: tuple[str, ...] = ()
        if doc is not None:
            program = doc.get("name") if isinstance(doc.get("name"), str) else None
            code_type = doc.get("target_type") or code_type
            symbols = _symbols(doc)
        out.append(ProgramEntry(name, nbytes, atime_ns, program, code_type, target, symbols))
    return out
