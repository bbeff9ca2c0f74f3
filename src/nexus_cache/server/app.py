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

import contextlib
import dataclasses
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
    NexusCacheError,
    QueryCancelledError,
)
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

# Bytes per streamed batch: large enough that per-batch overhead vanishes,
# small enough that a cancelled client is noticed within a few milliseconds.
_BATCH_BYTES = 8 << 20
#: how often a running query's call is looked at for a client that went away
WATCH_INTERVAL_S = 0.05
_USER_ERRORS = (NexusCacheError, FileNotFoundError, NotADirectoryError, PermissionError)


def _flight_error(exc: BaseException, *, internal: bool = False) -> flight.FlightError:
    """The Flight error a client gets for ``exc``: its one line, and its class and
    line as JSON in ``extra_info``. Never a traceback."""
    message, info = encode_error(exc)
    if isinstance(exc, QueryCancelledError):
        return flight.FlightCancelledError(message, extra_info=info)
    if internal:
        return flight.FlightInternalError(message, extra_info=info)
    return flight.FlightServerError(message, extra_info=info)


@contextlib.contextmanager
def _answering(call: str) -> Iterator[None]:
    """A handler's errors as Flight errors: Flight's own as they are, the query's
    with their one line, an unexpected one logged here with its traceback and
    sent as an internal error (pyarrow would send the traceback)."""
    try:
        yield
    except flight.FlightError:
        raise
    except _USER_ERRORS as exc:
        raise _flight_error(exc) from None
    except Exception as exc:
        log.exception("%s failed unexpectedly", call)
        raise _flight_error(exc, internal=True) from None


