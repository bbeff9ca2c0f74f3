"""``nexus-cache lakehouse``: inspect and maintain a lakehouse cache root.

Sub-commands: ``info`` (totals of the root and the configuration read from
the environment, with every problem of it), ``ls`` (entries), ``stats``
(the reads of every process that used the root), ``read``
(read objects through the cache as the environment configures it and say
what each read did: hit, miss, miss-followed or bypass, local or remote, and why), ``verify``
(re-hash every entry against its identity record and remove the ones that no
longer match), ``prune --max-bytes`` (LRU retention now) and ``clear`` (remove
every unpinned entry). Settings come as the query service takes them
(:func:`~nexus_cache.service.load_lakehouse_config`): ``--root``, else
``NEXUS_LAKEHOUSE_CACHE_ROOT``, else ``[lakehouse] root`` of the service TOML
file (``--config FILE``, else ``NEXUS_SERVICE_CONFIG``); the other settings
likewise, variables over the file. These commands never create a cache root,
except ``read`` with a filling policy, which behaves exactly as a reading
program with the same settings would.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nexus_cache.cli._output import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    SIZE_HELP,
    CommandError,
    NoCacheError,
    Table,
    add_json_option,
    age,
    count_option,
    emit,
    literal,
    progress,
    size,
    size_option,
    utc,
)
from nexus_cache.errors import CacheIntegrityError, ConfigError

__all__ = ["register"]

# Spelled out, not imported: building the command line must not import the
# lakehouse package (fsspec), which only the lakehouse commands need.
_ENV_ROOT = "NEXUS_LAKEHOUSE_CACHE_ROOT"
_ENV_MAX_BYTES = "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES"
_ENV_SERVICE_CONFIG = "NEXUS_SERVICE_CONFIG"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lakehouse",
        help="lakehouse byte cache: info, ls, stats, read, verify, prune, clear",
        description="Inspect and maintain a lakehouse byte cache root.",
    )
    sub = parser.add_subparsers(dest="lakehouse_command", metavar="SUBCOMMAND")
    sub.required = True

    def add(name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument(
            "--root",
            default=None,
            help=f"cache root (default: {_ENV_ROOT}, else [lakehouse] root of the config file)",
        )
        p.add_argument(
            "--config",
            default=None,
            metavar="FILE",
            help="service TOML file whose [lakehouse] table is read under the "
            f"NEXUS_LAKEHOUSE_* variables (default: {_ENV_SERVICE_CONFIG})",
        )
        add_json_option(p)
        p.set_defaults(func=func)
        return p

    add("info", "totals of the root and the configuration read from the environment", _info)
    add("ls", "list entries: source, size, last access, pins, key", _ls)
    add(
        "stats",
        "reads of every process that used the root: hits, misses, bypasses, modes, events, "
        "and the most recent reads",
        _stats,
    ).add_argument(
        "--recent",
        type=count_option("--recent"),
        default=10,
        metavar="N",
        help="recent reads to show (default 10)",
    )
    add(
        "verify",
        "re-hash every entry, remove those whose bytes no longer match their record",
        _verify,
    ).add_argument("--keep", action="store_true", help="report bad entries without removing them")
    add(
        "prune", "remove least recently used unpinned entries down to a byte target", _prune
    ).add_argument(
        "--max-bytes",
        type=size_option("--max-bytes"),
        default=None,
        metavar="SIZE",
        help=f"target (default: {_ENV_MAX_BYTES}); {SIZE_HELP}; 0 removes every unpinned entry",
    )
    add("clear", "remove every entry that no reader has pinned", _clear)
    read = add(
        "read",
        "read objects through the cache configured from the environment; show each read's "
        "status (hit, miss, miss-followed, bypass), read mode, fill mode and reason",
        _read,
    )
    read.add_argument("sources", nargs="+", metavar="URL", help="local path or fsspec URL")
    read.add_argument(
        "--plan", action="store_true", help="only plan: say what a read would do, read nothing"
    )


def _check_root_option(args: argparse.Namespace) -> None:
    # "--root $UNSET" must not fall back to NEXUS_LAKEHOUSE_CACHE_ROOT (a clear
    # would empty that cache): an explicit empty root is a usage error.
    if args.root is not None and not args.root.strip():
        raise CommandError(
            f"--root is empty; give a cache root, or leave --root out for {_ENV_ROOT}"
        )


def _root_path(args: argparse.Namespace) -> Any:
    from nexus_cache.lakehouse import resolve_root
    from nexus_cache.service import load_lakehouse_root

    _check_root_option(args)
    if not args.root:
        path = load_lakehouse_root(args.config)
        if path is None:
            raise NoCacheError(
                f"no cache root: pass --root, set {_ENV_ROOT}, or set [lakehouse] root in "
                f"the service TOML file (--config FILE or {_ENV_SERVICE_CONFIG})"
            )
        return path
    try:
        return resolve_root(args.root)
    except ConfigError as exc:
        # resolve_root speaks of the variable; the user gave --root.
        raise ConfigError(str(exc).replace(f"{_ENV_ROOT}=", "--root ", 1)) from None


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    """The lakehouse configuration the query service would use (file, then variables)."""
    from nexus_cache.service import load_lakehouse_config

    return load_lakehouse_config(args.config, **overrides)


def _open(args: argparse.Namespace) -> Any:
    from nexus_cache.lakehouse import LakehouseRoot

    path = _root_path(args)
    try:
        return LakehouseRoot(path)
    except FileNotFoundError as exc:
        # strerror, not str(exc): no "[Errno 2]" in front of the message.
        raise NoCacheError(" ".join((exc.strerror or str(exc)).split())) from exc
    except CacheIntegrityError as exc:
        # Another cache's layout, or an unreadable layout file: no lakehouse
        # cache at this location (exit 2, as program-cache does for a foreign
        # database), not a problem found in one.
        raise NoCacheError(" ".join(str(exc).split())) from exc


def _info(args: argparse.Namespace) -> int:
    from nexus_cache.lakehouse import config_errors_from_env

    # Each bad variable on its own line; then the file and the variables together.
    errors: list[Exception] = list(config_errors_from_env())
    config = None
    try:
        config = _settings(args).to_dict()
        errors = []  # a combination the variables alone lack (a target set in the file)
    except ConfigError as exc:
        # unless it repeats the variables' errors (listed one by one already)
        if not any(str(e) in str(exc) for e in errors):
            errors.append(exc)
    summary = None
    try:
        summary = _open(args).summary()
    except (ConfigError, NoCacheError) as exc:
        # Still show the configuration: it often explains the missing root.
        if str(exc) not in {str(e) for e in errors}:
            errors.append(exc)
    data: dict[str, Any] = {}
    if summary is not None:
        data = {
            "root": str(summary.root),
            "entries": summary.entries,
            "bytes": summary.bytes,
            "pinned_entries": summary.pinned_entries,
            "live_pins": summary.live_pins,
            "temps": summary.temps,
        }
    data["environment_config"] = config
    data["config_errors"] = [str(e) for e in errors]
    table = Table(["field", "value"], title="lakehouse cache")
    if summary is not None:
        table.add("root", data["root"])
        table.add("entries", summary.entries)
        table.add("size", size(summary.bytes))
        table.add("pinned entries", summary.pinned_entries)
        table.add("live pins", summary.live_pins)
        table.add("fill temps", summary.temps)
    for name, value in (config or {}).items():
        shown = size(value) if name.endswith("_bytes") and value is not None else value
        table.add(f"config: {name}", "-" if shown is None else shown)
    emit(data, table, as_json=args.json)
    for error in errors:
        print(f"nexus-cache: error: {literal(str(error))}", file=sys.stderr)
    return EXIT_USAGE if errors else EXIT_OK


def _ls(args: argparse.Namespace) -> int:
    root = _open(args)
    with progress("reading entries", None):  # a spinner: records are read one by one
        entries = root.entries()
    rows = [
        {
            "key": e.key,
            "size": e.size,
            "last_access": utc(e.atime_ns),
            "pins": e.pins,
            "location": e.location,
        }
        for e in entries
    ]
    table = Table(
        ["LOCATION", "SIZE", "LAST ACCESS (UTC)", "AGE", "PINS", "KEY"],
        title="most recently used first",
        right=("SIZE", "AGE", "PINS"),
        whole=("SIZE", "LAST ACCESS (UTC)", "AGE"),
    )
    for e in entries:
        table.add(
            e.location or "?", size(e.size), utc(e.atime_ns), age(e.atime_ns), e.pins, e.key[:12]
        )
    table.footer = f"entries: {len(entries)}, {size(sum(e.size for e in entries))}"
    emit(rows, table, as_json=args.json)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    root = _open(args)
    with progress("verifying entries", root.summary().entries) as advance:
        result = root.verify(remove=not args.keep, progress=advance)
    action = "kept" if args.keep else "removed"
    good = result.checked - len(result.bad)
    data = {
        "checked": result.checked,
        "good": good,
        "bad": [{"key": k, "problem": p, "action": action} for k, p in sorted(result.bad.items())],
    }
    table = Table(["KEY", "PROBLEM", "ACTION"], title="entries with problems")
    for key, problem in sorted(result.bad.items()):
        table.add(key[:16], problem, action)
    table.footer = f"verified {result.checked} entries: {good} good, {len(result.bad)} bad"
    emit(data, table, as_json=args.json)
    return EXIT_PROBLEMS if result.bad else EXIT_OK


def _prune(args: argparse.Namespace) -> int:
    target = args.max_bytes
    if target is None:
        target = _settings(args).max_bytes
        if target is None:
            raise ConfigError(
                f"prune needs a target: pass --max-bytes, set {_ENV_MAX_BYTES}, or set "
                "[lakehouse] max_bytes in the service TOML file"
            )
    root = _open(args)
    with progress("pruning", root.summary().entries) as advance:
        result = root.prune(target, progress=advance)
    data = {
        "ran": result.ran,
        "removed": result.removed,
        "freed_bytes": result.freed_bytes,
        "remaining_bytes": result.total_bytes,
        "pinned_kept": result.pinned_skipped,
    }
    if args.json:
        emit(data, None, as_json=True)
    elif not result.ran:
        print("another retention pass is running; nothing done")
    else:
        print(
            f"removed {result.removed} entries ({size(result.freed_bytes)}); "
            f"{size(result.total_bytes)} remain; {result.pinned_skipped} pinned entries kept"
        )
    return EXIT_OK


def _clear(args: argparse.Namespace) -> int:
    removed, kept = _open(args).clear()
    if args.json:
        emit({"removed": removed, "pinned_kept": kept}, None, as_json=True)
    else:
        print(f"removed {removed} entries; {kept} pinned entries kept")
    return EXIT_OK


def _read(args: argparse.Namespace) -> int:
    from nexus_cache.lakehouse import LakehouseCache

    _check_root_option(args)
    overrides = {"root": args.root} if args.root else {}
    rows = []
    # close() waits for background fills, so read_through warms the cache
    # even from this short-lived process.
    try:
        cache = LakehouseCache(_settings(args, **overrides))
    except CacheIntegrityError as exc:
        # another cache's directory or layout: no lakehouse cache there (exit 2)
        raise NoCacheError(" ".join(str(exc).split())) from exc
    with cache:
        for source in args.sources:
            try:
                if args.plan:
                    diag = cache.plan(source).diagnostics()
                else:
                    with cache.open(source) as f:
                        while f.read(8 << 20):
                            pass
                        diag = f.diagnostics
            except FileNotFoundError as exc:
                # fsspec's message is the bare path; say what is missing (bad input: 2).
                why = exc.strerror or str(exc)
                raise CommandError(f"{source}: no such object or file ({why})") from exc
            except IsADirectoryError as exc:  # a directory, a device: not an object
                raise CommandError(" ".join(str(exc).split())) from exc
            except ValueError as exc:
                if "protocol" not in str(exc).lower():
                    raise
                # fsspec: "Protocol not known: bogus" (a typo in the URL: bad input)
                raise CommandError(f"{source!r}: {exc}") from exc
            rows.append(diag.to_dict())
    table = Table(
        ["STATUS", "READ", "FILL", "SIZE", "REASON", "LOCATION"],
        right=("SIZE",),
        title="planned reads" if args.plan else None,
    )
    for row in rows:
        table.add(
            row["cache_status"],
            row["read_mode"],
            row["fill_mode"],
            size(row["size"]),
            row["reason"] or "-",
            row["location"],
        )
    emit(rows, table, as_json=args.json)
    return EXIT_OK


def _stats(args: argparse.Namespace) -> int:
    from nexus_cache.lakehouse import read_stats

    # Open the root first, as every other sub-command does: a symlink, an
    # empty directory or another cache's directory is refused, not shown as
    # a root with no reads.
    path = _open(args).root
    try:
        data = read_stats(path, recent=max(0, args.recent))
    except FileNotFoundError as exc:
        raise NoCacheError(" ".join((exc.strerror or str(exc)).split())) from exc
    reads = data["reads"]
    table = Table(
        ["WHAT", "COUNT"],
        title=f"processes: {data['processes']}",
        right=("COUNT",),
        footer="a process's reads are counted once its cache closes or it exits",
    )
    for status, count in reads.items():
        if status != "total":
            table.add(f"read {status}", count)
    table.add("reads in all", reads["total"])
    for group, label in (("read_modes", "read mode"), ("fill_modes", "fill mode")):
        for mode, count in data[group].items():
            table.add(f"{label} {mode}", count)
    for kind, count in data["events"].items():
        if count:
            table.add(f"event {kind}", count)
    emit(data, table, as_json=args.json)
    if not args.json and data["recent_reads"]:
        recent = Table(["STATUS", "READ", "FILL", "REASON", "LOCATION"], title="recent reads")
        for r in data["recent_reads"]:
            recent.add(
                r.get("cache_status"),
                r.get("read_mode"),
                r.get("fill_mode"),
                r.get("reason") or "-",
                r.get("location"),
            )
        emit(None, recent, as_json=False)
    return EXIT_OK
