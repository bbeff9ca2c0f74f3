"""The policy matrix of the lakehouse cache, as one pure function.

================  ============================  ==========================================
POLICY            complete local hit            miss
================  ============================  ==========================================
disabled          read locally                  read remotely; no fill
read_through      read locally                  read remotely; fill in the background
fill_before_read  read locally                  publish the entry first, then read locally
================  ============================  ==========================================

``READ=disabled`` ignores hits and always reads remotely (status ``bypass``, reason
``read_disabled``). With ``read_through`` it still warms the cache in the
background. Our decision for ``READ=disabled`` with ``fill_before_read``: the miss
is filled in the background too, because a blocking fill only exists to serve a
local read, which ``READ=disabled`` forbids.
"""

from __future__ import annotations

import dataclasses

from nexus_cache.lakehouse.config import FillPolicy, ReadPolicy
from nexus_cache.lakehouse.events import CacheStatus, FillMode, ReadMode

__all__ = ["Decision", "decide"]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Outcome of the matrix for one read."""

    status: CacheStatus
    read_mode: ReadMode
    fill_mode: FillMode
    reason: str | None = None


def decide(read: ReadPolicy, policy: FillPolicy, entry_present: bool) -> Decision:
    """Apply the matrix to one read whose identity is proven."""
    if entry_present:
        if read is ReadPolicy.ENABLED:
            return Decision(CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE)
        return Decision(CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE, "read_disabled")
    if policy is FillPolicy.DISABLED:
        return Decision(CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE)
    if policy is FillPolicy.FILL_BEFORE_READ and read is ReadPolicy.ENABLED:
        return Decision(CacheStatus.MISS, ReadMode.LOCAL, FillMode.BLOCKING)
    return Decision(CacheStatus.MISS, ReadMode.REMOTE, FillMode.BACKGROUND)
