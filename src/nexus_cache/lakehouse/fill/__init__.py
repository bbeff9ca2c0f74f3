"""Fills: publishing local copies of remote objects, within a budget.

``_fill`` copies one object pinned to its planned identity and publishes the
entry; ``_background`` runs the ``read_through`` fills on a small pool (and
waits for them at interpreter exit); ``_limits`` is the service-wide budget of
concurrent fills and in-flight host bytes. The public name is also exported
by ``nexus_cache.lakehouse``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.lakehouse.fill._limits import FillLimits as FillLimits

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "FillLimits": "nexus_cache.lakehouse.fill._limits",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
