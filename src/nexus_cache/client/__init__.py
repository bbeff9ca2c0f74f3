"""A client of a nexus-cache query server: :class:`Client` (see ``docs/server.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.client.client import Client as Client

_EXPORTS: dict[str, str] = {"Client": "nexus_cache.client.client"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
