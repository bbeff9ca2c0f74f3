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

Thread-safe: one lock guards every field; pin and release are one lock
acquisition and integer arithmetic. Evictors run without the lock held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeVar

from nexus_cache.device._figures import Grant, LedgerSnapshot, _check_bytes
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
_ATTEMPT_OWNED = _S.ATTEMPT_OWNED
_EVICTABLE = _S.EVICTABLE
_PINNED = _S.PINNED
_DESTROYING = _S.DESTROYING
# Rounds of "evict, then retry" before a refusal; other threads may take
# freed bytes between rounds.
_RECLAIM_ROUNDS = 8


class DeviceLedger:
    """Byte authority of one device: grants and cache charges by state. Thread-safe."""

    def __init__(self, device_id: int, managed_capacity_bytes: int, cache_cap_bytes: int) -> None:
        _check_bytes("device_id", device_id)
        _check_bytes("managed_capacity_bytes", managed_capacity_bytes)
        _check_bytes("cache_cap_bytes", cache_cap_bytes)
        if cache_cap_bytes > managed_capacity_bytes:
            raise ConfigError(
                f"cache_cap_bytes={cache_cap_bytes} exceeds managed_capacity_bytes="
                f"{managed_capacity_bytes} on device {device_id}; lower the cap"
            )
        self._device_id = device_id
        self._capacity = managed_capacity_bytes
        self._cap = cache_cap_bytes
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._grants: dict[Hashable, Grant] = {}
        self._grant_bytes = 0
        self._reserved = 0
        self._evictable = 0
        self._pinned = 0
        self._retiring = 0
        self._quarantined = 0
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

    # -- evictors ------------------------------------------------------------------

    def add_evictor(self, evictor: Evictor) -> None:
        with self._lock:
            self._evictors.append(evictor)

    def remove_evictor(self, evictor: Evictor) -> None:
        with self._lock:
            if evictor in self._evictors:
                self._evictors.remove(evictor)

    def reclaim(self, nbytes: int) -> int:
        """Ask the evictors to free at least ``nbytes`` of evictable cache; returns freed."""
        _check_bytes("nbytes", nbytes)
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
        _check_bytes("nbytes", nbytes)

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
            _check_bytes("nbytes", nbytes)
        with self._lock:  # fast path: it fits as is (the equation, inline)
            cache = self._cache_locked() + nbytes
            if (
                self._admission_open
                and cache <= self._cap
                and self._grant_bytes + cache <= self._capacity
            ):
                self._reserved += nbytes
                return ResidentEntry(self, key, nbytes, domain=domain, backend=backend)

        def commit() -> ResidentEntry:
            self._reserved += nbytes
            return ResidentEntry(self, key, nbytes, domain=domain, backend=backend)

        return self._charge(nbytes, "cache", evict, commit)

    def reconcile(self, entry: ResidentEntry, measured_bytes: int, *, evict: bool = True) -> None:
        """Replace the reservation with the measured bytes and publish (-> Evictable).

        Growth beyond the reservation is a new cache charge: it must fit
        (``evict`` as for :meth:`reserve`); on refusal the entry stays
        AttemptOwned with its reservation.
        """
        if type(measured_bytes) is not int or measured_bytes < 0:
            _check_bytes("measured_bytes", measured_bytes)
        self._require_own(entry)
        with self._lock:
            self._require_state(entry, _ATTEMPT_OWNED, "reconcile")
            growth = measured_bytes - entry._nbytes
            if growth <= 0:
                self._publish_locked(entry, measured_bytes)
                return

        def commit() -> None:
            self._require_state(entry, _ATTEMPT_OWNED, "reconcile")
            self._publish_locked(entry, measured_bytes)

        self._charge(growth, "cache", evict, commit)

    def _publish_locked(self, entry: ResidentEntry, measured_bytes: int) -> None:
        self._reserved -= entry._nbytes
        self._evictable += measured_bytes
        entry._nbytes = measured_bytes
        entry._state = _EVICTABLE

    # -- pins (the hot path: one lock, integers) ----------------------------------------

    def pin(self, entry: ResidentEntry) -> PinHandle:
        with self._lock:
            state = entry._state
            if entry._closing or entry._ledger is not self:
                raise LifecycleError(self._pin_refusal(entry))
            if state is _PINNED:
                entry._pins += 1
            elif state is _EVICTABLE:
                nbytes = entry._nbytes
                self._evictable -= nbytes
                self._pinned += nbytes
                entry._state = _PINNED
                entry._pins = 1
            else:
                raise LifecycleError(self._pin_refusal(entry))
        return PinHandle(entry)

    def _release_pin(self, handle: PinHandle) -> None:
        entry = handle._entry
        with self._lock:
            if handle._released:
                raise LifecycleError(f"pin on {entry!r} was already released")
            if entry._state is not _PINNED:
                raise LifecycleError(f"{entry!r} holds no pin to release")
            handle._released = True
            entry._pins -= 1
            if entry._pins == 0:
                nbytes = entry._nbytes
                self._pinned -= nbytes
                self._evictable += nbytes
                entry._state = _EVICTABLE
                if entry._closing:
                    self._idle.notify_all()

    def _pin_refusal(self, entry: ResidentEntry) -> str:
        if entry._ledger is not self:
            return f"{entry!r} belongs to another ledger"
        if entry._closing:
            return f"cannot pin {entry!r}: it is being destroyed"
        return f"cannot pin {entry!r}: only evictable or pinned entries can be pinned"

    # -- destruction protocol (driven by ResidentEntry) -------------------------------

    def _begin_destroy(self, entry: ResidentEntry, timeout: float | None) -> None:
        """Block new pins, wait for the last release, move the charge aside."""
        self._require_own(entry)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if entry._state not in (_ATTEMPT_OWNED, _EVICTABLE, _PINNED):
                raise LifecycleError(f"cannot destroy {entry!r}: already being destroyed")
            entry._closing = True
            while entry._state is _PINNED:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LifecycleError(
                        f"cannot destroy {entry!r} yet: {entry._pins} pin(s) still held after "
                        f"{timeout} s; new pins are blocked, destroy again after they release"
                    )
                self._idle.wait(remaining)
            self._retire_locked(entry)

    def _try_begin_eviction(self, entry: ResidentEntry) -> bool:
        """Start destroying ``entry`` if it is evictable right now (never waits)."""
        with self._lock:
            if entry._state is not _EVICTABLE or entry._closing or entry._ledger is not self:
                return False
            entry._closing = True
            self._retire_locked(entry)
            return True

    def _retire_locked(self, entry: ResidentEntry) -> None:
        state = entry._state
        if state is _ATTEMPT_OWNED:
            self._reserved -= entry._nbytes
        elif state is _EVICTABLE:
            self._evictable -= entry._nbytes
        else:  # only a concurrent destroy can get here
            raise LifecycleError(f"cannot destroy {entry!r}: already being destroyed")
        self._retiring += entry._nbytes
        entry._state = _DESTROYING

    def _complete_destroy(self, entry: ResidentEntry) -> None:
        with self._lock:
            self._require_state(entry, _DESTROYING, "complete teardown of")
            self._retiring -= entry._nbytes
            entry._state = _S.DESTROYED

    def _fail_destroy(self, entry: ResidentEntry, reason: str) -> None:
        with self._lock:
            self._require_state(entry, _DESTROYING, "quarantine")
            self._retiring -= entry._nbytes
            self._quarantined += entry._nbytes
            entry._state = _S.QUARANTINED
            self._unsafe_teardowns += 1
            self._admission_open = False
            if self._unsafe_teardowns == 1:  # the first unsafe teardown names the cause
                self._closed_reason = f"unsafe teardown of {entry!r}: {reason}"

    # -- admission -------------------------------------------------------------------

    def close_admission(self, reason: str) -> None:
        """Refuse every new grant and cache charge from now on."""
        with self._lock:
            if self._admission_open:
                self._admission_open = False
                self._closed_reason = reason

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            cache = self._cache_locked()
            return LedgerSnapshot(
                device_id=self._device_id,
                managed_capacity_bytes=self._capacity,
                cache_cap_bytes=self._cap,
                grant_bytes=self._grant_bytes,
                grant_count=len(self._grants),
                cache_reserved_bytes=self._reserved,
                cache_evictable_resident_bytes=self._evictable,
                cache_pinned_in_use_bytes=self._pinned,
                cache_retiring_bytes=self._retiring,
                cache_quarantined_bytes=self._quarantined,
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
        return self._reserved + self._evictable + self._pinned + self._retiring + self._quarantined

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
                reclaimable = self._evictable if (evict and self._evictors) else 0
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
        figures = (
            f"grants={self._grant_bytes} B, reserved={self._reserved} B, "
            f"evictable={self._evictable} B, pinned={self._pinned} B, "
            f"retiring={self._retiring} B, quarantined={self._quarantined} B, "
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
        if entry._ledger is not self:
            raise LifecycleError(f"{entry!r} belongs to another ledger")

    def _require_state(self, entry: ResidentEntry, state: ResidencyState, what: str) -> None:
        if entry._state is not state:
            raise LifecycleError(
                f"cannot {what} {entry!r}: it is {entry._state.value}, not {state.value}"
            )
