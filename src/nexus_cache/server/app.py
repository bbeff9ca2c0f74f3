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
  The query's id is the one its client sent in the call header
  :data:`~nexus_cache.server.wire.QUERY_ID_HEADER` (:mod:`~nexus_cache.server.callid`)
  when valid and not already running, else one of the server's own.
  :meth:`QueryFlightServer.cancel_running` cancels every running query the
  same way (a shutdown whose wait ran out).
* ``get_flight_info``: plans the query (lists the source, reads no data);
  ``get_schema``: the schema its result will have (a scan reads one Parquet
  footer). Both take command descriptors holding a query's JSON.
* ``list_flights``: the queries in the server now (waiting for a slot,
  executing or streaming), each with its id, state and seconds so far.
* actions: ``health``, ``reports``, ``source-events``, ``plan``, ``shutdown``,
  ``cancel`` (the body names a running query by its id; its cancel event is
  set, as when its client goes away: a client that stops waiting while its
  call is open, the nexus-cache client on Ctrl-C, sends it).

Every call runs in a gRPC worker thread; the service is thread-safe and its
single flight holds across every client of the server. At most
``max_running_queries`` queries execute at once; others wait up to
``queue_timeout_s``. Errors reach the client as Flight errors carrying the
same one-line message as the CLI and, in ``extra_info``, its class
(:func:`~nexus_cache.server.wire.encode_error`): a cancelled query as
Flight's cancelled error, an unexpected failure as its internal error (its
traceback goes to the server's log only), any other as its server error.
The server keeps serving.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from nexus_cache.errors import (
    AdmissionError,
    ConfigError,
    QueryCancelledError,
)
from nexus_cache.server._answers import USER_ERRORS, answering, flight_error
from nexus_cache.server._running import RunningQuery
from nexus_cache.server._stream import BATCH_BYTES, ResultStream
from nexus_cache.server._watch import WATCH_INTERVAL_S, CallWatcher
from nexus_cache.server.auth import BasicHandshake, BearerTokenMiddlewareFactory
from nexus_cache.server.callid import MIDDLEWARE_KEY, CallIdMiddlewareFactory, call_id
from nexus_cache.server.metrics import ServerMetrics
from nexus_cache.server.querylog import QueryBoard
from nexus_cache.server.schemas import result_schema
from nexus_cache.server.settings import ServerSettings
from nexus_cache.server.tickets import parse_ticket
from nexus_cache.server.wire import ACTIONS, QUERY_ID_HEADER, attach_diagnostics, encode_error
from nexus_cache.service.service import is_query_id

__all__ = ["WATCH_INTERVAL_S", "QueryFlightServer"]

