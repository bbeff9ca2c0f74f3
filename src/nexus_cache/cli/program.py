"""``nexus-cache program-cache``: inspect and maintain a persistent program cache."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
from pathlib import Path
from typing import Any

from nexus_cache._sizes import format_size
from nexus_cache._sizes import parse_size as _parse_size
from nexus_cache.errors import ConfigError

__all__ = ["parse_size", "register"]


def parse_size(text: str) -> int:
    """argparse type for size options: the package's one grammar, ``0`` allowed."""
    try:
        return _parse_size(text, name="size", allow_zero=True)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stamp(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).isoformat(timespec="seconds")


def _location(args: argparse.Namespace) -> Path:
    from nexus_cache.program._paths import default_filestream_root, default_sqlite_path

    if args.path:
        return Path(args.path).expanduser()
    return default_filestream_root() if args.backend == "filestream" else default_sqlite_path()


def _open(args: argparse.Namespace) -> Any:
    """The cache at the chosen location, or ``None`` when there is none (never creates one)."""
    path = _location(args)
    if not os.path.lexists(path):
        print(f"no {args.backend} program cache at {path}")
        return None
    if args.backend == "filestream":
        from nexus_cache.program import FileStreamProgramCache

        return FileStreamProgramCache(path)
    from nexus_cache.program import SQLiteProgramCache

    return SQLiteProgramCache(path)


def _info(args: argparse.Namespace) -> int:
    cache = _open(args)
    if cache is None:
        return 0
    with cache:
        s = cache.stats()
        print(f"backend: {args.backend}")
        print(f"path:    {cache.path}")
        print(f"entries: {s.entries}")
        print(f"bytes:   {s.bytes} ({format_size(s.bytes)})")
        if args.backend == "filestream":
            record = "xattr user.nexus.v1" if cache.uses_xattrs else "sidecar .sum files"
            print(f"integrity records: {record}")
            tmp = cache.path / "tmp"
            print(f"writes in flight (tmp/): {len(os.listdir(tmp)) if tmp.is_dir() else 0}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    cache = _open(args)
    if cache is None:
        return 0
    with cache:
        print("# name\tsize\tlast access (least recently used first)")
        for n, e in enumerate(cache.iter_entries()):
            if args.limit is not None and n >= args.limit:
                break
            print(f"{e.name}\t{e.size}\t{_stamp(e.atime_ns)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    cache = _open(args)
    if cache is None:
        return 0
    with cache:
        r = cache.verify()
    for name in r.corrupt:
        print(f"corrupt, removed: {name}")
    for path, why in r.refused:
        print(f"refused ({why}), left in place: {path}")
    for name in r.unverified:
        print(f"no integrity record (reads as a miss): {name}")
    print(
        f"checked {r.checked}: {r.ok} ok, {len(r.corrupt)} corrupt (removed), "
        f"{len(r.refused)} refused, {len(r.unverified)} unverified"
    )
    return 1 if r.corrupt or r.refused else 0


def _prune(args: argparse.Namespace) -> int:
    cache = _open(args)
    if cache is None:
        return 0
    with cache:
        n, freed = cache.prune(args.max_bytes)
        left = cache.stats().bytes
    print(f"removed {n} entries ({format_size(freed)}); {format_size(left)} remain")
    return 0


def _clear(args: argparse.Namespace) -> int:
    cache = _open(args)
    if cache is None:
        return 0
    with cache:
        before = cache.stats()
        cache.clear()
        after = cache.stats()
    freed = before.bytes - after.bytes
    print(f"removed {before.entries - after.entries} entries ({format_size(freed)})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from nexus_cache.program._demo import run_demo

    return int(run_demo(args.path, arch=args.arch))


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
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("info", parents=[common], help="location, entry count and size")
    p.set_defaults(func=_info)
    p = sub.add_parser("ls", parents=[common], help="list entries, least recently used first")
    p.add_argument("--limit", type=int, default=None, help="show at most this many")
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
        type=parse_size,
        required=True,
        metavar="N",
        help="bytes to keep at most (suffixes K, M, G, T: powers of 1024)",
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
    p.add_argument("--arch", default="sm_90", help="target architecture (default: sm_90)")
    p.set_defaults(func=_demo)
