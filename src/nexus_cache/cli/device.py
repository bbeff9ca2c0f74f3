"""``nexus-cache device``: look at the GPU-resident caches of this machine.

``nexus-cache device report`` builds :class:`DeviceResidentCaches` on the
selected backend and prints ``device_cache_reports()`` as JSON, TSV, or the
Prometheus exposition of the two ledger gauges. ``--demo`` publishes and
pins a small entry first so every column shows a live value.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register"]

_DEMO_SOURCE_BYTES = 1 << 20
_DEMO_GRAPH_BYTES = 64 << 10


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
        choices=("auto", "cuda", "host"),
        default=None,
        help="device backend (default: NEXUS_DEVICE_BACKEND, else auto)",
    )
    report.add_argument(
        "--format", choices=("json", "tsv", "prometheus"), default="json", help="output format"
    )
    report.add_argument(
        "--device",
        type=int,
        action="append",
        dest="devices",
        metavar="ID",
        help="device to report (repeatable; default: every device of the backend)",
    )
    report.add_argument(
        "--cache-cap-bytes",
        type=int,
        default=None,
        metavar="N",
        help="cache_cap_bytes of each device (default: 10%% of its managed capacity; 0 = none)",
    )
    report.add_argument(
        "--demo",
        action="store_true",
        help="publish a source and a graph entry and pin the source one before reporting",
    )
    report.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from nexus_cache.backends import select_backend
    from nexus_cache.device import MANAGED_CAPACITY_FRACTION, DeviceProfile, DeviceResidentCaches

    backend = select_backend(args.backend)
    devices = args.devices or list(range(backend.device_count()))
    profiles = []
    for device_id in devices:
        backend.check_device(device_id)
        cap = args.cache_cap_bytes
        if cap is None:
            total = backend.mem_info(device_id).total_bytes
            cap = int(total * MANAGED_CAPACITY_FRACTION) // 10
        profiles.append(DeviceProfile(device_id, cap))
    caches = DeviceResidentCaches(profiles, backend=backend)
    pins = []
    try:
        if args.demo:
            pins = _demo(caches)
        _print(caches, args.format)
    finally:
        for pin in pins:
            pin.release()
        caches.shutdown()
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


def _print(caches: Any, fmt: str) -> None:
    from nexus_cache.device import format_tsv

    if fmt == "json":
        rows = [report.to_dict() for report in caches.device_cache_reports()]
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "tsv":
        sys.stdout.write(format_tsv(caches.device_cache_reports()))
    else:
        try:
            from prometheus_client import CollectorRegistry, generate_latest
        except ImportError as exc:
            from nexus_cache.errors import BackendUnavailableError

            raise BackendUnavailableError(
                f"--format prometheus needs prometheus-client ({exc}); use json or tsv"
            ) from exc
        registry = CollectorRegistry()
        caches.register_prometheus(registry)
        sys.stdout.write(generate_latest(registry).decode())
