"""What a failed call to a nexus-cache server raises, in words a user can act on.

An error the server sent with its JSON ``extra_info`` becomes the class the
in-process service raises (:func:`nexus_cache.server.wire.decode_error`),
whatever Flight exception carried it. Otherwise the failure is named from
the exception's kind and gRPC's text, never from its Python type alone (a
server may answer with another gRPC status code, which pyarrow raises as
another class): a refused token, a deadline that passed, a TLS handshake
that failed (no TLS on one side, an untrusted certificate), a host name
that does not resolve, a server that cannot be reached, a running server
that refuses the call (shutting down, every running-query slot busy). Only
a server that cannot be reached at all is told to be started. Pure functions; thread-safe.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from nexus_cache.errors import (
    QueryCancelledError,
    ServerAuthError,
    ServerError,
    ServerTimeoutError,
    ServerUnavailableError,
)
from nexus_cache.server.wire import decode_error

__all__ = ["ROOT_CERTS_HINT", "first_line", "translated", "translated_error"]

#: how a user names the CA that signs a server's certificate
ROOT_CERTS_HINT = (
    "pass the CA certificate that signs it with --tls-root-certs FILE or "
    "NEXUS_SERVER_TLS_ROOT_CERTS (Client(tls_root_certs=...))"
)

_FLIGHT_PREFIX = re.compile(r"^Flight returned [\w ]+ error, with message: ")
# gRPC's text for a server that does not speak TLS to a grpc+tls:// client
_NOT_TLS = ("wrong version number", "WRONG_VERSION_NUMBER", "http request", "HTTP_REQUEST")
_UNTRUSTED = ("certificate verify failed", "CERTIFICATE_VERIFY_FAILED")
_WRONG_NAME = ("Peer name", "not in peer certificate", "hostname mismatch")
# gRPC's text for a host name that resolves to no address
_UNRESOLVED = (
    "DNS resolution failed",
    "errors resolving",
    "address lookup failed",
    "Domain name not found",
    "Name or service not known",
)
# gRPC's text for a connection that could not be made at all
_UNREACHABLE = (
    *_UNRESOLVED,
    "failed to connect to all addresses",
    "Connection refused",
    "connection refused",
    "empty address list",
    "No route to host",
    "Network is unreachable",
)


@contextlib.contextmanager
def translated(url: str, timeout: float | None) -> Iterator[None]:
    """Raise :func:`translated_error` of any Flight or Arrow error of the block."""
    try:
        yield
    except (flight.FlightError, pa.ArrowException) as exc:
        raise translated_error(exc, url, timeout) from None


def translated_error(exc: BaseException, url: str, timeout: float | None) -> Exception:
    """The package's error for ``exc``, a failed call to the server at ``url``."""
    text = first_line(str(exc))
    if isinstance(exc, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)):
        return ServerAuthError(f"the nexus-cache server at {url} refused the call: {text}")
    info = getattr(exc, "extra_info", None)
    if info:
        # the server's own error, whatever status code (and so class) carried it
        return decode_error(info, f"the nexus-cache server at {url} failed: {text}")
    if isinstance(exc, flight.FlightTimedOutError) or "Deadline Exceeded" in text:
        limit = "its timeout" if timeout is None else f"timeout={timeout:g} s"
        return ServerTimeoutError(
            f"the nexus-cache server at {url} did not answer within {limit} ({text}); "
            "the server may be busy: raise the timeout, or retry later"
        )
    if isinstance(exc, flight.FlightCancelledError):
        return QueryCancelledError(f"the call to the nexus-cache server at {url} was cancelled")
    if isinstance(exc, flight.FlightUnavailableError) or _any(text, _UNREACHABLE):
        return _unavailable(url, text)
    return ServerError(f"the nexus-cache server at {url} failed the call: {text}")


def _unavailable(url: str, text: str) -> ServerError:
    """A call that got no answer from the server: say why, and what to change."""
    tls = url.startswith("grpc+tls://")
    if tls and _any(text, _NOT_TLS):
        return ServerUnavailableError(
            f"the server at {url} does not speak TLS ({text}); use grpc://HOST:PORT, or "
            "start the server with --tls-cert and --tls-key"
        )
    if tls and _any(text, _UNTRUSTED):
        return ServerUnavailableError(
            f"the nexus-cache server at {url} presented a certificate this client does not "
            f"trust ({_tls_reason(text)}); {ROOT_CERTS_HINT}"
        )
    if tls and _any(text, _WRONG_NAME):
        return ServerUnavailableError(
            f"the certificate of the nexus-cache server at {url} does not name that host "
            f"({_tls_reason(text)}); connect with a name the certificate lists"
        )
    if not tls and "Socket closed" in text:
        return ServerUnavailableError(
            f"the server at {url} closed the connection before answering ({text}); if it "
            "serves TLS (started with --tls-cert), use grpc+tls://HOST:PORT"
        )
    if "handshake" in text.lower():
        return ServerUnavailableError(
            f"the TLS handshake with the server at {url} failed ({_tls_reason(text)}); "
            "check grpc:// against grpc+tls:// and the certificates"
        )
    if _any(text, _UNRESOLVED):
        return ServerUnavailableError(
            f"the host of the nexus-cache server URL {url} does not resolve ({text}); fix "
            "the host name in --server / NEXUS_SERVER_URL"
        )
    if _any(text, _UNREACHABLE):
        return ServerUnavailableError(
            f"the nexus-cache server at {url} is unavailable: {text}; start it with "
            "`nexus-cache serve`, or fix --server / NEXUS_SERVER_URL"
        )
    # the server answered, and refused: shutting down, or every slot busy
    return ServerUnavailableError(
        f"the nexus-cache server at {url} is running but did not take the call: {text}"
    )


def _tls_reason(text: str) -> str:
    """OpenSSL's reason in gRPC's handshake text (the part after ``routines::``)."""
    match = re.search(r"routines:[A-Za-z_]*:(.+)$", text)
    return match.group(1).strip() if match else text


def _any(text: str, needles: tuple[str, ...]) -> bool:
    return any(needle in text for needle in needles)


def first_line(text: str) -> str:
    """A Flight error's own message, without pyarrow's prefix and gRPC's debug context."""
    text = _FLIGHT_PREFIX.sub("", text)
    text = text.split(". Detail:", 1)[0].split(". gRPC client debug context", 1)[0]
    text = text.split(". Client context:", 1)[0]
    return " ".join(text.split())
