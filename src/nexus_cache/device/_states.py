"""The residency vocabulary: the states, the legal edges, and what an entry needs of its ledger.

Split from :mod:`nexus_cache.device.residency` (the entry's behaviour) so the
state table reads on its own; its names are public there. Immutable data
and a protocol: thread-safe.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

__all__ = ["TRANSITIONS", "LedgerBooks", "ResidencyState"]

_T = TypeVar("_T")


class ResidencyState(enum.Enum):
    ATTEMPT_OWNED = "attempt_owned"
    EVICTABLE = "evictable"
    PINNED = "pinned"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    QUARANTINED = "quarantined"

    # Members are singletons: identity hashing is exact, and a C slot keeps the
    # state-table and bucket lookups of the pin hot path cheap (Enum's own
    # __hash__ is Python code).
    __hash__ = object.__hash__


_S = ResidencyState

#: Every transition an entry may make; anything else is a defect. Every
#: transition goes through ``ResidentEntry._move_locked``, which checks this
#: table, except the two pin edges (Evictable <-> Pinned), which ``pin`` and
#: the last release take inline for speed; the tests check them against it.
TRANSITIONS: Mapping[ResidencyState, frozenset[ResidencyState]] = {
    _S.ATTEMPT_OWNED: frozenset({_S.EVICTABLE, _S.DESTROYING}),
    _S.EVICTABLE: frozenset({_S.PINNED, _S.DESTROYING}),
    _S.PINNED: frozenset({_S.EVICTABLE}),
    _S.DESTROYING: frozenset({_S.DESTROYED, _S.QUARANTINED}),
    _S.DESTROYED: frozenset(),
    _S.QUARANTINED: frozenset(),
}


class LedgerBooks(Protocol):
    """What an entry needs from the byte authority it is charged to.

    :class:`~nexus_cache.device.DeviceLedger` implements it. ``lock`` guards
    the buckets and the state of every entry charged to the ledger; the
    ``*_locked`` methods must be called with it held.
    """

    @property
    def device_id(self) -> int: ...

    @property
    def lock(self) -> threading.Lock: ...

    def move_locked(
        self, src: ResidencyState, dst: ResidencyState, out_bytes: int, in_bytes: int
    ) -> None: ...

    def charge_cache(self, nbytes: int, commit: Callable[[], _T], *, evict: bool = True) -> _T: ...

    def record_unsafe_teardown_locked(self, reason: str) -> None: ...
