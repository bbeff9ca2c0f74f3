"""The nexus-cache client of a query server (``nexus-cache serve``).

``Client(url, token=None).execute(query)`` returns the same
:class:`~nexus_cache.service.QueryResult` as ``QueryService.execute``: the
result table (streamed as Arrow record batches) and its diagnostics, the
server's statuses, timings, attempts and result fingerprint. Errors of the
query arrive as the class the in-process service raises, with the same
message; an unreachable server raises :class:`ServerUnavailableError` naming
the URL and saying why (not running, no TLS, an untrusted certificate, shutting
down), a refused token :class:`ServerAuthError`, a call past its ``timeout``
:class:`ServerTimeoutError`.

Ctrl-C (``KeyboardInterrupt``) during a call is raised at once: a call made
from the main thread runs in a worker thread, kept from one call to the next
(:mod:`nexus_cache.client._calls`). ``execute`` names
each call with a random id (the header ``x-nexus-query-id``); interrupted, it
cancels a result already streaming and asks the server, on a connection of
its own, to cancel that query (the ``cancel`` action), so a process that goes
on after the interrupt (a notebook) leaves nothing running.

A client is thread-safe (gRPC channels are); one per process is enough.
``close()`` while a call still runs (one that an interrupt abandoned, or one
of another thread) closes the connection once the last such call returns:
closing a Flight connection under a running call crashes the process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from nexus_cache.client._calls import Cancellable, interruptible
from nexus_cache.client._errors import translated
from nexus_cache.errors import CacheClosedError, ConfigError
from nexus_cache.server.auth import bearer_header
from nexus_cache.server.settings import DEFAULT_PORT, header_safe
from nexus_cache.server.wire import QUERY_ID_HEADER, encode_ticket, split_diagnostics
from nexus_cache.service.queries import Query, as_query
from nexus_cache.service.result import AttemptRecord, Diagnostics, QueryResult, defer_fingerprint

__all__ = ["Client"]

_T = TypeVar("_T")

log = logging.getLogger("nexus_cache.client")

_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")
# seconds an interrupted call's cancel may take: the interrupt waits for it
_CANCEL_TIMEOUT_S = 2.0


def _diagnostics(document: Mapping[str, Any], table: pa.Table) -> Diagnostics:
    fields = dict(document)
    fields["attempts"] = tuple(AttemptRecord(**a) for a in fields["attempts"])
    # a server that writes no evidence leaves the fingerprint to whoever reads it:
    # the same function of the table, computed here from the rows received
    deferred = fields.get("result_fingerprint") is None
    if deferred:
        fields["result_fingerprint"] = ""
    diagnostics = Diagnostics(**fields)
    if deferred:
        defer_fingerprint(diagnostics, table)
    return diagnostics


class Client:
    """Queries a nexus-cache server at ``url`` (``grpc://host:port`` or ``grpc+tls://...``).

    ``token``: sent as ``authorization: Bearer <token>`` on every call.
    ``tls_root_certs``: the CA (or self-signed certificate) that signs the
    server's certificate, as PEM bytes or the path of a PEM file; default: the
    system's roots.
    ``timeout``: seconds per call (None: no limit); a call past it raises
    :class:`~nexus_cache.errors.ServerTimeoutError`.

    Creating a client connects to nothing: the first call does. A client may
    be shared by threads; close it (or use it as a context manager) when done.

    Parameters
    ----------
    url : str
        The server's location, ``grpc://HOST:PORT`` or ``grpc+tls://HOST:PORT``.
    token : str or None, optional
        The server's token (``NEXUS_SERVER_TOKEN`` on the server).
    tls_root_certs : bytes, str, os.PathLike or None, optional
        PEM bytes, or the path of a PEM file, of the CA that signs the
        server's certificate.
    timeout : float or None, optional
        Seconds per call.

    Raises
    ------
    ConfigError
        The URL's scheme is not ``grpc`` or ``grpc+tls``, the URL cannot be
        used, or the token is empty or holds a character other than
        printable ASCII.

    Examples
    --------
    >>> from nexus_cache.client import Client
    >>> with Client("grpc://127.0.0.1:8815", timeout=30) as client:
    ...     client
    Client('grpc://127.0.0.1:8815')
    >>> Client("http://127.0.0.1:8815")
    Traceback (most recent call last):
    ...
    nexus_cache.errors.ConfigError: server URL 'http://127.0.0.1:8815' is not accepted; use ...

    With ``nexus-cache serve`` listening on port 8815:

    >>> with Client("grpc://127.0.0.1:8815") as client:  # doctest: +SKIP
    ...     client.execute({"type": "scan", "source": "/data/facts"}).table.num_rows
    65536
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        tls_root_certs: bytes | str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(_SCHEMES):
            raise ConfigError(
                f"server URL {url!r} is not accepted; use grpc://HOST:PORT or grpc+tls://HOST:PORT"
            )
        if _no_port(url):
            # gRPC would take port 443 (grpc+tls) or 80 without a word, where no
            # nexus-cache server listens unless told to
            raise ConfigError(
                f"server URL {url!r} names no port; use grpc://HOST:PORT or "
                f"grpc+tls://HOST:PORT (nexus-cache serve listens on {DEFAULT_PORT} "
                "unless given --port)"
            )
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigError("the server token is empty; give a token or leave it unset")
        if token is not None and not header_safe(token.strip()):
            raise ConfigError(
                "the server token holds a character that a call header cannot carry; use "
                "the server's token (NEXUS_SERVER_TOKEN for the nexus-cache commands) as "
                "printable ASCII, without accents, tabs or line breaks"
            )
        self.url = url
        self._timeout = timeout
        # what each connection to the server is made with (the cancel's own too)
        self._connect: dict[str, Any] = {}
        if tls_root_certs is not None:
            self._connect["tls_root_certs"] = _root_certs(tls_root_certs)
        try:
            self._flight = flight.FlightClient(url, **self._connect)
        except Exception as exc:  # a malformed host or port
            raise ConfigError(f"server URL {url!r} cannot be used ({exc})") from None
        self._headers = [bearer_header(token.strip())] if token is not None else []
        self._options = flight.FlightCallOptions(headers=self._headers, timeout=timeout)
        # calls running on self._flight, and whether close() waits for them
        self._use_lock = threading.Lock()
        self._running = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- queries ---------------------------------------------------------------------

    def execute(
        self, query: Query | Mapping[str, Any] | str, *, device: int | None = None
    ) -> QueryResult:
        """Run ``query`` on the server; the result and diagnostics as in-process.

        The call carries a random id (the server's log and the evidence name the
        query by it). ``KeyboardInterrupt`` (or any exception raised while the
        call waits) asks the server to cancel the query, then propagates.
        """
        ticket = flight.Ticket(encode_ticket(as_query(query).to_dict(), device))
        call_id = secrets.token_hex(8)
        options = flight.FlightCallOptions(
            headers=[*self._headers, (QUERY_ID_HEADER.encode(), call_id.encode())],
            timeout=self._timeout,
        )

        def read(watch: Callable[[Cancellable], None]) -> Any:
            reader = self._flight.do_get(ticket, options)
            watch(reader)  # from here on an interrupt cancels the stream
            return reader.read_all()

        with self._errors():
            table = interruptible(self._using(read), lambda: self._cancel(call_id))
        table, document = split_diagnostics(table)
        return QueryResult(table, _diagnostics(document, table))

    def plan(self, query: Query | Mapping[str, Any] | str) -> dict[str, Any]:
        """The server's plan of ``query`` (``get_flight_info``): objects, planned
        lakehouse statuses, ``grant_bytes``, ``parquet_bytes``; nothing runs.

        Parameters
        ----------
        query : Query, mapping or str
            A query object, its JSON form as a mapping, or JSON text; it is
            checked here before any call.

        Returns
        -------
        dict
            The plan, as the server's JSON document.

        Raises
        ------
        ConfigError
            The query is not valid (no call is made).
        ServerUnavailableError
            The server cannot be reached.
        ServerAuthError
            The server refused the token.
        ServerTimeoutError
            The call took longer than the client's ``timeout``.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> client.plan({"type": "nope"})
        Traceback (most recent call last):
        ...
        nexus_cache.errors.ConfigError: query type='nope' is not accepted; use one of: scan, ...
        >>> plan = client.plan({"type": "scan", "source": "/data/facts"})  # doctest: +SKIP
        >>> plan["parquet_bytes"]  # doctest: +SKIP
        1048576
        >>> client.close()
        """
        descriptor = flight.FlightDescriptor.for_command(encode_ticket(as_query(query).to_dict()))
        with self._errors():
            info = interruptible(
                self._using(lambda _: self._flight.get_flight_info(descriptor, self._options))
            )
        return dict(json.loads(info.app_metadata))

    # -- actions ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``{"status": "ready", "warm_up_s": ..., "running_queries": ..., ...}``.

        Answers once the server listens (after its warm-up) and while it runs.

        Returns
        -------
        dict
            ``status`` (``ready`` or ``stopping``), ``version``, ``backend``,
            ``devices``, ``warm_up_s``, ``running_queries`` and more.

        Raises
        ------
        ServerUnavailableError
            The server cannot be reached.
        ServerAuthError
            The server refused the token.
        ServerTimeoutError
            The call took longer than the client's ``timeout``.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> client.health()["status"]  # doctest: +SKIP
        'ready'
        >>> client.close()
        """
        return dict(self._action("health"))

    def reports(self) -> list[dict[str, Any]]:
        """The server's ``device_cache_reports()``, one dict per device.

        Returns
        -------
        list of dict
            One report per device: the ledger's cache fields and the
            allocation domain's usage.

        Raises
        ------
        ServerUnavailableError
            The server cannot be reached.
        ServerAuthError
            The server refused the token.
        ServerTimeoutError
            The call took longer than the client's ``timeout``.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> len(client.reports())  # doctest: +SKIP
        1
        >>> client.close()
        """
        return list(self._action("reports"))

    def source_events(self) -> list[dict[str, Any]]:
        """The server's source-cache event snapshots, one dict per device.

        Returns
        -------
        list of dict
            One snapshot of the decoded source cache's events per device.

        Raises
        ------
        ServerUnavailableError
            The server cannot be reached.
        ServerAuthError
            The server refused the token.
        ServerTimeoutError
            The call took longer than the client's ``timeout``.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> len(client.source_events())  # doctest: +SKIP
        1
        >>> client.close()
        """
        return list(self._action("source-events"))

    def shutdown(self) -> dict[str, Any]:
        """Ask the server to stop gracefully (its token is needed like any call).
        Running queries finish; new ones are refused.

        Returns
        -------
        dict
            The server's answer, ``{"status": "stopping"}``.

        Raises
        ------
        ServerUnavailableError
            The server cannot be reached.
        ServerAuthError
            The server refused the token.
        ServerTimeoutError
            The call took longer than the client's ``timeout``.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> client.shutdown()  # doctest: +SKIP
        {'status': 'stopping'}
        >>> client.close()
        """
        return dict(self._action("shutdown"))

    def _action(self, name: str, body: bytes = b"") -> Any:
        action = flight.Action(name, body)
        with self._errors():
            results = interruptible(
                self._using(lambda _: list(self._flight.do_action(action, self._options)))
            )
        return json.loads(results[0].body.to_pybytes())

    def _cancel(self, call_id: str) -> None:
        """Ask the server to cancel the query ``call_id``, on a connection of its own
        (pyarrow cannot cancel a call before its first message arrives); a failure
        is logged at debug level and goes no further."""
        try:
            client = flight.FlightClient(self.url, **self._connect)
            try:
                options = flight.FlightCallOptions(
                    headers=self._headers, timeout=_CANCEL_TIMEOUT_S
                )
                action = flight.Action("cancel", call_id.encode())
                results = list(client.do_action(action, options))
            finally:
                client.close()
            found = json.loads(results[0].body.to_pybytes()).get("found")
            log.debug("query %s: cancel sent to %s (found: %s)", call_id, self.url, found)
        except Exception as exc:
            log.debug("query %s: the cancel could not be sent to %s (%s)", call_id, self.url, exc)

    # -- plumbing --------------------------------------------------------------------

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return translated(self.url, self._timeout)

    def _using(self, work: Callable[[Callable[[Cancellable], None]], _T]) -> Callable[..., _T]:
        """``work``, counted as a call on the connection while it runs, so that
        :meth:`close` leaves the connection open until it returns. A call begun
        after ``close()`` raises :class:`CacheClosedError`."""

        def counted(watch: Callable[[Cancellable], None]) -> _T:
            with self._use_lock:
                if self._closed:
                    raise CacheClosedError(
                        f"the client of {self.url} is closed; make a new Client to call it"
                    )
                self._running += 1
            try:
                return work(watch)
            finally:
                with self._use_lock:
                    self._running -= 1
                    last = self._closed and self._running == 0
                if last:
                    self._flight.close()

        return counted

    def close(self) -> None:
        """Close the connection; the client makes no call after it.

        Examples
        --------
        >>> from nexus_cache.client import Client
        >>> client = Client("grpc://127.0.0.1:8815")
        >>> client.close()
        """
        with self._use_lock:
            if self._closed:
                return
            self._closed = True
            if self._running:
                return  # the last running call closes it
        self._flight.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _no_port(url: str) -> bool:
    """Whether ``url`` (``grpc://...``) names no port (a malformed one is left to
    Flight's own check)."""
    try:
        return urlsplit(url).port is None
    except ValueError:  # a port that is no number, or out of range
        return False


def _root_certs(value: bytes | str | os.PathLike[str]) -> bytes:
    """PEM bytes of ``tls_root_certs`` (bytes as given, else the file it names)."""
    setting = "tls_root_certs (--tls-root-certs, NEXUS_SERVER_TLS_ROOT_CERTS)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        pem, where = bytes(value), setting
    elif isinstance(value, (str, os.PathLike)):
        where = f"{setting} file {os.fspath(value)!r}"
        try:
            pem = Path(value).expanduser().read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"{where} cannot be read ({exc.strerror or exc}); name the PEM file of the CA "
                "certificate that signs the server's"
            ) from None
    else:
        raise ConfigError(
            f"{setting}={value!r} is not accepted; give PEM bytes or the path of a PEM file"
        )
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(
            f"{where} holds no PEM certificate (no '-----BEGIN CERTIFICATE-----' line); give "
            "the CA certificate that signs the server's, in PEM"
        )
    return pem
