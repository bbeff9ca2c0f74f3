"""The id a client names its query by, read from the call as Flight server middleware.

A ``do_get`` may carry the header :data:`~nexus_cache.server.wire.QUERY_ID_HEADER`
(the nexus-cache client sends a random one with each query). The server uses
it as the query's id, so its log, the status page and the attempt's evidence
name the query as the client does, and the ``cancel`` action finds it by that
id. An id that is not 1 to 64 letters, digits, ``-`` or ``_`` (or a header
sent twice) is ignored, and the server names the query itself. Thread-safe.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow.flight as flight

from nexus_cache.server.wire import QUERY_ID_HEADER
from nexus_cache.service.service import is_query_id

__all__ = ["MIDDLEWARE_KEY", "CallIdMiddlewareFactory", "call_id"]

log = logging.getLogger("nexus_cache.server")

#: the key the server installs :class:`CallIdMiddlewareFactory` under
MIDDLEWARE_KEY = "call-id"


class _CallId(flight.ServerMiddleware):
    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value


class CallIdMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Keeps a call's valid query id header for :func:`call_id`."""

    def start_call(
        self, info: Any, headers: dict[str, list[Any]]
    ) -> flight.ServerMiddleware | None:
        values = headers.get(QUERY_ID_HEADER) or []
        if not values:
            return None
        value = values[0]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if len(values) != 1 or not is_query_id(value):
            log.info(
                "ignored the call's %s header %.80r: not one id of 1 to 64 letters, digits, "
                "'-' or '_'; the server names the query itself",
                QUERY_ID_HEADER,
                value,
            )
            return None
        return _CallId(value)


def call_id(context: Any) -> str | None:
    """The query id the call's client sent (valid), or None."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return None if middleware is None else str(middleware.value)
