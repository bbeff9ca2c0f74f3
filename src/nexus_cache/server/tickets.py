"""Turning a ticket (or command descriptor) into a query the server may run.

Checks, in order: the ticket's size (``max_ticket_bytes``), then the query
itself, read by the service's one front door
(:func:`~nexus_cache.service.queries.as_request`: its JSON, the device
envelope, the query's fields, with the messages every front end gives), then
the source it reads against ``allowed_roots`` (the service checks every object
the source expands to again when it lists it: ``ServiceConfig.allowed_roots``).
Every refusal is a :class:`ConfigError` naming what to change. Pure functions;
thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from nexus_cache._roots import location_allowed as source_allowed
from nexus_cache._sizes import format_size
from nexus_cache.errors import ConfigError
from nexus_cache.service.queries import Query, as_request

__all__ = ["parse_ticket", "source_allowed"]


def parse_ticket(
    raw: bytes, *, max_bytes: int, allowed_roots: Sequence[str] | None
) -> tuple[Query, int | None]:
    """``(query, device)`` from a ticket's bytes; ConfigError when it cannot be run."""
    if len(raw) > max_bytes:
        raise ConfigError(
            f"the ticket is {len(raw)} B, over max_ticket_bytes={max_bytes} "
            f"({format_size(max_bytes)}); send a smaller query or raise "
            "NEXUS_SERVER_MAX_TICKET_BYTES"
        )
    query, device = as_request(raw)
    source = query.scan.source
    if allowed_roots is not None and not source_allowed(source, allowed_roots):
        raise ConfigError(
            f"source {source!r} is outside this server's allowed_roots "
            f"({', '.join(allowed_roots)}); name a source under one of them"
        )
    return query, device
