"""``nexus-cache device``: look at the GPU-resident caches of this machine.

``nexus-cache device report`` builds :class:`DeviceResidentCaches` on the
selected backend and prints ``device_cache_reports()``: by default a table
of the main figures, one row per device (``--all``: every field, grouped,
one column per device); ``--json`` (or ``--format json``) the full rows as
JSON; ``--format tsv`` or ``prometheus`` for tools. ``--demo`` publishes
and pins a small entry first so every column shows a live value.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nexus_cache.backends.kinds import AUTO, BACKEND_NAMES, ENV_DEVICE_BACKEND, backend_help
from nexus_cache.cli._output import (
    SIZE_HELP,
    CommandError,
    Table,
    add_json_option,
    count_option,
    emit,
    size,
    size_option,
)
from nexus_cache.cli._remote import add_server_option, client_for, server_url

__all__ = ["register"]

# The default table: (header, report column); sizes are printed in IEC units.
_SUMMARY = (
    ("DEVICE", "device_id"),
    ("BACKEND", "backend"),
    ("CACHE CAP", "cache_cap_bytes"),
    ("CHARGED", "cache_charged_bytes"),
    ("PINNED", "cache_pinned_in_use_bytes"),
    ("EVICTABLE", "cache_evictable_resident_bytes"),
    ("FREE MANAGED", "free_managed_bytes"),
    ("DOMAIN USED", "domain_used_bytes"),
    ("DRIFT", "drift_bytes"),
    ("ADMISSION", "admission_open"),
    ("SOURCE ENTRIES", "source_entries"),
    ("GRAPH ENTRIES", "graph_entries"),
)
# --all: report-column prefix -> section shown in the FIELD column
_SECTIONS = (("domain_", "domain"), ("source_", "source cache"), ("graph_", "graph cache"))

_DEMO_SOURCE_BYTES = 1 << 20
_DEMO_GRAPH_BYTES = 64 << 10
# --demo's entries side by side, the source one pinned: a smaller cap would
# refuse the source entry, or evict it to make room for the graph entry
_DEMO_CAP_BYTES = _DEMO_SOURCE_BYTES + _DEMO_GRAPH_BYTES


def register(subparsers: Any) -> None:
    device = subparsers.add_parser(
        "device",
        help="GPU-resident caches: ledger, allocation domains, reports",
        description="Inspect the GPU-resident caches (device ledger and allocation domains).",
    )
    sub = device.add_subparsers(dest="device_command", metavar="SUBCOMMAND")
    sub.required = True
    report = sub.add_parser(
        "report",
        help="print device_cache_reports() as JSON, TSV or Prometheus text",
        description=(
            "Build the device caches on the selected backend and print one report row per "
            "device: ledger figures beside the allocation domain's physical usage."
        ),
    )
    report.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default=None,
        help=f"device backend (default: {ENV_DEVICE_BACKEND}, else {AUTO}); {backend_help()}",
    )
    report.add_argument(
        "--format",
        choices=("table", "json", "tsv", "prometheus"),
        default="table",
        help="output format (default: table; --json is --format json)",
    )
    add_json_option(report)
    report.add_argument(
        "--all", action="store_true", help="table: every field, one column per device"
    )
    report.add_argument(
        "--device",
        type=count_option("--device"),
        action="append",
        dest="devices",
        metavar="ID",
        help="device to report (repeatable; default: every device of the backend)",
    )
    report.add_argument(
        "--cache-cap-bytes",
        type=size_option("--cache-cap-bytes"),
        default=None,
        metavar="SIZE",
        help="cache_cap_bytes of each device (default: 10%% of its managed capacity; "
        f"0 = no caches); {SIZE_HELP}",
    )
    report.add_argument(
        "--demo",
        action="store_true",
        help="publish a source and a graph entry and pin the source one before reporting",
    )
    add_server_option(report)
    report.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    url = server_url(args)
    if url is not None:
        return _report_remote(args, url)
    from nexus_cache.backends import select_backend
    from nexus_cache.device import MANAGED_CAPACITY_FRACTION, DeviceProfile, DeviceResidentCaches

    backend = select_backend(args.backend)
    devices = args.devices or list(range(backend.device_count()))
    profiles = []
    for device_id in devices:
        backend.check_device(device_id)
        cap = args.cache_cap_bytes
        total = backend.mem_info(device_id).total_bytes
        managed = int(total * MANAGED_CAPACITY_FRACTION)
        if cap is None:
            cap = managed // 10
        elif cap > managed:
            # Say it in the option's words, before DeviceProfile says it in its own.
            raise CommandError(
                f"--cache-cap-bytes {size(cap)} exceeds the managed capacity of "
                f"device {device_id}, {size(managed)} "
                f"({MANAGED_CAPACITY_FRACTION:.0%} of {size(total)}); lower the cap"
            )
        if args.demo and 0 < cap < _DEMO_CAP_BYTES:
            default = (
                " (the default: 10% of its managed capacity)"
                if args.cache_cap_bytes is None
                else ""
            )
            raise CommandError(
                f"--demo publishes a {size(_DEMO_SOURCE_BYTES)} source entry and a "
                f"{size(_DEMO_GRAPH_BYTES)} graph entry, which need a cache cap of at least "
                f"{size(_DEMO_CAP_BYTES)}, and device {device_id}'s is {size(cap)}{default}; "
                f"pass --cache-cap-bytes {_DEMO_CAP_BYTES} or more, or leave --demo out"
            )
        profiles.append(DeviceProfile(device_id, cap))
    caches = DeviceResidentCaches(profiles, backend=backend)
    pins = []
    try:
        if args.demo:
            pins = _demo(caches)
        _print(caches, "json" if args.json else args.format, show_all=args.all)
    finally:
        for pin in pins:
            pin.release()
        caches.shutdown()
    return 0


def _report_remote(args: argparse.Namespace, url: str) -> int:
    """The server's reports, printed as the in-process command prints its own."""
    from nexus_cache.device import format_tsv

    local = [
        name
        for name, given in (
            ("--backend", args.backend),
            ("--cache-cap-bytes", args.cache_cap_bytes),
            ("--demo", args.demo),
        )
        if given
    ]
    if local:
        raise CommandError(
            f"{', '.join(local)} configure a local report; leave them out with --server "
            "(the server's own settings apply)"
        )
    fmt = "json" if args.json else args.format
    if fmt == "prometheus":
        raise CommandError(
            "--format prometheus is not read through --server; scrape the server's "
            "--metrics-port at /metrics instead"
        )
    with client_for(url, args) as client:
        rows = client.reports()
    if args.devices:
        rows = [row for row in rows if row["device_id"] in args.devices]
    if fmt == "tsv":
        sys.stdout.write(format_tsv(rows))
    else:
        emit(rows, _table(rows, args.all), as_json=fmt == "json")
    return 0


