"""The Arrow Flight server in front of one :class:`QueryService`.

* ``do_get``: the ticket holds a query (see :mod:`nexus_cache.server.wire`);
  the service executes it (the attempt holds its grant only while it runs),
  then the result streams as record batches whose schema metadata carries the
  diagnostics. A client that cancels or disconnects cancels its query: while
  it executes, a watcher looks at the call every :data:`WATCH_INTERVAL_S` and
  sets the query's cancel event (it leaves the admission queue or stops at
  its next object or PageRank iteration, releasing its grant); while it
  streams, the stream stops at the next batch and the result is dropped
  (a stream the server cancels ends in an error, not a short table).
  :meth:`QueryFlightServer.cancel_running` cancels every running query the
  same way (a shutdown whose wait ran out).
* ``get_flight_info``: plans the query (lists the source, reads no data).
* actions: ``health``, ``reports``, ``source-events``, ``plan``, ``shutdown``.

Every call runs in a gRPC worker thread; the service is thread-safe and its
single flight holds across every client of the server. At most
``max_running_queries`` queries execute at once; others wait up to
``queue_timeout_s``. Errors reach the client as Flight errors carrying the
same one-line message as the CLI; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from nexus_cache.errors import (
    AdmissionError,
    ConfigError,
    NexusCacheError,
    QueryCancelledError,
)
from nexus_cache.server.auth import BearerTokenMiddlewareFactory
from nexus_cache.server.metrics import ServerMetrics
from nexus_cache.server.querylog import QueryBoard
from nexus_cache.server.settings import ServerSettings
from nexus_cache.server.tickets import parse_ticket
from nexus_cache.server.wire import ACTIONS, attach_diagnostics, encode_error

__all__ = ["WATCH_INTERVAL_S", "QueryFlightServer"]

log = logging.getLogger("nexus_cache.server")

# Bytes per streamed batch: large enough that per-batch overhead vanishes,
# small enough that a cancelled client is noticed within a few milliseconds.
_BATCH_BYTES = 8 << 20
#: how often a running query's call is looked at for a client that went away
WATCH_INTERVAL_S = 0.05
_USER_ERRORS = (NexusCacheError, FileNotFoundError, NotADirectoryError, PermissionError)


def _flight_error(exc: BaseException) -> flight.FlightError:
    message, info = encode_error(exc)
    return flight.FlightServerError(message, extra_info=info)


class QueryFlightServer(flight.FlightServerBase):
    """Serves ``service`` at ``settings.url`` until :meth:`stop`; starts listening at once.

    ``on_shutdown_request`` is called (from a gRPC thread) by the ``shutdown``
    action. Thread-safe.
    """

    def __init__(
        self,
        service: Any,
        settings: ServerSettings,
        *,
        warm_up_s: float,
        metrics: ServerMetrics | None = None,
        board: QueryBoard | None = None,
        on_shutdown_request: Callable[[], None] | None = None,
    ) -> None:
        middleware = {}
        if settings.token is not None:
            middleware["auth"] = BearerTokenMiddlewareFactory(settings.token)
        tls = []
        if settings.tls_cert is not None and settings.tls_key is not None:
            tls = [
                flight.CertKeyPair(settings.tls_cert.read_bytes(), settings.tls_key.read_bytes())
            ]
        self._service = service
        self._settings = settings
        self._metrics = metrics
        # the status page's recent and running queries (None: no status page)
        self._board = board
        self._warm_up_s = warm_up_s
        self._on_shutdown_request = on_shutdown_request
        self._slots = threading.BoundedSemaphore(settings.max_running_queries)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0
        # the cancel events of the queries waiting for a slot, executing or streaming
        self._cancels: set[threading.Event] = set()
        self._watcher = _CallWatcher()
        self._stopping = False
        self._started = time.monotonic()
        super().__init__(settings.url, tls_certificates=tls, middleware=middleware)

    # -- state -------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Queries waiting for a slot, executing or streaming now."""
        return self._running

    def begin_stop(self) -> None:
        """Refuse new queries from now on (running ones continue)."""
        with self._lock:
            self._stopping = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for running queries; True when none is left."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def cancel_running(self) -> int:
        """Cancel every running query (as if its client had gone away); returns how
        many. Each releases its grant at its next look at its cancel event."""
        with self._lock:
            cancels = list(self._cancels)
        for cancel in cancels:
            cancel.set()
        return len(cancels)

    def _enter(self) -> threading.Event:
        """Count a query in; returns its cancel event."""
        cancel = threading.Event()
        with self._lock:
            if self._stopping:
                raise flight.FlightUnavailableError(
                    "the nexus-cache server is shutting down; retry against a running server"
                )
            self._running += 1
            self._cancels.add(cancel)
        return cancel

    def _leave(self, cancel: threading.Event) -> None:
        with self._idle:
            self._running -= 1
            self._cancels.discard(cancel)
            self._idle.notify_all()
        if self._board is not None:
            self._board.left(cancel)

    # -- queries -----------------------------------------------------------------------

    def _query(self, raw: bytes) -> tuple[Any, int | None]:
        try:
            return parse_ticket(
                raw,
                max_bytes=self._settings.max_ticket_bytes,
                allowed_roots=self._settings.allowed_roots,
            )
        except ConfigError as exc:
            log.info("refused ticket: %s", encode_error(exc)[0])
            raise _flight_error(exc) from None

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        start = time.perf_counter()
        query, device = self._query(ticket.ticket)
        cancel = self._enter()
        if self._board is not None:
            self._board.started(cancel, query.kind, query.to_dict())
        try:
            with self._watcher.watching(context, cancel):
                result = self._execute(query, device, start, cancel)
            diagnostics = result.diagnostics.to_dict()
            schema = attach_diagnostics(result.table, diagnostics)
        except BaseException:
            self._leave(cancel)
            raise
        if result.table.nbytes <= _BATCH_BYTES:
            # one batch: nothing to stop early, and Arrow's own stream writes it
            # without a call back into Python
            self._finish(query, diagnostics, start, "ok", cancel)
            return flight.RecordBatchStream(result.table.replace_schema_metadata(schema.metadata))
        stream = _ResultStream(
            result.table,
            context,
            cancel,
            lambda outcome: self._finish(query, diagnostics, start, outcome, cancel),
        )
        return flight.GeneratorStream(schema, stream)

    def _slot(self, cancel: threading.Event) -> None:
        """Take a running-query slot; a query cancelled while it waits leaves at once."""
        wait = self._settings.queue_timeout_s
        deadline = time.monotonic() + wait
        while not self._slots.acquire(timeout=min(WATCH_INTERVAL_S, wait)):
            if cancel.is_set():
                raise QueryCancelledError(
                    "the query was cancelled while it waited for a running-query slot (its "
                    "client went away, or the server is stopping)"
                )
            if time.monotonic() >= deadline:
                raise flight.FlightUnavailableError(
                    f"{self._settings.max_running_queries} queries are running and none "
                    f"finished within queue_timeout_s={self._settings.queue_timeout_s:g}; retry "
                    "later or raise NEXUS_SERVER_MAX_RUNNING_QUERIES"
                )

    def _execute(
        self, query: Any, device: int | None, start: float, cancel: threading.Event
    ) -> Any:
        try:
            self._slot(cancel)
            try:
                return self._service.execute(query, device=device, cancel=cancel)
            finally:
                self._slots.release()
        except flight.FlightError:
            raise
        except Exception as exc:
            elapsed = time.perf_counter() - start
            text = json.dumps(query.to_dict(), separators=(",", ":"))
            cancelled = isinstance(exc, QueryCancelledError)
            outcome = "cancelled" if cancelled else "error"
            message = encode_error(exc)[0]
            log.info("query - %s %s %.1f ms: %s", text, outcome, elapsed * 1e3, message)
            if self._metrics is not None:
                if isinstance(exc, AdmissionError):
                    self._metrics.refused()
                self._metrics.observe(query.kind, outcome, elapsed, None)
            if self._board is not None:
                self._board.finished(cancel, outcome, elapsed, None, message)
            if isinstance(exc, _USER_ERRORS):  # QueryCancelledError included
                raise _flight_error(exc) from None
            log.exception("query failed unexpectedly")
            raise _flight_error(exc) from None

    def _finish(
        self,
        query: Any,
        diag: dict[str, Any],
        start: float,
        outcome: str,
        cancel: threading.Event,
    ) -> None:
        elapsed = time.perf_counter() - start
        try:
            log.info(
                "query %s %s lakehouse=%s source=%s graph=%s rows=%d attempts=%d %s %.1f ms",
                diag["query_id"],
                json.dumps(diag["query"], separators=(",", ":")),
                diag["lakehouse"].get("status"),
                diag["source_cache"].get("status"),
                diag["graph_cache"].get("status"),
                diag["rows"],
                len(diag["attempts"]),
                outcome,
                elapsed * 1e3,
            )
            if self._metrics is not None:
                self._metrics.observe(query.kind, outcome, elapsed, diag)
            if self._board is not None:
                self._board.finished(cancel, outcome, elapsed, diag)
        finally:
            self._leave(cancel)

    def get_flight_info(
        self, context: Any, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        raw = bytes(descriptor.command or b"")
        query, _ = self._query(raw)
        plan = self._call(lambda: self._service.plan(query))
        return flight.FlightInfo(
            pa.schema([]),
            descriptor,
            [flight.FlightEndpoint(raw, [])],
            total_records=-1,
            total_bytes=int(plan["parquet_bytes"]),
            app_metadata=json.dumps(plan, default=str).encode(),
        )

    # -- actions -----------------------------------------------------------------------

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        kind = action.type
        if kind == "health":
            body: Any = self.health()
        elif kind == "reports":
            body = self._call(lambda: [r.to_dict() for r in self._service.device_cache_reports()])
        elif kind == "source-events":
            body = self._call(
                lambda: [
                    s.to_dict() for s in self._service.caches.device_cache_source_event_snapshots()
                ]
            )
        elif kind == "plan":
            query, _ = self._query(bytes(action.body or b""))
            body = self._call(lambda: self._service.plan(query))
        elif kind == "shutdown":
            log.info("shutdown requested by a client")
            self.begin_stop()
            if self._on_shutdown_request is not None:
                self._on_shutdown_request()
            body = {"status": "stopping"}
        else:
            raise _flight_error(
                ConfigError(f"action {kind!r} is not known; use one of: {', '.join(ACTIONS)}")
            )
        yield flight.Result(json.dumps(body, default=str, allow_nan=False).encode())

    def health(self) -> dict[str, Any]:
        """Readiness (the server listens only once warm-up is done) and a few figures."""
        from nexus_cache import __version__

        return {
            "status": "stopping" if self._stopping else "ready",
            "version": __version__,
            "backend": self._service.backend.name,
            "devices": list(self._service.caches.device_ids),
            "warm_up_s": self._warm_up_s,
            "running_queries": self._running,
            "max_running_queries": self._settings.max_running_queries,
            "uptime_s": time.monotonic() - self._started,
            "rss_bytes": _rss_bytes(),
            "arrow_allocated_bytes": pa.total_allocated_bytes(),
        }

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except _USER_ERRORS as exc:
            raise _flight_error(exc) from None


def _rss_bytes() -> int | None:
    """This process's resident set (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _CallWatcher:
    """Sets a call's cancel event when its client cancels or goes away: one thread
    looks at every watched call every :data:`WATCH_INTERVAL_S`.

    One thread for all calls, started with the first and ended when none is
    left, so a query pays two lock acquisitions for its watch rather than a
    thread of its own. A call's context is only looked at under the lock, and
    :meth:`watching` takes it off under the lock before the handler returns:
    never after gRPC has freed the call. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[object, tuple[Any, threading.Event]] = {}
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, context: Any, cancel: threading.Event) -> Iterator[None]:
        """Watch ``context`` for as long as the block runs."""
        key = object()
        with self._lock:
            self._calls[key] = (context, cancel)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="nexus-cancel-watch", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[key]

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            with self._lock:
                if not self._calls:
                    self._thread = None  # the next call starts another
                    return
                for context, cancel in self._calls.values():
                    if not cancel.is_set() and context.is_cancelled():
                        cancel.set()


