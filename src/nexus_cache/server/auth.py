"""Bearer-token authentication as Flight server middleware.

With a token configured, every call (``do_get``, ``get_flight_info``,
actions, listings) must carry the header ``authorization: Bearer <token>``;
any other call is refused with Flight's unauthenticated error before a
handler runs, so a refused call reaches no cache. The comparison takes the
same time whatever the header holds (``hmac.compare_digest``). Thread-safe.
"""

from __future__ import annotations

import hmac
from typing import Any

import pyarrow.flight as flight

__all__ = ["BearerTokenMiddlewareFactory", "bearer_header", "bearer_matches"]


def bearer_header(token: str) -> tuple[bytes, bytes]:
    """The call header a client sends with ``token``."""
    return (b"authorization", f"Bearer {token}".encode())


def bearer_matches(value: str | bytes | None, token: str) -> bool:
    """Whether an ``authorization`` header value is ``Bearer <token>`` (constant time)."""
    if value is None:
        return False
    given = value.encode("utf-8", "replace") if isinstance(value, str) else value
    return hmac.compare_digest(given, f"Bearer {token}".encode())


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Refuses every call whose ``authorization`` header is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        values = headers.get("authorization") or headers.get("Authorization") or []
        given = values[0] if len(values) == 1 else ""
        if isinstance(given, str):
            given = given.encode("utf-8", "replace")
        if not hmac.compare_digest(given, self._expected):
            raise flight.FlightUnauthenticatedError(
                "this nexus-cache server needs a token: send 'authorization: Bearer <token>' "
                "(NEXUS_SERVER_TOKEN for the nexus-cache client)"
            )
        return None
