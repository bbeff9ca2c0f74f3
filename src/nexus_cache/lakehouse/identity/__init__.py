"""Which object a read is of: identities, their proofs, and pinned remote opens.

``_identity`` names an object (storage domain, content identity, location; the
entry key is their hash) and resolves it with one ``stat`` or metadata
request; ``_known`` remembers identities this cache proved and reads those a
fresh listing proves; ``_proofs`` keeps the listings and ``info`` answers the
``nexus`` filesystem fetched; ``_remote`` opens a remote object pinned to a
planned identity. Nothing here touches a cache root. The public names are
also exported by ``nexus_cache.lakehouse``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.lakehouse.identity._identity import ContentIdentity as ContentIdentity
    from nexus_cache.lakehouse.identity._identity import SourceIdentity as SourceIdentity
    from nexus_cache.lakehouse.identity._identity import StorageDomain as StorageDomain

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "ContentIdentity": "nexus_cache.lakehouse.identity._identity",
    "SourceIdentity": "nexus_cache.lakehouse.identity._identity",
    "StorageDomain": "nexus_cache.lakehouse.identity._identity",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