log = logging.getLogger("nexus_cache.server")


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
        middleware: dict[str, flight.ServerMiddlewareFactory] = {
            MIDDLEWARE_KEY: CallIdMiddlewareFactory()
        }
        handshake = None
        if settings.token is not None:
            handshake = BasicHandshake()
            middleware["auth"] = BearerTokenMiddlewareFactory(
                settings.token, None if metrics is None else metrics.auth_refused
            )
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
        # the queries waiting for a slot, executing or streaming
        self._queries: set[RunningQuery] = set()
        self._finished = 0
        self._watcher = CallWatcher()
        self._stopping = False
        self._started = time.monotonic()
        super().__init__(
            settings.url, auth_handler=handshake, tls_certificates=tls, middleware=middleware
        )

    # -- state -------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Queries waiting for a slot, executing or streaming now."""
        return len(self._queries)

    @property
    def finished(self) -> int:
        """Queries that left the server (done, failed or cancelled) since it started."""
        return self._finished

    def begin_stop(self) -> None:
        """Refuse new queries from now on (running ones continue)."""
        with self._lock:
            self._stopping = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for running queries; True when none is left."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._queries:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def cancel_running(self) -> int:
        """Cancel every running query (as if its client had gone away); returns how
        many. Each releases its grant at its next look at its cancel event."""
        with self._lock:
            queries = list(self._queries)
        for running in queries:
            running.by_server = True  # before the event: the query reads it once cancelled
            running.cancel.set()
        return len(queries)

    def _enter(self, ticket: bytes, wanted: str | None) -> RunningQuery:
        """Count a query in; its id (``wanted``, the client's, unless a running query
        has it) names it in the log whatever happens."""
        with self._lock:
            if self._stopping:
                raise flight.FlightUnavailableError(
                    "the nexus-cache server is shutting down; retry against a running server"
                )
            if wanted is not None and self._find(wanted) is not None:
                log.info("query id %s is already running; the new query gets its own", wanted)
                wanted = None
            running = RunningQuery(wanted or uuid.uuid4().hex[:16], ticket, time.monotonic())
            self._queries.add(running)
        return running

    def _find(self, query_id: str) -> RunningQuery | None:
        """The running query ``query_id`` (the caller holds the lock)."""
        return next((r for r in self._queries if r.query_id == query_id), None)

    def cancel(self, query_id: str) -> dict[str, Any]:
        """Cancel the running query ``query_id`` as if its client had gone away:
        ``{"query_id", "found"}`` and, when found, the ``state`` it was in."""
        if not is_query_id(query_id):
            raise ConfigError(
                f"the cancel action's body {query_id[:80]!r} is not a query id; send the id "
                "alone (1 to 64 letters, digits, '-' or '_'), as list_flights or the "
                f"server's log names it, or as the client sent it in {QUERY_ID_HEADER}"
            )
        with self._lock:
            running = self._find(query_id)
        if running is None:
            return {"query_id": query_id, "found": False}
        log.info("query %s: cancel requested by a client (%s)", query_id, running.state)
        running.cancel.set()
        return {"query_id": query_id, "found": True, "state": running.state}

    def _leave(self, running: RunningQuery) -> None:
        with self._idle:
            self._queries.discard(running)
            self._finished += 1
            self._idle.notify_all()
        if self._board is not None:
            self._board.left(running.cancel)

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
            raise flight_error(exc) from None

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        start = time.perf_counter()
        with answering("do_get"):
            query, device = self._query(ticket.ticket)
        running = self._enter(ticket.ticket, call_id(context))
        if self._board is not None:
            self._board.started(running.cancel, query.kind, query.to_dict(), running.query_id)
        try:
            with self._watcher.watching(context, running.cancel):
                result = self._execute(query, device, start, running)
            with answering("do_get"):
                # where nothing recorded the fingerprint yet, the client computes
                # it from the rows it receives, only if it is read
                diagnostics = result.diagnostics.to_dict(fingerprint=False)
                schema = attach_diagnostics(result.table, diagnostics)
        except BaseException:
            self._leave(running)
            raise
        running.state = "streaming"
        executed = time.perf_counter()
        if result.table.nbytes <= BATCH_BYTES:
            # one batch: nothing to stop early, and Arrow's own stream writes it
            # without a call back into Python
            self._finish(query, diagnostics, (start, executed, None), "ok", running)
            return flight.RecordBatchStream(result.table.replace_schema_metadata(schema.metadata))
        stream = ResultStream(
            result.table,
            context,
            running,
            lambda outcome: self._finish(
                query, diagnostics, (start, executed, time.perf_counter()), outcome, running
            ),
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

    def _execute(self, query: Any, device: int | None, start: float, running: RunningQuery) -> Any:
        try:
            self._slot(running.cancel)
            running.state = "executing"
            try:
                return self._service.execute(
                    query, device=device, cancel=running.cancel, query_id=running.query_id
                )
            finally:
                self._slots.release()
        except flight.FlightError as exc:  # no slot within queue_timeout_s
            self._failed(query, start, running, "error", str(exc))
            raise
        except Exception as exc:
            cancelled = isinstance(exc, QueryCancelledError)
            if cancelled and running.by_server:
                exc = QueryCancelledError(
                    f"query {running.query_id} was cancelled because the nexus-cache server "
                    "is shutting down (its wait for running queries, shutdown_timeout_s, ran "
                    "out or a second signal cut it short); nothing the query held was kept; "
                    "run it again against a running server"
                )
            outcome = "cancelled" if cancelled else "error"
            if self._metrics is not None and isinstance(exc, AdmissionError):
                self._metrics.refused()
            self._failed(query, start, running, outcome, encode_error(exc)[0])
            if isinstance(exc, USER_ERRORS):  # QueryCancelledError included
                raise flight_error(exc) from None
            log.exception("query %s failed unexpectedly", running.query_id)
            raise flight_error(exc, internal=True) from None

    def _failed(
        self, query: Any, start: float, running: RunningQuery, outcome: str, message: str
    ) -> None:
        """Log, count and board a query that made no result (``outcome``: ``error`` or
        ``cancelled``)."""
        elapsed = time.perf_counter() - start
        text = json.dumps(query.to_dict(), separators=(",", ":"))
        log.info(
            "query %s %s %s %.1f ms: %s", running.query_id, text, outcome, elapsed * 1e3, message
        )
        if self._metrics is not None:
            self._metrics.observe(query.kind, outcome, elapsed, None)
        if self._board is not None:
            self._board.finished(running.cancel, outcome, elapsed, None, message)

    def _finish(
        self,
        query: Any,
        diag: dict[str, Any],
        stamps: tuple[float, float, float | None],
        outcome: str,
        running: RunningQuery,
    ) -> None:
        """Log, count and board a query whose result was made. ``stamps``: the
        ticket's arrival, the result ready to send, and the stream's end (None: a
        result of one batch, handed to gRPC whole)."""
        start, executed, streamed = stamps
        end = time.perf_counter() if streamed is None else streamed
        elapsed = end - start
        split = f"execute {(executed - start) * 1e3:.1f} ms"
        if streamed is not None:
            split += f", stream {(streamed - executed) * 1e3:.1f} ms"
        try:
            log.info(
                "query %s %s lakehouse=%s source=%s graph=%s rows=%d attempts=%d %s %.1f ms (%s)",
                diag["query_id"],
                json.dumps(diag["query"], separators=(",", ":")),
                diag["lakehouse"].get("status"),
                diag["source_cache"].get("status"),
                diag["graph_cache"].get("status"),
                diag["rows"],
                len(diag["attempts"]),
                outcome,
                elapsed * 1e3,
                split,
            )
            if self._metrics is not None:
                self._metrics.observe(query.kind, outcome, elapsed, diag)
            if self._board is not None:
                self._board.finished(running.cancel, outcome, elapsed, diag)
        finally:
            self._leave(running)

    def get_flight_info(
        self, context: Any, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        with answering("get_flight_info"):
            raw, plan, schema = self._described(descriptor)
            return flight.FlightInfo(
                schema,
                descriptor,
                [flight.FlightEndpoint(raw, [])],
                total_records=-1,
                total_bytes=int(plan["parquet_bytes"]),
                app_metadata=json.dumps(plan, default=str).encode(),
            )

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        with answering("get_schema"):
            return flight.SchemaResult(self._described(descriptor)[2])

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise flight_error(_not_served("do_put", "takes no uploads"))

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise flight_error(_not_served("do_exchange", "has no exchanges"))

    def _described(self, descriptor: flight.FlightDescriptor) -> tuple[bytes, Any, pa.Schema]:
        """``(ticket, plan, result schema)`` of a command descriptor."""
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise ConfigError(
                "this nexus-cache server serves only command descriptors holding a query's "
                "JSON (FlightDescriptor.for_command(...)); a path descriptor names no query"
            )
        raw = bytes(descriptor.command or b"")
        query, _ = self._query(raw)
        plan = self._service.plan(query)
        storage = self._service.config.storage_options
        return raw, plan, result_schema(query, plan, storage)

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        """The queries in the server now (``criteria`` is not used): the descriptor and
        endpoint hold each one's ticket; ``app_metadata`` its id, state and seconds."""
        with self._lock:
            queries = sorted(self._queries, key=lambda r: r.started)
        now = time.monotonic()
        for running in queries:
            facts = {
                "query_id": running.query_id,
                "state": running.state,
                "seconds": round(now - running.started, 3),
            }
            yield flight.FlightInfo(
                pa.schema([]),
                flight.FlightDescriptor.for_command(running.ticket),
                [flight.FlightEndpoint(running.ticket, [])],
                total_records=-1,
                total_bytes=-1,
                app_metadata=json.dumps(facts).encode(),
            )

    # -- actions -----------------------------------------------------------------------

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        with answering(f"action {action.type!r}"):
            yield self._action(action)

    def _action(self, action: flight.Action) -> flight.Result:
        kind = action.type
        if kind == "health":
            body: Any = self.health()
        elif kind == "reports":
            body = [r.to_dict() for r in self._service.device_cache_reports()]
        elif kind == "source-events":
            snapshots = self._service.caches.device_cache_source_event_snapshots()
            body = [s.to_dict() for s in snapshots]
        elif kind == "plan":
            query, _ = self._query(bytes(action.body or b""))
            body = self._service.plan(query)
        elif kind == "cancel":
            body = self.cancel(bytes(action.body or b"").decode("utf-8", "replace").strip())
        elif kind == "shutdown":
            log.info("shutdown requested by a client")
            self.begin_stop()
            if self._on_shutdown_request is not None:
                self._on_shutdown_request()
            body = {"status": "stopping"}
        else:
            raise ConfigError(f"action {kind!r} is not known; use one of: {', '.join(ACTIONS)}")
        return flight.Result(json.dumps(body, default=str, allow_nan=False).encode())

    def health(self) -> dict[str, Any]:
        """Readiness (the server listens only once warm-up is done) and a few figures."""
        from nexus_cache._version import __version__

        return {
            "status": "stopping" if self._stopping else "ready",
            "version": __version__,
            "backend": self._service.backend.name,
            "devices": list(self._service.caches.device_ids),
            "warm_up_s": self._warm_up_s,
            "running_queries": len(self._queries),
            "max_running_queries": self._settings.max_running_queries,
            "uptime_s": time.monotonic() - self._started,
            "rss_bytes": _rss_bytes(),
            "arrow_allocated_bytes": pa.total_allocated_bytes(),
        }


def _not_served(call: str, what: str) -> ConfigError:
    """The one-line error of a Flight call this server does not serve (pyarrow's
    default would send its traceback)."""
    return ConfigError(
        f"{call} is not served: this nexus-cache server {what}; run a query with do_get "
        "(a ticket holding the query's JSON), plan it with get_flight_info"
    )


def _rss_bytes() -> int | None:
    """This process's resident set (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
