"""Token authentication as Flight server middleware.

With a token configured, every call (``do_get``, ``get_flight_info``,
actions, listings, the handshake) must carry the header ``authorization``
with one of:

* ``Bearer <token>``: the scheme name in any case (RFC 7235);
* ``Basic <base64 of user:token>``: any user name, the token as password.
  This is what ``FlightClient.authenticate_basic_token(user, token)`` sends
  in its handshake; the answer carries ``authorization: Bearer <token>``,
  the header the client then sends with every call.

Any other call is refused with Flight's unauthenticated error before a
handler runs, so a refused call reaches no cache. The refusal says whether
the header was missing, malformed or held the wrong token; it is logged
(never the token) and counted through ``on_refused(reason)``. The token is
compared in constant time (``hmac.compare_digest``). Thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Callable
from typing import Any, NoReturn

import pyarrow.flight as flight

from nexus_cache.errors import ServerAuthError
from nexus_cache.server.wire import encode_error

__all__ = [
    "REFUSAL_REASONS",
    "BasicHandshake",
    "BearerTokenMiddlewareFactory",
    "bearer_header",
    "bearer_matches",
]

log = logging.getLogger("nexus_cache.server")

#: why a call was refused: the ``reason`` label of ``nexus_server_auth_refused_total``
REFUSAL_REASONS = ("missing", "malformed", "wrong")

_MESSAGES = {
    "missing": (
        "this nexus-cache server needs a token and the call carried none: send "
        "'authorization: Bearer <token>' (NEXUS_SERVER_TOKEN for the nexus-cache client)"
    ),
    "malformed": (
        "the call's authorization header is not 'Bearer <token>' or 'Basic <base64 of "
        "user:token>'; send 'authorization: Bearer <token>' (NEXUS_SERVER_TOKEN for the "
        "nexus-cache client)"
    ),
    "wrong": (
        "the token sent is not this nexus-cache server's token; send the content of its "
        "--token-file or NEXUS_SERVER_TOKEN"
    ),
}

# what the log says of each refusal (never the token itself)
_LOGGED = {
    "missing": "no authorization header",
    "malformed": "malformed authorization header",
    "wrong": "wrong token",
}


def bearer_header(token: str) -> tuple[bytes, bytes]:
    """The call header a client sends with ``token``."""
    return (b"authorization", f"Bearer {token}".encode())


class BasicHandshake(flight.ServerAuthHandler):
    """Lets the Flight handshake through: Flight answers a handshake only when the
    server has an auth handler. The token itself is checked by
    :class:`BearerTokenMiddlewareFactory`, which refuses every call (the
    handshake included) that does not carry it; install the two together."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None  # the middleware checked the call's header and answers the bearer one

    def is_valid(self, token: bytes) -> bytes:
        return b""  # the middleware checked the call's header before this runs


class _BasicAnswer(flight.ServerMiddleware):
    """Answers a call authenticated with ``Basic`` with the bearer header to send."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._token}"}


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Refuses every call that does not carry ``token`` (see the module's text)."""

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self._token = token
        self._expected = token.encode()
        self._on_refused = on_refused

    def start_call(
        self, info: Any, headers: dict[str, list[Any]]
    ) -> flight.ServerMiddleware | None:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            self._refuse(info, "missing")
        if len(values) != 1:
            self._refuse(info, "malformed")
        scheme, secret = _credentials(values[0])
        if secret is None:
            self._refuse(info, "malformed")
        if not hmac.compare_digest(secret.encode("utf-8", "replace"), self._expected):
            self._refuse(info, "wrong")
        return _BasicAnswer(self._token) if scheme == "basic" else None

    def _refuse(self, info: Any, reason: str) -> NoReturn:
        method = getattr(getattr(info, "method", None), "name", "unknown").lower()
        log.warning("refused a %s call: %s", method, _LOGGED[reason])
        if self._on_refused is not None:
            self._on_refused(reason)
        message, extra = encode_error(ServerAuthError(_MESSAGES[reason]))
        raise flight.FlightUnauthenticatedError(message, extra_info=extra)


def bearer_matches(value: str | bytes | None, token: str) -> bool:
    """Whether an ``authorization`` header value carries ``token`` (``Bearer``
    or ``Basic``, the scheme in any case), compared in constant time."""
    if value is None:
        return False
    _scheme, secret = _credentials(value)
    return secret is not None and hmac.compare_digest(
        secret.encode("utf-8", "replace"), token.encode()
    )


def _credentials(value: str | bytes) -> tuple[str, str | None]:
    """``(scheme, secret)`` of an ``authorization`` header value: the scheme
    lower-cased (RFC 7235), the secret None where the value is neither
    ``Bearer <token>`` nor ``Basic <base64 of user:token>``."""
    given = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    scheme, _, credentials = given.strip().partition(" ")
    scheme, credentials = scheme.lower(), credentials.strip()
    if not credentials:
        return scheme, None
    if scheme == "bearer":
        return scheme, credentials
    if scheme == "basic":
        return scheme, _basic_password(credentials)
    return scheme, None


def _basic_password(credentials: str) -> str | None:
    """The password of ``Basic`` credentials (``user:password``, base64), None when
    they do not decode."""
    try:
        text = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    _user, colon, password = text.partition(":")
    return password if colon and password else None
