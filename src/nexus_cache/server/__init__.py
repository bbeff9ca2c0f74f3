"""``nexus-cache serve``: the query service as an Arrow Flight server (see ``docs/server.md``).

One process owns one :class:`~nexus_cache.service.QueryService` for its
lifetime, so the GPU-resident caches outlive any one command and every
client shares them. Any Flight client can query it; the nexus-cache client
is :class:`nexus_cache.client.Client`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.server.app import QueryFlightServer as QueryFlightServer
    from nexus_cache.server.auth import (
        BearerTokenMiddlewareFactory as BearerTokenMiddlewareFactory,
    )
    from nexus_cache.server.lifecycle import run_server as run_server
    from nexus_cache.server.metrics import MetricsEndpoint as MetricsEndpoint
    from nexus_cache.server.metrics import ServerMetrics as ServerMetrics
    from nexus_cache.server.settings import DEFAULT_PORT as DEFAULT_PORT
    from nexus_cache.server.settings import ServerSettings as ServerSettings
    from nexus_cache.server.settings import load_settings as load_settings
    from nexus_cache.server.tickets import parse_ticket as parse_ticket
    from nexus_cache.server.wire import ACTIONS as ACTIONS
    from nexus_cache.server.wire import encode_ticket as encode_ticket

_EXPORTS: dict[str, str] = {
    "QueryFlightServer": "nexus_cache.server.app",
    "BearerTokenMiddlewareFactory": "nexus_cache.server.auth",
    "run_server": "nexus_cache.server.lifecycle",
    "MetricsEndpoint": "nexus_cache.server.metrics",
    "ServerMetrics": "nexus_cache.server.metrics",
    "DEFAULT_PORT": "nexus_cache.server.settings",
    "ServerSettings": "nexus_cache.server.settings",
    "load_settings": "nexus_cache.server.settings",
    "parse_ticket": "nexus_cache.server.tickets",
    "ACTIONS": "nexus_cache.server.wire",
    "encode_ticket": "nexus_cache.server.wire",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
