"""Start, run and stop a server: :func:`run_server`, what ``nexus-cache serve`` calls.

Start: build the :class:`QueryService` (``NEXUS_*`` variables and the TOML
file, as every command), warm it up (``service.warm_up()``: every kernel its
queries use, compiled and loaded), and only then listen, so ``health``
answers ``ready`` from the first call it can receive. The log names the
listening URL and the warm-up time.

Stop (SIGTERM, SIGINT or the ``shutdown`` action): refuse new queries, wait
up to ``shutdown_timeout_s`` for running ones (execution and streaming),
cancel those still running and give them up to 5 s to release their grants,
stop gRPC, then ``service.shutdown()`` drains the caches in order (graph,
source, allocation-domain owner) and closes the lakehouse cache, whose
published entries are on disk already: a SIGKILL loses none of them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from nexus_cache.errors import ConfigError
from nexus_cache.server.settings import ServerSettings

__all__ = ["TRIM_INTERVAL_S", "freed_memory_trim", "run_server"]

log = logging.getLogger("nexus_cache.server")

# how long cancelled queries may take to reach their next look at their cancel
# event (the object being decoded, the PageRank iteration) and release their grant
_CANCEL_GRACE_S = 5.0
# how long a stuck gRPC shutdown (a client that stopped reading) may take
# beyond shutdown_timeout_s before the process leaves without it
_GRPC_STOP_GRACE_S = 5.0


def _configure_logging() -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(
        "%(asctime)s nexus-cache serve: %(message)s", "%Y-%m-%dT%H:%M:%SZ"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


#: how often the server gives the memory its finished queries freed back to the system
TRIM_INTERVAL_S = 0.5


def freed_memory_trim() -> Callable[[], bool] | None:
    """glibc's ``malloc_trim(0)``, which gives every free page of the heap back to
    the system (True when it gave some); None off glibc.

    glibc's own allocator stays as it is: freed blocks go back to its heap and
    the next query reuses them without a page fault, and it raises its mmap
    threshold (up to 32 MiB) each time a large block is freed, so a server
    whose resident memory is never trimmed only grows. Fixing the threshold
    low instead gives each large block a mapping of its own, every page of
    which faults again on every query: warm graph queries ran a third slower.
    The server trims every :data:`TRIM_INTERVAL_S` when a query finished in
    between, away from any query's thread (the call releases the GIL).
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


def run_server(settings: ServerSettings, config_path: str | Path | None = None) -> int:
    """Serve until a signal or the ``shutdown`` action; returns the exit status (0).

    Must run in the main thread (it installs the SIGTERM and SIGINT handlers).
    """
    from nexus_cache.server.app import QueryFlightServer
    from nexus_cache.server.metrics import MetricsEndpoint, ServerMetrics
    from nexus_cache.server.querylog import QueryBoard
    from nexus_cache.server.status_web import status_pages
    from nexus_cache.service import QueryService, ServiceConfig

    _configure_logging()
    settings.check_exposure()
    trim = freed_memory_trim()
    # the service checks every object a source expands to against the roots
    config = ServiceConfig.load(config_path, allowed_roots=settings.allowed_roots)
    stop = threading.Event()
    service = QueryService(config)
    server: Any = None
    endpoint: Any = None
    stopped = True
    try:
        warm_up_s = service.warm_up()
        log.info("warm-up done in %.2f s (every kernel the queries use is loaded)", warm_up_s)
        metrics = board = None
        if settings.metrics_port is not None:
            metrics = ServerMetrics(
                service, lambda: 0 if server is None else server.running, _admit_wait_s()
            )
            board = QueryBoard()
        try:
            server = QueryFlightServer(
                service,
                settings,
                warm_up_s=warm_up_s,
                metrics=metrics,
                board=board,
                on_shutdown_request=stop.set,
            )
        except pa.ArrowException as exc:
            # gRPC says only "did not start properly" (the cause goes to its own log)
            raise ConfigError(
                f"cannot listen on {settings.url}: the port is taken, or --host is not an "
                f"address of this machine, or --tls-cert/--tls-key do not match ({exc}); "
                "choose another --port or --host, or fix the certificate"
            ) from None
        if metrics is not None and board is not None and settings.metrics_port is not None:
            endpoint = MetricsEndpoint(
                metrics,
                settings.host,
                settings.metrics_port,
                status_pages(service, server, metrics, board, settings.token),
            )
        hurry = threading.Event()

        def on_signal(*_: Any) -> None:
            # the first signal stops gracefully; a second one while stopping
            # cancels the running queries at once (the caches still drain)
            if stop.is_set():
                hurry.set()
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        log.info(
            "listening on %s (backend %s, devices %s, %s)",
            settings.url_with_port(server.port),
            service.backend.name,
            ",".join(str(d) for d in service.caches.device_ids),
            "token required" if settings.token else "no authentication",
        )
        if endpoint is not None:
            url = settings.url_with_port(endpoint.port)
            log.info("metrics at http://%s/metrics", url.split("://", 1)[1])
            log.info("status page at http://%s/", url.split("://", 1)[1])
        try:
            trimmed = 0  # the queries finished at the last trim
            while not stop.wait(TRIM_INTERVAL_S):
                if trim is not None and server.finished != trimmed:
                    trimmed = server.finished
                    trim()
            log.info("stopping: refusing new queries (a second signal cancels running ones)")
            server.begin_stop()
            if not _wait_idle(server, settings.shutdown_timeout_s, hurry):
                log.info(
                    "%d queries still running %s; cancelling them",
                    server.cancel_running(),
                    "at a second signal"
                    if hurry.is_set()
                    else f"after shutdown_timeout_s={settings.shutdown_timeout_s:g}",
                )
                if not server.wait_idle(_CANCEL_GRACE_S):
                    log.info("%d queries still running; stopping anyway", server.running)
            stopped = _stop_grpc(server, _GRPC_STOP_GRACE_S)
        finally:
            # from here on a signal acts as it would without the server
            for sig, old in previous.items():
                signal.signal(sig, old)
    finally:
        if endpoint is not None:
            endpoint.close()
        started = time.monotonic()
        for device in service.shutdown(settings.shutdown_timeout_s):
            log.info(
                "device %d: graph cache, then source cache drained, domain owner %s%s",
                device.device_id,
                "released" if device.domain_released else "kept",
                f" ({device.problem})" if device.problem else "",
            )
        log.info("caches drained in %.2f s; exit", time.monotonic() - started)
    if not stopped:
        # gRPC still waits on a client that stopped reading; the caches are
        # drained and the lakehouse closed, so nothing is lost by leaving now
        for handler in log.handlers:
            handler.flush()
        os._exit(0)
    return 0


def _wait_idle(server: Any, timeout: float, hurry: threading.Event) -> bool:
    """``server.wait_idle(timeout)``, given up early (False) once ``hurry`` is set."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if server.wait_idle(max(0.0, min(0.1, left))):
            return True
        if hurry.is_set() or left <= 0:
            return False


def _admit_wait_s() -> float:
    from nexus_cache.service.admission import POLL_INTERVAL_S

    return POLL_INTERVAL_S


def _stop_grpc(server: Any, grace: float) -> bool:
    """``server.shutdown()`` (which waits for in-flight calls) for at most ``grace`` s."""
    done = threading.Event()

    def stop() -> None:
        server.shutdown()
        done.set()

    threading.Thread(target=stop, name="nexus-grpc-stop", daemon=True).start()
    return done.wait(grace)
