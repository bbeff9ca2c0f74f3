"""The nexus-cache client of a query server (``nexus-cache serve``).

``Client(url, token=None).execute(query)`` returns the same
:class:`~nexus_cache.service.QueryResult` as ``QueryService.execute``: the
result table (streamed as Arrow record batches) and its diagnostics, the
server's statuses, timings, attempts and result fingerprint. Errors of the
query arrive as the class the in-process service raises, with the same
message; an unreachable server raises :class:`ServerUnavailableError` naming
the URL, a refused token :class:`ServerAuthError`.

A client is thread-safe (gRPC channels are); one per process is enough.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import pyarrow.flight as flight

from nexus_cache.errors import ConfigError, ServerAuthError, ServerError, ServerUnavailableError
from nexus_cache.server.auth import bearer_header
from nexus_cache.server.wire import decode_error, encode_ticket, split_diagnostics
from nexus_cache.service.queries import Query, query_from_dict, query_from_json
from nexus_cache.service.result import AttemptRecord, Diagnostics, QueryResult

__all__ = ["Client"]

_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")
# the Flight errors whose extra_info names the error's class (server.wire.encode_error)
_CARRYING_CLASS = (
    flight.FlightServerError,
    flight.FlightCancelledError,
    flight.FlightInternalError,
)


def _query_dict(query: Query | Mapping[str, Any] | str) -> dict[str, Any]:
    """The query's JSON form, validated here so a bad one fails before any call."""
    if isinstance(query, str):
        return query_from_json(query).to_dict()
    if isinstance(query, Mapping):
        return query_from_dict(query).to_dict()
    if hasattr(query, "to_dict") and getattr(query, "kind", None) in ("scan", "count", "graph"):
        return query.to_dict()
    raise ConfigError(
        f"query={query!r} is not accepted; use a Scan, Count or GraphQuery, its to_dict() form "
        "or its JSON text"
    )


def _diagnostics(document: Mapping[str, Any]) -> Diagnostics:
    fields = dict(document)
    fields["attempts"] = tuple(AttemptRecord(**a) for a in fields["attempts"])
    return Diagnostics(**fields)


class Client:
    """Queries a nexus-cache server at ``url`` (``grpc://host:port`` or ``grpc+tls://...``).

    ``token``: sent as ``authorization: Bearer <token>`` on every call.
    ``tls_root_certs``: PEM bytes of the CA (or self-signed certificate) that
    signs the server's certificate; default: the system's roots.
    ``timeout``: seconds per call (None: no limit).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        tls_root_certs: bytes | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(_SCHEMES):
            raise ConfigError(
                f"server URL {url!r} is not accepted; use grpc://HOST:PORT or grpc+tls://HOST:PORT"
            )
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigError("the server token is empty; give a token or leave it unset")
        self.url = url
        kwargs: dict[str, Any] = {}
        if tls_root_certs is not None:
            kwargs["tls_root_certs"] = tls_root_certs
        try:
            self._flight = flight.FlightClient(url, **kwargs)
        except Exception as exc:  # a malformed host or port
            raise ConfigError(f"server URL {url!r} cannot be used ({exc})") from None
        headers = [bearer_header(token.strip())] if token is not None else []
        self._options = flight.FlightCallOptions(headers=headers, timeout=timeout)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- queries ---------------------------------------------------------------------

    def execute(
        self, query: Query | Mapping[str, Any] | str, *, device: int | None = None
    ) -> QueryResult:
        """Run ``query`` on the server; the result and diagnostics as in-process."""
        ticket = flight.Ticket(encode_ticket(_query_dict(query), device))
        with self._errors():
            table = self._flight.do_get(ticket, self._options).read_all()
        table, document = split_diagnostics(table)
        return QueryResult(table, _diagnostics(document))

    def plan(self, query: Query | Mapping[str, Any] | str) -> dict[str, Any]:
        """The server's plan of ``query`` (``get_flight_info``): objects, planned
        lakehouse statuses, ``grant_bytes``, ``parquet_bytes``; nothing runs."""
        descriptor = flight.FlightDescriptor.for_command(encode_ticket(_query_dict(query)))
        with self._errors():
            info = self._flight.get_flight_info(descriptor, self._options)
        return dict(json.loads(info.app_metadata))

    # -- actions ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``{"status": "ready", "warm_up_s": ..., "running_queries": ..., ...}``."""
        return dict(self._action("health"))

    def reports(self) -> list[dict[str, Any]]:
        """The server's ``device_cache_reports()``, one dict per device."""
        return list(self._action("reports"))

    def source_events(self) -> list[dict[str, Any]]:
        """The server's source-cache event snapshots, one dict per device."""
        return list(self._action("source-events"))

    def shutdown(self) -> dict[str, Any]:
        """Ask the server to stop gracefully (its token is needed like any call)."""
        return dict(self._action("shutdown"))

    def _action(self, name: str, body: bytes = b"") -> Any:
        with self._errors():
            results = list(self._flight.do_action(flight.Action(name, body), self._options))
        return json.loads(results[0].body.to_pybytes())

    # -- plumbing --------------------------------------------------------------------

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return _translate(self.url)

    def close(self) -> None:
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


@contextlib.contextmanager
def _translate(url: str) -> Iterator[None]:
    """Turns Flight errors into the package's own, naming the server URL."""
    try:
        yield
    except flight.FlightError as exc:
        text = _first_line(str(exc))
        if isinstance(exc, flight.FlightUnauthenticatedError):
            raise ServerAuthError(
                f"the nexus-cache server at {url} refused the call: {text}"
            ) from None
        if isinstance(exc, (flight.FlightUnavailableError, flight.FlightTimedOutError)):
            raise ServerUnavailableError(
                f"the nexus-cache server at {url} is unavailable: {text}; start it with "
                "`nexus-cache serve`, or fix --server / NEXUS_SERVER_URL"
            ) from None
        if isinstance(exc, _CARRYING_CLASS) and exc.extra_info:
            raise decode_error(exc.extra_info, text) from None
        raise ServerError(f"the nexus-cache server at {url} failed: {text}") from None


def _first_line(text: str) -> str:
    """A Flight error's own message, without gRPC's debug context."""
    for prefix in ("Flight returned unavailable error, with message: ",):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    text = text.split(". Detail:", 1)[0].split(". gRPC client debug context", 1)[0]
    return " ".join(text.split())
