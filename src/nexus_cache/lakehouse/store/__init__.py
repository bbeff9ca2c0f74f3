"""The cache root on disk: entries, pins, durability and maintenance.

``_store`` lays out a root and looks entries up, opens and removes them;
``_pins`` keeps retention away from entries in use; ``_durable`` makes
published entries durable off the read path; ``_maintenance`` runs
retention, verification and clearing, and :class:`LakehouseRoot` inspects a
root without a cache. The public names are also exported by
``nexus_cache.lakehouse``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.lakehouse.store._maintenance import EntryListing as EntryListing
    from nexus_cache.lakehouse.store._maintenance import LakehouseRoot as LakehouseRoot
    from nexus_cache.lakehouse.store._maintenance import RetentionResult as RetentionResult
    from nexus_cache.lakehouse.store._maintenance import RootSummary as RootSummary
    from nexus_cache.lakehouse.store._maintenance import VerifyResult as VerifyResult

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "EntryListing": "nexus_cache.lakehouse.store._maintenance",
    "LakehouseRoot": "nexus_cache.lakehouse.store._maintenance",
    "RetentionResult": "nexus_cache.lakehouse.store._maintenance",
    "RootSummary": "nexus_cache.lakehouse.store._maintenance",
    "VerifyResult": "nexus_cache.lakehouse.store._maintenance",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
