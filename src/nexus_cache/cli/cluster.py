"""``nexus-cache cluster``: the query services of a Dask cluster's workers."""

from __future__ import annotations

import argparse
import asyncio
import math
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from nexus_cache.cli._output import EXIT_OK, Table, add_json_option, emit, number_option, size
from nexus_cache.errors import BackendUnavailableError, CommandError

__all__ = ["register"]

_T = TypeVar("_T")

_HELP = "the query services of a Dask cluster's workers (the cluster extra)"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("cluster", help=_HELP, description=_HELP)
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True
    report = sub.add_parser(
        "report",
        help="per worker: device caches, lakehouse and program cache figures",
        description=(
            "Connect to a Dask scheduler and print, per worker, its device cache report "
            "(source and graph caches), its lakehouse cache figures and each program cache "
            "tier's figures, and the seconds its warm-up took. Workers without a nexus-cache "
            "query service are listed as such."
        ),
    )
    report.add_argument(
        "--scheduler", required=True, metavar="ADDR", help="scheduler address, tcp://host:8786"
    )
    report.add_argument(
        "--timeout",
        type=_seconds_option,
        default=10.0,
        metavar="SECONDS",
        help=(
            "seconds to wait for the scheduler, then again for the workers' reports "
            "(default 10); a refused connection fails at once"
        ),
    )
    add_json_option(report)
    report.set_defaults(func=_report)


_number = number_option("--timeout")


def _seconds_option(text: str) -> float:
    """``--timeout``: a finite number of seconds > 0 (Dask fails on the others, far
    from the option: a negative or NaN one is a ``ValueError`` of its own)."""
    seconds = _number(text)
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"--timeout {text!r} is not accepted; use a finite number of seconds > 0, such as 10"
        )
    return seconds


def _connect(address: str, timeout: float) -> Any:
    try:
        from distributed import Client
    except ImportError as exc:
        raise BackendUnavailableError(
            "nexus-cache cluster needs Dask distributed: pip install 'nexus-cache[cluster]'"
        ) from exc
    if not address.strip():
        raise CommandError("--scheduler '' is not an address; give tcp://host:port")
    refused = _refused(address, timeout)
    if refused is not None:
        raise CommandError(
            f"cannot reach the Dask scheduler at {address}: {refused}; check --scheduler "
            "and that the scheduler runs"
        )
    _handshake(address, timeout)
    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise CommandError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
            f"({type(exc).__name__}); check --scheduler and that the scheduler runs"
        ) from None


def _handshake(address: str, timeout: float) -> None:
    """Dask's connection handshake with ``address`` and its ``identity``, bounded as a
    whole by ``timeout``; a ``CommandError`` naming the address unless a scheduler answers.

    ``Client`` bounds only the connection, not the handshake after it: a
    listener that is no Dask scheduler (one that never answers, an HTTP server
    such as the dashboard's port) held it forever or failed with a
    ``MemoryError`` from the garbage it read, a worker's address failed with a
    ``TypeError`` and then a 6 s wait, and a malformed address failed as a timeout.
    """
    from distributed.comm import connect
    from distributed.security import Security

    async def shake() -> Any:
        args = Security().get_connection_args("client")
        comm = await connect(address, timeout=timeout, **args)
        try:
            await comm.write({"op": "identity", "reply": True, "close": True})
            return await comm.read()
        finally:
            await comm.close()

    advice = (
        "check --scheduler (the scheduler's port, 8786 by default, not its dashboard's) "
        "and that the scheduler runs"
    )
    try:
        identity = asyncio.run(asyncio.wait_for(shake(), timeout))
    except ValueError as exc:  # Dask's word for a malformed address
        raise CommandError(
            f"--scheduler {address!r} is not a Dask scheduler address ({exc}); "
            "give tcp://host:port"
        ) from None
    except OSError as exc:  # also the timeouts: TimeoutError is an OSError
        raise CommandError(
            f"no Dask scheduler answered at {address} within {timeout:g} s "
            f"({type(exc).__name__}); {advice}"
        ) from None
    except Exception as exc:  # what it sent is no Dask handshake
        raise CommandError(
            f"what listens at {address} is no Dask scheduler ({type(exc).__name__}: {exc}); "
            f"{advice}"
        ) from None
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        hint = identity.get("scheduler") if isinstance(identity, dict) else None
        raise CommandError(
            f"what listens at {address} is no Dask scheduler (it says it is a {kind!s}); "
            + (f"its scheduler is at {hint}: give that" if hint else advice)
        )


