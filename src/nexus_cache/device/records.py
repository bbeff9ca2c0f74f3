"""Immutable records the ledger hands out: grants and snapshots. Thread-safe (frozen)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["Grant", "LedgerSnapshot"]


@dataclass(frozen=True, eq=False)
class Grant:
    """An attempt's immutable device-memory budget. Compared by identity."""

    device_id: int
    attempt_id: Hashable
    nbytes: int


@dataclass(frozen=True)
class LedgerSnapshot:
    """Every ledger figure, read under one lock acquisition."""

    device_id: int
    managed_capacity_bytes: int
    cache_cap_bytes: int
    grant_bytes: int
    grant_count: int
    cache_reserved_bytes: int
    cache_evictable_resident_bytes: int
    cache_pinned_in_use_bytes: int
    cache_retiring_bytes: int
    cache_quarantined_bytes: int
    cache_charged_bytes: int
    free_managed_bytes: int
    admission_open: bool
    admission_closed_reason: str | None
    unsafe_teardowns: int
    evicted_bytes: int
    refusals: int

    def to_dict(self) -> dict[str, Any]:
        # every field by its name; its values are plain (no deep copy as asdict makes)
        return {name: getattr(self, name) for name in _SNAPSHOT_FIELDS}


_SNAPSHOT_FIELDS = tuple(f.name for f in fields(LedgerSnapshot))
