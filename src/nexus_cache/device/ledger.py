"""The device ledger: the single byte authority of one device.

Capacity equation (docs/device.md states the same)::

    G + R + E + P + D + Q <= M          (managed capacity)
        R + E + P + D + Q <= C          (cache_cap_bytes)

``G`` attempt grants, ``R`` cache reservations (AttemptOwned), ``E``
evictable resident cache bytes, ``P`` pinned-in-use cache bytes, ``D``
bytes of entries being torn down, ``Q`` bytes of entries whose teardown was
unsafe. A grant must fit the first line; a cache charge must fit both. When a
charge does not fit, only ``E`` can be reclaimed, through the evictors the
cache subdomains register; pinned, reserved and retiring bytes never are.

Ownership: the ledger owns the buckets, the grants and admission; each
:class:`ResidentEntry` owns its own lifecycle state and moves its bytes
between buckets through :meth:`DeviceLedger.move_locked` under
:attr:`DeviceLedger.lock`. This module imports ``residency``, never the
reverse.

Thread-safe: one lock guards every field (and every entry's state); pin and
release are one lock acquisition and integer arithmetic. Evictors run
without the lock held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeVar

from nexus_cache._sizes import parse_size
from nexus_cache.device._checks import check_byte_count
from nexus_cache.device.records import Grant, LedgerSnapshot
from nexus_cache.device.residency import PinHandle, ResidencyState, ResidentEntry
from nexus_cache.errors import (
    AdmissionClosedError,
    CacheCapExceededError,
    CapacityError,
    ConfigError,
    LifecycleError,
    ManagedCapacityExceededError,
)

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain, DeviceBackend

__all__ = ["DeviceLedger", "Evictor", "Grant", "LedgerSnapshot"]

#: ``evictor(nbytes) -> bytes freed``: reclaim at least ``nbytes`` of evictable cache.
Evictor = Callable[[int], int]

_T = TypeVar("_T")
_S = ResidencyState
_R = _S.ATTEMPT_OWNED
_E = _S.EVICTABLE
_P = _S.PINNED
_D = _S.DESTROYING
_Q = _S.QUARANTINED
# Rounds of "evict, then retry" before a refusal; other threads may take
# freed bytes between rounds.
_RECLAIM_ROUNDS = 8


class DeviceLedger:
    """Byte authority of one device: grants and cache charges by state. Thread-safe.

    ``managed_capacity_bytes`` and ``cache_cap_bytes`` are settings
    (:class:`ConfigError` when invalid); the byte counts passed to its methods
    at run time raise :class:`~nexus_cache.errors.ByteCountError`.
    """

    def __init__(self, device_id: int, managed_capacity_bytes: int, cache_cap_bytes: int) -> None:
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise ConfigError(f"device_id={device_id!r}; accepted: an int >= 0")
        capacity = parse_size(
            managed_capacity_bytes, name="managed_capacity_bytes", allow_zero=True
        )
        cap = parse_size(cache_cap_bytes, name="cache_cap_bytes", allow_zero=True)
        if cap > capacity:
            raise ConfigError(
                f"cache_cap_bytes={cap} exceeds managed_capacity_bytes="
                f"{capacity} on device {device_id}; lower the cap"
            )
        self._device_id = device_id
        self._capacity = capacity
        self._cap = cap
        self._lock = threading.Lock()
        self._grants: dict[Hashable, Grant] = {}
        self._grant_bytes = 0
        # cache bytes by residency state; Destroyed entries hold no bucket
        self._buckets = {_R: 0, _E: 0, _P: 0, _D: 0, _Q: 0}
        self._admission_open = True
        self._closed_reason: str | None = None
        self._unsafe_teardowns = 0
        self._evicted_bytes = 0
        self._refusals = 0
        self._evictors: list[Evictor] = []

    def __repr__(self) -> str:
        return (
            f"DeviceLedger(device={self._device_id}, capacity={self._capacity}, cap={self._cap})"
        )

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def managed_capacity_bytes(self) -> int:
        return self._capacity

    @property
    def cache_cap_bytes(self) -> int:
        return self._cap

    @property
    def admission_open(self) -> bool:
        return self._admission_open

    @property
    def lock(self) -> threading.Lock:
        """The one lock over the buckets and every charged entry's state.

        Entries hold it while they take a transition; hold it only for
        integer work and never call a charging method while holding it.
        """
        return self._lock

    # -- evictors ------------------------------------------------------------------

    def add_evictor(self, evictor: Evictor) -> None:
        with self._lock:
            self._evictors.append(evictor)

    def reclaim(self, nbytes: int) -> int:
        """Ask the evictors to free at least ``nbytes`` of evictable cache; returns freed."""
        check_byte_count("nbytes", nbytes)
        with self._lock:
            evictors = list(self._evictors)
        freed = 0
        for evictor in evictors:
            if freed >= nbytes:
                break
            freed += evictor(nbytes - freed)
        if freed:
            with self._lock:
                self._evicted_bytes += freed
        return freed

    # -- grants --------------------------------------------------------------------

    def admit_grant(self, attempt_id: Hashable, nbytes: int, *, evict: bool = True) -> Grant:
        """Admit an attempt's immutable grant; may evict evictable cache to fit it.

        Raises :class:`ManagedCapacityExceededError` when it cannot fit,
        :class:`AdmissionClosedError` after an unsafe teardown, and
        :class:`LifecycleError` when the attempt already holds a grant here.
        """
        check_byte_count("nbytes", nbytes)

        def commit() -> Grant:
            self._require_no_grant(attempt_id)
            grant = Grant(self._device_id, attempt_id, nbytes)
            self._grants[attempt_id] = grant
            self._grant_bytes += nbytes
            return grant

        with self._lock:
            self._require_no_grant(attempt_id)  # before any eviction on its behalf
        return self._charge(nbytes, "grant", evict, commit)

    def release_grant(self, grant: Grant) -> None:
        """Return a grant's bytes. Releasing twice raises :class:`LifecycleError`."""
        with self._lock:
            if self._grants.get(grant.attempt_id) is not grant:
                raise LifecycleError(
                    f"grant of attempt {grant.attempt_id!r} is not held on device "
                    f"{self._device_id} (released already, or from another ledger)"
                )
            del self._grants[grant.attempt_id]
            self._grant_bytes -= grant.nbytes

    # -- cache charges -----------------------------------------------------------------

    def reserve(
        self,
        nbytes: int,
        *,
        key: Hashable = None,
        domain: AllocationDomain | None = None,
        backend: DeviceBackend | None = None,
        evict: bool = True,
    ) -> ResidentEntry:
        """Precharge ``nbytes`` before copying or building; returns an AttemptOwned entry.

        Must fit both the cap and the free managed capacity; with ``evict``
        the registered evictors may reclaim evictable cache to make room.
        """
        if type(nbytes) is not int or nbytes < 0:
            check_byte_count("nbytes", nbytes)
        buckets = self._buckets
        with self._lock:  # fast path: it fits as is (the equation, inline)
            cache = self._cache_locked() + nbytes
            if (
                self._admission_open
                and cache <= self._cap
                and self._grant_bytes + cache <= self._capacity
            ):
                buckets[_R] += nbytes
                return ResidentEntry(self, key, nbytes, domain=domain, backend=backend)

        def commit() -> ResidentEntry:
            buckets[_R] += nbytes
            return ResidentEntry(self, key, nbytes, domain=domain, backend=backend)

        return self._charge(nbytes, "cache", evict, commit)

    def charge_cache(self, nbytes: int, commit: Callable[[], _T], *, evict: bool = True) -> _T:
        """Admit a cache charge of ``nbytes``: when it fits both limits (with
        ``evict``, after evicting), run ``commit()`` under :attr:`lock` and
        return its result.

        The entry lifecycle uses it for reconcile growth; ``commit`` must be
        integer work that moves the bytes into a bucket. Raises
        :class:`CacheCapExceededError`, :class:`ManagedCapacityExceededError`
        or :class:`AdmissionClosedError`, with nothing charged.
        """
        check_byte_count("nbytes", nbytes)
        return self._charge(nbytes, "cache", evict, commit)

    def reconcile(self, entry: ResidentEntry, measured_bytes: int, *, evict: bool = True) -> None:
        """Publish ``entry`` at ``measured_bytes`` (see :meth:`ResidentEntry.publish`)."""
        self._require_own(entry)
        entry.publish(measured_bytes, evict=evict)

    def pin(self, entry: ResidentEntry) -> PinHandle:
        """Pin ``entry`` (see :meth:`ResidentEntry.pin`); it must be charged here."""
        self._require_own(entry)
        return entry.pin()

    # -- the entries' side of the books (lock held) --------------------------------------

    def move_locked(
        self, src: ResidencyState, dst: ResidencyState, out_bytes: int, in_bytes: int
    ) -> None:
        """Move an entry's charge from the ``src`` bucket (``out_bytes``) to the ``dst``
        bucket (``in_bytes``); Destroyed holds no bucket. Call with :attr:`lock` held:
        the entry changes its state in the same critical section.
        """
        buckets = self._buckets
        buckets[src] -= out_bytes
        if dst is not _S.DESTROYED:
            buckets[dst] += in_bytes

    def record_unsafe_teardown_locked(self, reason: str) -> None:
        """Count an unsafe teardown and close admission (the first names the cause).
        Call with :attr:`lock` held."""
        self._unsafe_teardowns += 1
        self._admission_open = False
        if self._unsafe_teardowns == 1:
            self._closed_reason = reason

    # -- admission -------------------------------------------------------------------

    def close_admission(self, reason: str) -> None:
        """Refuse every new grant and cache charge from now on."""
        with self._lock:
            if self._admission_open:
                self._admission_open = False
                self._closed_reason = reason

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            b = self._buckets
            cache = self._cache_locked()
            return LedgerSnapshot(
                device_id=self._device_id,
                managed_capacity_bytes=self._capacity,
                cache_cap_bytes=self._cap,
                grant_bytes=self._grant_bytes,
                grant_count=len(self._grants),
                cache_reserved_bytes=b[_R],
                cache_evictable_resident_bytes=b[_E],
                cache_pinned_in_use_bytes=b[_P],
                cache_retiring_bytes=b[_D],
                cache_quarantined_bytes=b[_Q],
                cache_charged_bytes=cache,
                free_managed_bytes=self._capacity - self._grant_bytes - cache,
                admission_open=self._admission_open,
                admission_closed_reason=self._closed_reason,
                unsafe_teardowns=self._unsafe_teardowns,
                evicted_bytes=self._evicted_bytes,
                refusals=self._refusals,
            )

    # -- internals ----------------------------------------------------------------------

    def _cache_locked(self) -> int:
        b = self._buckets
        return b[_R] + b[_E] + b[_P] + b[_D] + b[_Q]

    def _shortfall_locked(self, nbytes: int, kind: str) -> tuple[int, int]:
        """(bytes over the cap, bytes over the managed capacity) if ``nbytes`` were charged."""
        cache = self._cache_locked()
        over_capacity = self._grant_bytes + cache + nbytes - self._capacity
        over_cap = cache + nbytes - self._cap if kind == "cache" else 0
        return over_cap, over_capacity

    def _charge(self, nbytes: int, kind: str, evict: bool, commit: Callable[[], _T]) -> _T:
        stalled = False
        for attempt in range(_RECLAIM_ROUNDS + 1):
            with self._lock:
                if not self._admission_open:
                    self._refusals += 1
                    raise AdmissionClosedError(
                        f"admission on device {self._device_id} is closed "
                        f"({self._closed_reason}); {kind} charge of {nbytes} B refused"
                    )
                over_cap, over_capacity = self._shortfall_locked(nbytes, kind)
                need = max(over_cap, over_capacity)
                if need <= 0:
                    return commit()
                reclaimable = self._buckets[_E] if (evict and self._evictors) else 0
                if stalled:  # the evictors could free nothing (e.g. only graphs left)
                    reclaimable = 0
                if need > reclaimable or attempt == _RECLAIM_ROUNDS:
                    self._refusals += 1
                    raise self._refusal_locked(nbytes, kind, over_cap, over_capacity, reclaimable)
            stalled = self.reclaim(need) <= 0
        raise AssertionError("unreachable")  # pragma: no cover

    def _refusal_locked(
        self, nbytes: int, kind: str, over_cap: int, over_capacity: int, reclaimable: int
    ) -> CapacityError:
        b = self._buckets
        figures = (
            f"grants={self._grant_bytes} B, reserved={b[_R]} B, "
            f"evictable={b[_E]} B, pinned={b[_P]} B, "
            f"retiring={b[_D]} B, quarantined={b[_Q]} B, "
            f"reclaimable now={reclaimable} B"
        )
        if over_cap > reclaimable:
            return CacheCapExceededError(
                f"{kind} charge of {nbytes} B on device {self._device_id} exceeds "
                f"cache_cap_bytes={self._cap} by {over_cap} B ({figures}); raise the cap, "
                "or retry after pins release"
            )
        return ManagedCapacityExceededError(
            f"{kind} charge of {nbytes} B on device {self._device_id} exceeds managed "
            f"capacity={self._capacity} B by {over_capacity} B ({figures}); ask for less, "
            "or retry after grants or pins release"
        )

    def _require_no_grant(self, attempt_id: Hashable) -> None:
        if attempt_id in self._grants:
            raise LifecycleError(
                f"attempt {attempt_id!r} already holds a grant on device {self._device_id}"
            )

    def _require_own(self, entry: ResidentEntry) -> None:
        if entry.ledger is not self:
            raise LifecycleError(f"{entry!r} belongs to another ledger")
