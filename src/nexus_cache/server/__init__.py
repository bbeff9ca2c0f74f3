"""``nexus-cache serve``: the query service as an Arrow Flight server (see ``docs/server.md``).

One process owns one :class:`~nexus_cache.service.QueryService` for its
lifetime, so the GPU-resident caches outlive any one command and every
client shares them. Any Flight client can query it; the nexus-cache client
is :class:`nexus_cache.client.Client`.
"""

from __future__ import annotations

from nexus_cache._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "QueryFlightServer": "app",
    "BearerTokenMiddlewareFactory": "auth",
    "run_server": "lifecycle",
    "MetricsEndpoint": "metrics",
    "ServerMetrics": "metrics",
    "DEFAULT_PORT": "settings",
    "ServerSettings": "settings",
    "load_settings": "settings",
    "parse_ticket": "tickets",
    "ACTIONS": "wire",
    "encode_ticket": "wire",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(
    __name__, {name: f"{__name__}.{module}" for name, module in _EXPORTS.items()}, globals()
)