@dataclasses.dataclass(eq=False)
class _Running:
    """A query in the server, from its ticket to its last batch."""

    query_id: str
    ticket: bytes
    started: float  # time.monotonic()
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: waiting (for a running-query slot), executing or streaming
    state: str = "waiting"
    #: cancelled by the server stopping (not by its client)
    by_server: bool = False


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
        self._queries: set[_Running] = set()
        self._finished = 0
        self._watcher = _CallWatcher()
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

    def _enter(self, ticket: bytes, wanted: str | None) -> _Running:
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
            running = _Running(wanted or uuid.uuid4().hex[:16], ticket, time.monotonic())
            self._queries.add(running)
        return running

    def _find(self, query_id: str) -> _Running | None:
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

    def _leave(self, running: _Running) -> None:
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
            raise _flight_error(exc) from None

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        start = time.perf_counter()
        with _answering("do_get"):
            query, device = self._query(ticket.ticket)
        running = self._enter(ticket.ticket, call_id(context))
        if self._board is not None:
            self._board.started(running.cancel, query.kind, query.to_dict(), running.query_id)
        try:
            with self._watcher.watching(context, running.cancel):
                result = self._execute(query, device, start, running)
            with _answering("do_get"):
                # where nothing recorded the fingerprint yet, the client computes
                # it from the rows it receives, only if it is read
                diagnostics = result.diagnostics.to_dict(fingerprint=False)
                schema = attach_diagnostics(result.table, diagnostics)
        except BaseException:
            self._leave(running)
            raise
        running.state = "streaming"
        executed = time.perf_counter()
        if result.table.nbytes <= _BATCH_BYTES:
            # one batch: nothing to stop early, and Arrow's own stream writes it
            # without a call back into Python
            self._finish(query, diagnostics, (start, executed, None), "ok", running)
            return flight.RecordBatchStream(result.table.replace_schema_metadata(schema.metadata))
        stream = _ResultStream(
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

    def _execute(self, query: Any, device: int | None, start: float, running: _Running) -> Any:
        try:
            self._slot(running.cancel)
            running.state = "executing"
            try:
                return self._service.execute(
                    query, device=device, cancel=running.cancel, query_id=running.query_id
                )
            finally:
                self._slots.release()
        except flight.FlightError:
            raise
        except Exception as exc:
            elapsed = time.perf_counter() - start
            text = json.dumps(query.to_dict(), separators=(",", ":"))
            cancelled = isinstance(exc, QueryCancelledError)
            if cancelled and running.by_server:
                exc = QueryCancelledError(
                    f"query {running.query_id} was cancelled because the nexus-cache server "
                    "is shutting down (its wait for running queries, shutdown_timeout_s, ran "
                    "out or a second signal cut it short); nothing the query held was kept; "
                    "run it again against a running server"
                )
            outcome = "cancelled" if cancelled else "error"
            message = encode_error(exc)[0]
            log.info(
                "query %s %s %s %.1f ms: %s",
                running.query_id,
                text,
                outcome,
                elapsed * 1e3,
                message,
            )
            if self._metrics is not None:
                if isinstance(exc, AdmissionError):
                    self._metrics.refused()
                self._metrics.observe(query.kind, outcome, elapsed, None)
            if self._board is not None:
                self._board.finished(running.cancel, outcome, elapsed, None, message)
            if isinstance(exc, _USER_ERRORS):  # QueryCancelledError included
                raise _flight_error(exc) from None
            log.exception("query %s failed unexpectedly", running.query_id)
            raise _flight_error(exc, internal=True) from None

    def _finish(
        self,
        query: Any,
        diag: dict[str, Any],
        stamps: tuple[float, float, float | None],
        outcome: str,
        running: _Running,
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
        with _answering("get_flight_info"):
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
        with _answering("get_schema"):
            return flight.SchemaResult(self._described(descriptor)[2])

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
        with _answering(f"action {action.type!r}"):
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

    One thread for all calls, started with the first and kept for the server's
    life: while no call is watched it sleeps until one is (no look every
    interval, and no thread started by a query that comes after a pause), so a
    query pays two lock acquisitions for its watch, and a wake-up of the
    thread only when it follows a pause. A call's context is only looked at
    under the lock, and :meth:`watching` takes it off under the lock before the
    handler returns: never after gRPC has freed the call. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._calls: dict[object, tuple[Any, threading.Event]] = {}
        self._thread: threading.Thread | None = None
        # the thread sleeps until a call is watched (rather than for an interval)
        self._asleep = False

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
            elif self._asleep:
                self._asleep = False
                self._wake.notify()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[key]

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._calls:
                    self._wake.wait(WATCH_INTERVAL_S)
                else:
                    self._asleep = True
                    while self._asleep:
                        self._wake.wait()
                for context, cancel in self._calls.values():
                    if not cancel.is_set() and context.is_cancelled():
                        cancel.set()


class _ResultStream:
    """Yields a result's batches, stopping when the client cancelled or went away
    or the query was cancelled (``running.cancel``: a server stopping, the
    ``cancel`` action, the status page); the latter ends the stream with a
    Flight error, so a client still reading never takes the batches sent so far
    for the whole result.

    ``done(outcome)`` runs exactly once: at the end of the stream, when it is
    stopped early, or when gRPC drops it unread (``__del__``).
    """

    def __init__(
        self,
        table: pa.Table,
        context: Any,
        running: _Running,
        done: Callable[[str], None],
    ) -> None:
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        self._batches = _coalesced(table, max(1, _BATCH_BYTES // per_row))
        self._rows = table.num_rows
        self._sent = 0
        self._context = context
        self._running = running
        self._done: Callable[[str], None] | None = done

    def __iter__(self) -> _ResultStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._context.is_cancelled():  # nobody left to tell
            self._close("cancelled")
            raise StopIteration
        if self._running.cancel.is_set():
            self._close("cancelled")
            # The client is still reading: a plain end of stream would hand it
            # the batches sent so far as if they were the whole result.
            cut = f"the result was cut short after {self._sent} of {self._rows} rows"
            raise _flight_error(
                QueryCancelledError(
                    f"the server is stopping: {cut} and is withdrawn; run the query again "
                    "against a running server"
                    if self._running.by_server
                    else f"query {self._running.query_id} was cancelled on the server (its "
                    f"cancel action or the status page): {cut} and is withdrawn"
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
