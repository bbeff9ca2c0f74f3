"""What travels between the server and its clients, in one place.

* A **ticket** (``do_get``) and a **command descriptor** (``get_flight_info``)
  hold a query's JSON (the format of ``docs/service.md``), or the envelope
  ``{"query": {...}, "device": N}`` to pin a device.
* The result stream's schema metadata holds the query's diagnostics under
  :data:`DIAGNOSTICS_KEY`: the document ``Diagnostics.to_dict()`` gives.
* An error's ``extra_info`` holds ``{"error": class name, "message": text}``,
  so a client raises the class the in-process service would have raised, with
  the same one-line message.
* A ``do_get`` may carry the call header :data:`QUERY_ID_HEADER`, the id its
  client chose for the call; the ``cancel`` action names a running query by it.
* Action results are JSON; a body is a query's JSON (``plan``) or a query
  id as bare text (``cancel``).

JSON only: nothing received is ever unpickled. Pure functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

import nexus_cache.errors as errors

__all__ = [
    "ACTIONS",
    "DIAGNOSTICS_KEY",
    "QUERY_ID_HEADER",
    "attach_diagnostics",
    "decode_error",
    "encode_error",
    "encode_ticket",
    "split_diagnostics",
]

DIAGNOSTICS_KEY = b"nexus.diagnostics"
#: the call header naming a ``do_get``'s query (1 to 64 letters, digits, ``-``, ``_``)
QUERY_ID_HEADER = "x-nexus-query-id"

#: action name -> what it returns (``list_actions``)
ACTIONS: Mapping[str, str] = {
    "health": "readiness, warm-up seconds, running queries, uptime (JSON)",
    "reports": "device_cache_reports() rows (JSON)",
    "source-events": "the source caches' fingerprinted event snapshots (JSON)",
    "plan": "the plan of the query in the body, without running it (JSON)",
    "shutdown": "stop gracefully: drain running queries, then the caches",
    "cancel": "cancel the running query whose id is the body; says whether one was found (JSON)",
}

# Classes a remote error may name besides nexus_cache.errors: what the
# in-process service raises for a missing or unreadable source.
_BUILTIN_ERRORS: Mapping[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError,
    "NotADirectoryError": NotADirectoryError,
    "IsADirectoryError": IsADirectoryError,
    "PermissionError": PermissionError,
}


def encode_ticket(query: Mapping[str, Any], device: int | None = None) -> bytes:
    """The ticket of ``query`` (its ``to_dict()`` form), pinned to ``device`` if given."""
    body: Mapping[str, Any] = query if device is None else {"query": query, "device": device}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def attach_diagnostics(table: pa.Table, diagnostics: Mapping[str, Any]) -> pa.Schema:
    """``table``'s schema with the diagnostics document added to its metadata."""
    metadata = dict(table.schema.metadata or {})
    metadata[DIAGNOSTICS_KEY] = json.dumps(diagnostics, allow_nan=False, default=str).encode()
    return table.schema.with_metadata(metadata)


def split_diagnostics(table: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """The table as the service produced it, and the diagnostics document it carried."""
    metadata = dict(table.schema.metadata or {})
    raw = metadata.pop(DIAGNOSTICS_KEY, None)
    if raw is None:
        raise errors.ServerError(
            "the server's result carries no diagnostics; is it a nexus-cache server?"
        )
    document = json.loads(raw)
    return table.replace_schema_metadata(metadata or None), document


#: longest error message sent: gRPC refuses a call whose error metadata (the
#: message, and ``extra_info`` holding it again) passes 8 to 16 KiB, and a
#: message can quote a ticket's strings (up to ``max_ticket_bytes``)
MAX_ERROR_CHARS = 2000


def encode_error(exc: BaseException) -> tuple[str, bytes]:
    """``(one-line message, extra_info)`` for a Flight error raised from ``exc``;
    a message over :data:`MAX_ERROR_CHARS` is cut, saying so."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if len(message) > MAX_ERROR_CHARS:
        cut = len(message) - MAX_ERROR_CHARS
        message = f"{message[:MAX_ERROR_CHARS]}... ({cut} more characters cut)"
    name = type(exc).__name__
    info = json.dumps({"error": name, "message": message}).encode()
    return message, info


def decode_error(extra_info: bytes | None, fallback: str) -> Exception:
    """The exception a client raises for a remote error (``ServerError`` when unknown)."""
    try:
        data = json.loads(extra_info or b"")
        name, message = str(data["error"]), str(data["message"])
    except (ValueError, TypeError, KeyError):
        return errors.ServerError(fallback)
    cls = _BUILTIN_ERRORS.get(name)
    if cls is None:
        found = getattr(errors, name, None) if name in errors.__all__ else None
        if isinstance(found, type) and issubclass(found, errors.NexusCacheError):
            cls = found
    return (cls or errors.ServerError)(message)
