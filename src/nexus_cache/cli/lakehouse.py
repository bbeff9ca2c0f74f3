"""``nexus-cache lakehouse``: inspect and maintain a lakehouse cache root.

Sub-commands: ``info`` (totals and the environment's configuration), ``ls``
(entries), ``verify`` (re-hash every entry against its identity record and remove
the ones that no longer match), ``prune --max-bytes`` (LRU retention now) and
``clear`` (remove every unpinned entry). ``--root`` defaults to
``NEXUS_LAKEHOUSE_CACHE_ROOT``. These commands never create a cache root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lakehouse",
        help="lakehouse byte cache: info, ls, verify, prune, clear",
        description="Inspect and maintain a lakehouse byte cache root.",
    )
    sub = parser.add_subparsers(dest="lakehouse_command", metavar="SUBCOMMAND")
    sub.required = True

    def add(name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument(
            "--root",
            default=None,
            help="cache root (default: NEXUS_LAKEHOUSE_CACHE_ROOT)",
        )
        p.set_defaults(func=func)
        return p

    add("info", "totals of the root and the configuration read from the environment", _info)
    add("ls", "list entries: key, size, last access, pins, source", _ls).add_argument(
        "--json", action="store_true", help="one JSON document instead of a table"
    )
    add(
        "verify",
        "re-hash every entry, remove those whose bytes no longer match their record",
        _verify,
    ).add_argument("--keep", action="store_true", help="report bad entries without removing them")
    add("prune", "remove least recently used unpinned entries down to a byte target", _prune)
    sub.choices["prune"].add_argument(
        "--max-bytes",
        default=None,
        help="target, e.g. 50GiB (default: NEXUS_LAKEHOUSE_CACHE_MAX_BYTES)",
    )
    add("clear", "remove every entry that no reader has pinned", _clear)


def _store(args: argparse.Namespace) -> Any:
    from nexus_cache.errors import ConfigError
    from nexus_cache.lakehouse.config import ENV_ROOT
    from nexus_cache.lakehouse.store import EntryStore

    root = args.root or os.environ.get(ENV_ROOT) or None
    if not root:
        raise ConfigError(f"no cache root: pass --root or set {ENV_ROOT}")
    return EntryStore(os.path.abspath(os.path.expanduser(root)), create=False)


def _info(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.lakehouse.config import LakehouseCacheConfig

    store = _store(args)
    entries = list(store.iter_entries())
    pins = store.live_pins()
    try:
        config: Any = LakehouseCacheConfig.from_env().to_dict()
    except ConfigError as exc:
        config = {"error": str(exc)}
    out = {
        "root": str(store.root),
        "entries": len(entries),
        "bytes": sum(e.size for e in entries),
        "pinned_entries": len(pins),
        "live_pins": sum(pins.values()),
        "temps": len(list(store.tmp_dir.iterdir())),
        "environment_config": config,
    }
    print(json.dumps(out, indent=2))
    return 0


def _ls(args: argparse.Namespace) -> int:
    store = _store(args)
    pins = store.live_pins()
    rows = []
    for entry in sorted(store.iter_entries(), key=lambda e: e.atime_ns, reverse=True):
        record = store.read_record(entry.key) or {}
        identity = record.get("identity") or {}
        rows.append(
            {
                "key": entry.key,
                "size": entry.size,
                "last_access": datetime.datetime.fromtimestamp(
                    entry.atime_ns / 1e9, tz=datetime.timezone.utc
                ).isoformat(timespec="seconds"),
                "pins": pins.get(entry.key, 0),
                "location": identity.get("location", "?"),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'KEY':<16} {'SIZE':>14} {'LAST ACCESS (UTC)':<25} {'PINS':>4}  LOCATION")
    for r in rows:
        print(
            f"{r['key'][:16]:<16} {r['size']:>14} {r['last_access']:<25} {r['pins']:>4}  "
            f"{r['location']}"
        )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from nexus_cache.lakehouse.maintenance import verify_all

    store = _store(args)
    total = sum(1 for _ in store.iter_entries())
    bad = verify_all(store, remove=not args.keep)
    for key, problem in sorted(bad.items()):
        action = "kept" if args.keep else "removed"
        print(f"{key[:16]}  {problem} ({action})")
    print(f"verified {total} entries: {total - len(bad)} good, {len(bad)} bad")
    return 1 if bad else 0


def _prune(args: argparse.Namespace) -> int:
    from nexus_cache.errors import ConfigError
    from nexus_cache.lakehouse.config import ENV_MAX_BYTES, parse_byte_size
    from nexus_cache.lakehouse.maintenance import enforce_retention

    raw = args.max_bytes or os.environ.get(ENV_MAX_BYTES) or None
    if raw is None:
        raise ConfigError(f"prune needs a target: pass --max-bytes or set {ENV_MAX_BYTES}")
    target = parse_byte_size(raw, name="--max-bytes" if args.max_bytes else ENV_MAX_BYTES)
    result = enforce_retention(_store(args), target)
    if not result.ran:
        print("another retention pass is running; nothing done")
        return 0
    print(
        f"removed {result.removed} entries ({result.freed_bytes} bytes); "
        f"{result.total_bytes} bytes remain; {result.pinned_skipped} pinned entries kept"
    )
    return 0


def _clear(args: argparse.Namespace) -> int:
    from nexus_cache.lakehouse.maintenance import clear_entries

    removed, kept = clear_entries(_store(args))
    print(f"removed {removed} entries; {kept} pinned entries kept")
    return 0
