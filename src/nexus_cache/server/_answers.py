"""A Flight handler's errors as the Flight errors its client gets.

A query's own errors reach the client with their one line (and their class in
``extra_info``, :func:`~nexus_cache.server.wire.encode_error`); a cancelled
query as Flight's cancelled error; an unexpected failure as its internal
error, its traceback going to the server's log only (pyarrow would send it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pyarrow.flight as flight

from nexus_cache.errors import NexusCacheError, QueryCancelledError
from nexus_cache.server.wire import encode_error

__all__ = ["USER_ERRORS", "answering", "flight_error"]

log = logging.getLogger("nexus_cache.server")

#: errors of the query (or of what it names), sent with their one line
USER_ERRORS = (NexusCacheError, FileNotFoundError, NotADirectoryError, PermissionError)


def flight_error(exc: BaseException, *, internal: bool = False) -> flight.FlightError:
    """The Flight error a client gets for ``exc``: its one line, and its class and
    line as JSON in ``extra_info``. Never a traceback."""
    message, info = encode_error(exc)
    if isinstance(exc, QueryCancelledError):
        return flight.FlightCancelledError(message, extra_info=info)
    if internal:
        return flight.FlightInternalError(message, extra_info=info)
    return flight.FlightServerError(message, extra_info=info)


@contextlib.contextmanager
def answering(call: str) -> Iterator[None]:
    """A handler's errors as Flight errors: Flight's own as they are, the query's
    with their one line, an unexpected one logged here with its traceback and
    sent as an internal error (pyarrow would send the traceback)."""
    try:
        yield
    except flight.FlightError:
        raise
    except USER_ERRORS as exc:
        raise flight_error(exc) from None
    except Exception as exc:
        log.exception("%s failed unexpectedly", call)
        raise flight_error(exc, internal=True) from None
