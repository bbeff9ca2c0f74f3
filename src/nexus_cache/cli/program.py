"""``nexus-cache program-cache``: inspect and maintain a persistent program cache.

Every action opens an existing cache only (it never creates one) and exits
2 when the location holds none, naming what it found instead: a SQLite file
without ``--backend sqlite``, cuda.core's own cache directory, an empty or
unrelated directory.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from nexus_cache.cli._output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    SIZE_HELP,
    CommandError,
    NoCacheError,
    Table,
    add_json_option,
    age,
    count_option,
    emit,
    progress,
    size,
    size_option,
    utc,
)

__all__ = ["register"]

_ARCH_RE = re.compile(r"(sm|compute)_[0-9]+[af]?\Z")


def parse_arch(text: str) -> str:
    """argparse type for ``--arch``: ``sm_90``, ``sm_90a``, ``compute_80`` ..."""
    if not _ARCH_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"--arch {text!r} is not a CUDA architecture; use e.g. sm_80, sm_90, sm_90a, sm_100"
        )
    return text


def _location(args: argparse.Namespace) -> Path:
    from nexus_cache.program import default_filestream_root, default_sqlite_path

    if args.path is not None:
        if not args.path.strip():
            # "--path $UNSET" must not fall back to the default cache (a clear
            # would empty it): an explicit empty path is a usage error.
            raise CommandError("--path is empty; give a cache location, or leave --path out")
        return Path(args.path).expanduser().absolute()
    return default_filestream_root() if args.backend == "filestream" else default_sqlite_path()


def _check_kind(path: Path, backend: str) -> None:
    """Refuse, with the right advice, any location that is not a ``backend`` cache."""
    from nexus_cache.program import identify_cache_path

    kind = identify_cache_path(path)
    if kind == "symlink":
        return  # opening it raises CacheSecurityError, which says why
    if kind == "missing":
        raise NoCacheError(f"no {backend} program cache at {path} (nothing there)")
    if kind == "cuda-core-filestream":
        raise CommandError(
            f"{path} is cuda.core's own FileStreamProgramCache directory, not a nexus-cache "
            "one; nexus-cache does not manage it (use cuda.core's API, or point --path at a "
            "nexus-cache directory)"
        )
    if kind == "lakehouse":
        raise CommandError(
            f"{path} is a lakehouse cache root, not a program cache; use "
            "nexus-cache lakehouse ... --root for it, or point --path elsewhere"
        )
    if backend == "filestream":
        if kind == "sqlite":
            raise CommandError(
                f"{path} is a SQLite database file, not a filestream program cache; "
                "if it is a SQLite program cache, add --backend sqlite"
            )
        if kind == "empty-dir":
            raise NoCacheError(f"no filestream program cache at {path} (empty directory)")
        if kind == "other":
            raise CommandError(
                f"{path} is not a filestream program cache (no entries/ directory); check --path"
            )
    elif kind != "sqlite":
        hint = "; add --backend filestream" if kind == "filestream" else ""
        raise CommandError(f"{path} is not a SQLite program cache{hint}")


def _open(args: argparse.Namespace) -> Any:
    """The cache at the chosen location; raises :class:`NoCacheError` when there is none."""
    path = _location(args)
    _check_kind(path, args.backend)
    if args.backend == "filestream":
        from nexus_cache.program import FileStreamProgramCache

        return FileStreamProgramCache(path)
    from nexus_cache.program import SQLiteProgramCache

    return SQLiteProgramCache(path)


def _info(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        s = cache.stats()
        data: dict[str, Any] = {
            "backend": args.backend,
            "path": str(cache.path),
            "entries": s.entries,
            "bytes": s.bytes,
        }
        if args.backend == "filestream":
            data["integrity_records"] = cache.record_carrier
            tmp = cache.path / "tmp"
            data["writes_in_flight"] = len(os.listdir(tmp)) if tmp.is_dir() else 0
    table = Table(["field", "value"], title="program cache")
    table.add("backend", data["backend"])
    table.add("path", data["path"])
    table.add("entries", data["entries"])
    table.add("size", size(data["bytes"]))
    if "integrity_records" in data:
        where = {
            "mtime": "mtime (nanoseconds field)",
            "xattr": "extended attribute",
            "sidecar": "sidecar .sum files",
        }
        table.add("integrity records", where[data["integrity_records"]])
        table.add("writes in flight (tmp/)", data["writes_in_flight"])
    emit(data, table, as_json=args.json)
    return EXIT_OK


def _ls(args: argparse.Namespace) -> int:
    from nexus_cache.program import describe_entries

    with _open(args) as cache, progress("reading entries", cache.stats().entries) as advance:
        entries = describe_entries(cache, progress=advance)
    found = len(entries)
    if args.limit is not None:
        entries = entries[: args.limit]
    rows = [{**e.to_dict(), "last_access": utc(e.atime_ns)} for e in entries]
    table = Table(
        ["PROGRAM", "TYPE", "TARGET", "SIZE", "LAST USE (UTC)", "AGE", "ENTRY"],
        title="least recently used first",
        right=("SIZE", "AGE"),
        whole=("TARGET", "SIZE", "LAST USE (UTC)", "AGE"),
    )
    for e in entries:
        program = e.program or (e.symbols[0] if e.symbols else "(no name recorded)")
        if e.symbols and e.program:
            program = f"{e.program}: {', '.join(e.symbols)}"
        table.add(
            program,
            e.code_type or "?",
            e.target or "?",
            size(e.size),
            utc(e.atime_ns),
            age(e.atime_ns),
            e.name[:12],
        )
    shown = f"{len(entries)} of {found}" if len(entries) < found else str(found)
    table.footer = f"programs: {shown}"
    emit(rows, table, as_json=args.json)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    with _open(args) as cache, progress("verifying entries", cache.stats().entries) as advance:
        r = cache.verify(progress=advance)
    data = {
        "checked": r.checked,
        "ok": r.ok,
        "corrupt_removed": list(r.corrupt),
        "refused": [{"path": p, "why": why} for p, why in r.refused],
        "unverified": list(r.unverified),
        "outdated_removed": list(r.outdated),
    }
    table = Table(["PROBLEM", "ACTION", "ENTRY"], title="entries with problems")
    for name in r.corrupt:
        table.add("corrupt", "removed", name)
    for path, why in r.refused:
        table.add(f"refused ({why})", "left in place", path)
    for name in r.unverified:
        table.add("no integrity record", "reads as a miss", name)
    for name in r.outdated:
        table.add("written by an earlier version", "removed", name)
    table.footer = (
        f"checked {r.checked}: {r.ok} ok, {len(r.corrupt)} corrupt (removed), "
        f"{len(r.refused)} refused, {len(r.unverified)} unverified, "
        f"{len(r.outdated)} outdated (removed)"
    )
    emit(data, table, as_json=args.json)
    return EXIT_PROBLEMS if r.corrupt or r.refused else EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        with progress("pruning", None):
            n, freed = cache.prune(args.max_bytes)
        left = cache.stats().bytes
    data = {"removed": n, "freed_bytes": freed, "remaining_bytes": left}
    _say(args, data, f"removed {n} entries ({size(freed)}); {size(left)} remain")
    return EXIT_OK


def _clear(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        before = cache.stats()
        cache.clear()
        after = cache.stats()
    removed, freed = before.entries - after.entries, before.bytes - after.bytes
    data = {"removed": removed, "freed_bytes": freed, "remaining_entries": after.entries}
    _say(args, data, f"removed {removed} entries ({size(freed)})")
    return EXIT_OK


def _say(args: argparse.Namespace, data: dict[str, Any], line: str) -> None:
    if args.json:
        emit(data, None, as_json=True)
    else:
        print(line)


def _demo(args: argparse.Namespace) -> int:
    from nexus_cache import program

    path = args.path
    if path is not None:
        if not path.strip():  # Path("") is the working directory
            raise CommandError("--path is empty; give a directory, or leave --path out")
        path = str(Path(path).expanduser().absolute())
        kind = program.identify_cache_path(path)
        if kind == "sqlite":
            # the demo has no --backend: _check_kind's "add --backend sqlite" would mislead
            raise CommandError(
                f"{path} is a SQLite database file; the demo uses a filestream cache "
                "directory: point --path at a new or empty directory, or leave --path out"
            )
        if kind not in ("missing", "empty-dir", "filestream", "symlink"):
            _check_kind(Path(path), "filestream")  # says what is there instead (exit 2)
    return int(program.run_demo(path, arch=args.arch))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "program-cache",
        help="inspect and maintain a persistent compiled-program cache",
        description="Inspect and maintain a persistent compiled-program cache.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--path",
        default=None,
        help="cache directory (filestream) or database file (sqlite); default: "
        "$NEXUS_PROGRAM_CACHE_DIR / $NEXUS_PROGRAM_CACHE_DB, "
        "else under $XDG_CACHE_HOME/nexus-cache",
    )
    common.add_argument(
        "--backend",
        choices=("filestream", "sqlite"),
        default="filestream",
        help="storage backend (default: filestream)",
    )
    add_json_option(common)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("info", parents=[common], help="location, entry count and size")
    p.set_defaults(func=_info)
    p = sub.add_parser(
        "ls",
        parents=[common],
        help="list entries (program, code type, target, size, last use), LRU first",
    )
    p.add_argument(
        "--limit", type=count_option("--limit"), default=None, help="show at most this many"
    )
    p.set_defaults(func=_ls)
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="check every entry's integrity; remove corrupt ones (exit 1 if any found)",
    )
    p.set_defaults(func=_verify)
    p = sub.add_parser(
        "prune", parents=[common], help="evict least recently used entries down to a size"
    )
    p.add_argument(
        "--max-bytes",
        type=size_option("--max-bytes"),
        required=True,
        metavar="SIZE",
        help=f"bytes to keep at most; {SIZE_HELP}; 0 empties the cache",
    )
    p.set_defaults(func=_prune)
    p = sub.add_parser("clear", parents=[common], help="remove every entry")
    p.set_defaults(func=_clear)
    p = sub.add_parser(
        "demo",
        help="compile a real kernel through the cache twice and print miss/hit timings",
    )
    p.add_argument(
        "--path", default=None, help="cache directory to use (default: a temporary one)"
    )
    p.add_argument(
        "--arch", type=parse_arch, default="sm_90", help="target architecture (default: sm_90)"
    )
    p.set_defaults(func=_demo)