def _demo(caches: Any) -> list[Any]:
    """One source entry (pinned) and one graph entry per device with caches."""
    pins = []
    for device_id in caches.device_ids:
        source, graph = caches.source_cache(device_id), caches.graph_cache(device_id)
        if source is None or graph is None:
            continue
        for sub, nbytes in ((source, _DEMO_SOURCE_BYTES), (graph, _DEMO_GRAPH_BYTES)):
            entry = sub.reserve(("demo", sub.kind), nbytes)
            array = sub.factory.domain.empty(nbytes, "uint8")
            entry.attach(array, [array])
            del array
            sub.publish(entry)
        pin = source.checkout(("demo", "source"))
        if pin is not None:
            pins.append(pin)
    return pins


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return (
            ("open" if value else "CLOSED") if column == "admission_open" else str(value).lower()
        )
    if column.endswith("_bytes") and isinstance(value, int):
        return size(value)
    return str(value)


def _table(rows: list[dict[str, Any]], show_all: bool) -> Table:
    if not show_all:
        table = Table(
            [header for header, _ in _SUMMARY],
            right=[h for h, c in _SUMMARY if c.endswith("_bytes") or c.endswith("_entries")],
            footer="sizes in IEC units; --all for every field, --json for raw numbers",
        )
        for row in rows:
            table.add(*(_cell(column, row[column]) for _, column in _SUMMARY))
        return table
    table = Table(
        ["SECTION", "FIELD", *[f"device {row['device_id']}" for row in rows]],
        right=[f"device {row['device_id']}" for row in rows],
    )
    for column in rows[0] if rows else ():
        section, field = "ledger", column
        for prefix, name in _SECTIONS:
            if column.startswith(prefix):
                section, field = name, column[len(prefix) :]
        if column.startswith("device_") and column != "device_id":
            section = "device memory"
        elif column in ("device_id", "backend", "caches_installed"):
            section = "device"
        table.add(section, field, *(_cell(column, row[column]) for row in rows))
    return table


def _print(caches: Any, fmt: str, *, show_all: bool = False) -> None:
    from nexus_cache.device import format_tsv

    if fmt in ("json", "table"):
        rows = [report.to_dict() for report in caches.device_cache_reports()]
        emit(rows, _table(rows, show_all), as_json=fmt == "json")
    elif fmt == "tsv":
        sys.stdout.write(format_tsv(caches.device_cache_reports()))
    else:
        try:
            from prometheus_client import CollectorRegistry, generate_latest
        except ImportError as exc:
            from nexus_cache.errors import BackendUnavailableError

            raise BackendUnavailableError(
                f"--format prometheus needs prometheus-client ({exc}); install "
                "nexus-cache[metrics], or use --format table, json or tsv"
            ) from exc
        registry = CollectorRegistry()
        caches.register_prometheus(registry)
        sys.stdout.write(generate_latest(registry).decode())
