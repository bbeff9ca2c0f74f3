"""Turning a ticket (or command descriptor) into a query the server may run.

Checks, in order: the ticket's size (``max_ticket_bytes``), its JSON and the
query's fields (the service's own parser, so the messages are the CLI's),
the device envelope, then the named source against ``allowed_roots`` (the
service checks every object the source expands to again when it lists it:
``ServiceConfig.allowed_roots``). Every refusal is a :class:`ConfigError`
naming what to change. Pure functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nexus_cache._roots import location_allowed as source_allowed
from nexus_cache._sizes import format_size
from nexus_cache.errors import ConfigError
from nexus_cache.service.queries import GraphQuery, Query, query_from_dict

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
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:  # not UTF-8, not JSON, an integer of too many digits
        raise ConfigError(f"query JSON is malformed: {exc}") from None
    except RecursionError:
        raise ConfigError(
            "query JSON is nested too deeply to parse; a query is a flat object whose "
            "'edges' holds one scan"
        ) from None
    device = None
    if isinstance(data, dict) and "type" not in data and "query" in data:
        extra = sorted(set(data) - {"query", "device"})
        if extra:
            raise ConfigError(
                f"ticket has unknown field(s) {extra}; accepted: a query object, or "
                '{"query": {...}, "device": N}'
            )
        device = data.get("device")
        if device is not None and (
            isinstance(device, bool) or not isinstance(device, int) or device < 0
        ):
            raise ConfigError(f"ticket device={device!r} is not accepted; use a device id >= 0")
        data = data["query"]
    query = query_from_dict(data)
    source = (query.edges if isinstance(query, GraphQuery) else query).source
    if allowed_roots is not None and not source_allowed(source, allowed_roots):
        raise ConfigError(
            f"source {source!r} is outside this server's allowed_roots "
            f"({', '.join(allowed_roots)}); name a source under one of them"
        )
    return query, device