# How long the first look at a TCP scheduler address may take.
_PROBE_S = 2.0


def _refused(address: str, timeout: float) -> str | None:
    """Why a ``tcp://``/``tls://`` ``address`` cannot be a scheduler, found at once
    (the connection is refused, the host name is unknown); None when it may be
    one, or cannot be told this way (other schemes), and Dask must try for the
    full ``--timeout`` (Dask retries a refused connection until then)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return None
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        return None  # Dask says what is wrong with it
    try:
        with socket.create_connection((host, port), timeout=min(timeout, _PROBE_S)):
            return None
    except ConnectionRefusedError:
        return f"the connection was refused (nothing listens on {host}:{port})"
    except socket.gaierror as exc:
        return f"the host name {host!r} is unknown ({exc.strerror})"
    except OSError:
        return None  # slow or filtered: Dask tries for the full --timeout


def _within(seconds: float, call: Callable[[], _T], address: str) -> _T:
    """``call()``, waited for ``seconds`` at most: Dask's ``Client.run`` has no
    bound of its own, and a worker whose event loop is stuck never answers it.
    The call runs on a daemon thread, which the client's close then ends."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="nexus-cluster-report", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise CommandError(
            f"the workers of the Dask scheduler at {address} did not all answer within "
            f"{seconds:g} s; a worker may be stuck (check its logs), or raise --timeout"
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast(_T, value)


def _warm_up_cell(warm_up: dict[str, Any] | None) -> str:
    if not warm_up:
        return "-"
    if warm_up.get("state") == "running":
        return "running"
    seconds = f"{float(warm_up.get('seconds') or 0.0):.2f} s"
    return f"FAILED after {seconds}" if warm_up.get("state") == "failed" else seconds


def _program_cell(tiers: list[dict[str, Any]]) -> str:
    parts = []
    for tier in tiers:
        kind = str(tier["kind"]).replace("ProgramCache", "")
        state = "" if tier.get("reachable", True) else " UNREACHABLE"
        parts.append(
            f"{kind}: {tier['hits']} hits, {tier['misses']} misses, {tier['entries']} entries, "
            f"{size(tier['bytes'])}{state}"
        )
    return "; ".join(parts) or "-"


def _table(reports: list[dict[str, Any]]) -> Table:
    table = Table(
        [
            "worker",
            "device",
            "cache used",
            "source entries",
            "source hits",
            "graph entries",
            "graph hits",
            "warm-up",
            "lakehouse",
            "program cache",
        ],
        title="nexus-cache cluster",
        right=[
            "cache used",
            "source entries",
            "source hits",
            "graph entries",
            "graph hits",
            "warm-up",
        ],
        footer=f"{len(reports)} workers; --json for every field",
    )
    for report in reports:
        # emit prints every cell literally: an address is never read as markup
        worker = str(report["worker"])
        if not report.get("service"):
            table.add(worker, "-", "-", "-", "-", "-", "-", "-", "no query service", "-")
            continue
        lake = report["lakehouse"]
        lake_cell = (
            "off"
            if lake.get("root") is None
            else f"{lake.get('entries', 0)} entries, {size(lake.get('bytes', 0))}, "
            f"{lake['reads']['total']} reads ({lake['reads'].get('hit', 0)} hits)"
        )
        program = _program_cell(report["program_cache"])
        warm_up = _warm_up_cell(report.get("warm_up"))
        for device in report["devices"]:
            table.add(
                worker,
                f"{device['backend']}:{device['device_id']}",
                size(device.get("cache_charged_bytes") or 0),
                device.get("source_entries", "-"),
                device.get("source_hits", "-"),
                device.get("graph_entries", "-"),
                device.get("graph_hits", "-"),
                warm_up,
                lake_cell,
                program,
            )
    return table


def _report(args: argparse.Namespace) -> int:
    from nexus_cache.cluster import cluster_report

    client = _connect(args.scheduler, args.timeout)
    try:
        reports = _within(args.timeout, lambda: cluster_report(client), args.scheduler)
    finally:
        client.close()
    emit({"scheduler": args.scheduler, "workers": reports}, _table(reports), as_json=args.json)
    return EXIT_OK
