"""The policy of the lakehouse cache, as one pure function: :func:`decide`.

Given the settings, the object's proven size and whether a complete entry is
present, :func:`decide` answers the whole question: cache status, where the bytes
come from, what fill runs, and why. Nothing else in the package decides.

================  ============================  ==========================================
POLICY            complete local hit            miss
================  ============================  ==========================================
disabled          read locally                  read remotely; no fill
read_through      read locally                  read remotely; fill in the background
fill_before_read  read locally                  publish the entry first, then read locally
================  ============================  ==========================================

Around the matrix:

* an object larger than ``bypass_bytes`` is never cached (status ``bypass``,
  reason ``large_object``), whatever the entry and the policy;
* ``READ=disabled`` ignores hits and always reads remotely (status ``bypass``,
  reason ``read_disabled``). With ``read_through`` it still warms the cache in
  the background. With ``fill_before_read`` the miss is filled in the background
  too, because a blocking fill only exists to serve a local read, which
  ``READ=disabled`` forbids;
* a miss under ``POLICY=disabled`` (a root set alone) says so: reason
  ``policy_disabled``;
* a miss that would fill an object larger than ``max_bytes`` reads remotely
  without a fill (reason ``too_large``).
"""

from __future__ import annotations

import dataclasses

from nexus_cache.lakehouse._config import FillPolicy, LakehouseCacheConfig, ReadPolicy
from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode

__all__ = ["Decision", "decide", "fill_refusal"]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Outcome of the policy for one read."""

    status: CacheStatus
    read_mode: ReadMode
    fill_mode: FillMode
    reason: str | None = None


def fill_refusal(config: LakehouseCacheConfig, size: int) -> str | None:
    """Why an object of ``size`` bytes may not be filled, whatever the policy, or ``None``.

    ``large_object``: over ``bypass_bytes``; ``too_large``: over ``max_bytes``.
    Reads and :meth:`~nexus_cache.lakehouse.LakehouseCache.prefetch` both ask here.
    """
    if config.bypass_bytes is not None and size > config.bypass_bytes:
        return "large_object"
    if config.max_bytes is not None and size > config.max_bytes:
        return "too_large"
    return None


def decide(config: LakehouseCacheConfig, size: int, entry_present: bool) -> Decision:
    """The policy's answer for one read of ``size`` bytes whose identity is proven."""
    refusal = fill_refusal(config, size)
    if refusal == "large_object":
        return Decision(CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE, refusal)
    read, policy = config.read, config.policy
    if entry_present:
        if read is ReadPolicy.ENABLED:
            return Decision(CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE)
        return Decision(CacheStatus.BYPASS, ReadMode.REMOTE, FillMode.NONE, "read_disabled")
    if policy is FillPolicy.DISABLED:
        return Decision(CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE, "policy_disabled")
    if refusal is not None:
        return Decision(CacheStatus.MISS, ReadMode.REMOTE, FillMode.NONE, refusal)
    if policy is FillPolicy.FILL_BEFORE_READ and read is ReadPolicy.ENABLED:
        return Decision(CacheStatus.MISS, ReadMode.LOCAL, FillMode.BLOCKING)
    return Decision(CacheStatus.MISS, ReadMode.REMOTE, FillMode.BACKGROUND)