class _ResultStream:
    """Yields a result's batches, stopping when the client cancelled or went away
    or the query was cancelled (``cancel``: a server stopping); the latter ends
    the stream with a Flight error, so a client still reading never takes the
    batches sent so far for the whole result.

    ``done(outcome)`` runs exactly once: at the end of the stream, when it is
    stopped early, or when gRPC drops it unread (``__del__``).
    """

    def __init__(
        self,
        table: pa.Table,
        context: Any,
        cancel: threading.Event,
        done: Callable[[str], None],
    ) -> None:
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        self._batches = _coalesced(table, max(1, _BATCH_BYTES // per_row))
        self._rows = table.num_rows
        self._sent = 0
        self._context = context
        self._cancel = cancel
        self._done: Callable[[str], None] | None = done

    def __iter__(self) -> _ResultStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._context.is_cancelled():  # nobody left to tell
            self._close("cancelled")
            raise StopIteration
        if self._cancel.is_set():
            self._close("cancelled")
            # The client is still reading: a plain end of stream would hand it
            # the batches sent so far as if they were the whole result.
            raise _flight_error(
                QueryCancelledError(
                    f"the server is stopping: the result was cut short after {self._sent} "
                    f"of {self._rows} rows and is withdrawn; run the query again against "
                    "a running server"
                )
            )
        try:
            batch = next(self._batches)
        except StopIteration:
            self._close("ok")
            raise
        self._sent += batch.num_rows
        return batch

    def _close(self, outcome: str) -> None:
        done, self._done = getattr(self, "_done", None), None
        self._batches = iter(())  # the table's memory goes with the last reference
        if done is not None:
            done(outcome)

    def __del__(self) -> None:
        self._close("cancelled")


def _coalesced(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """``table`` as batches of about ``rows`` rows: small chunks (a scan's
    ``batch_rows``) are joined, since each Flight message costs about as much as
    copying a few MiB, and large ones split."""
    group: list[pa.RecordBatch] = []
    count = 0
    for batch in table.to_batches(max_chunksize=rows):
        group.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield _joined(group)
            group, count = [], 0
    if group:
        yield _joined(group)


def _joined(group: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(group) == 1:
        return group[0]
    batches = pa.Table.from_batches(group).combine_chunks().to_batches()
    return batches[0] if batches else group[0]  # none: the group had no row
