"""The decoded source cache of one device: single-flight ``checkout_or_claim``.

* **Hit**: the resident entry is pinned and the caller gets a copy in its own
  domain; the pin is carried by the returned :class:`SourceCheckout` and
  everything derived from it, until the last is released.
* **Miss**: exactly one caller per key is elected decode leader and gets a
  :class:`SourceClaim`; the others wait for it, each against its own
  deadline. A leader that stops for its own reason (cancelled, grant
  exhausted: :data:`LEADER_LOCAL_ERRORS`) hands the lead to a waiter; any
  other decode error reaches every waiter as :class:`SourceDecodeError`.
* **Retention**: after a successful decode the leader reserves ledger
  capacity (evicting unpinned source entries in LRU order), copies its frame
  into the cache domain, reconciles the reservation to the measured
  allocation and publishes. The leader keeps its own frame. Capacity pressure
  or an allocation failure skips retention; the query still succeeds. An
  interrupt (``KeyboardInterrupt``, any ``BaseException``) during retention
  abandons the reservation, wakes the followers, and is re-raised.
* **Follower copies**: a follower of a value that was not retained copies
  the leader's own (attempt-owned) value while the flight keeps it alive:
  the leader's ``publish`` returns only after every follower waiting at that
  moment has its copy. A value released anyway makes the follower ask again
  (and decode itself), never an error.
* **Bypass**: keys with a bypass reason never touch the cache.

Lock order: subdomain lock, then ledger lock. No lock is held while a value
is copied or decoded.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from nexus_cache.device.checkout import CheckoutStatus, PinLease, SourceCheckout, SourceDiagnostics
from nexus_cache.device.source.claim import ClaimOutcomes, DecodeFlight, FlightState, SourceClaim
from nexus_cache.device.source.events import SourceEventLog, SourceEventSnapshot
from nexus_cache.device.source.key import SourceFrameKey
from nexus_cache.device.subdomain import CacheSubdomain
from nexus_cache.errors import (
    AdmissionClosedError,
    CapacityError,
    ConfigError,
    LifecycleError,
    SourceDecodeError,
    SourceWaitTimeoutError,
    UnsafeTeardownError,
)

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain
    from nexus_cache.device.domain import DeviceCacheAllocationFactory
    from nexus_cache.device.ledger import DeviceLedger
    from nexus_cache.device.residency import ResidentEntry
    from nexus_cache.device.values import DeviceValue

__all__ = [
    "SOURCE_WAIT_TIMEOUT_S",
    "SourceCacheSubdomain",
]

#: Default time a follower waits for a decode leader before giving up.
SOURCE_WAIT_TIMEOUT_S = 120.0
# How often a follower given a ``stop`` check looks at it while it waits: a
# cancelled query leaves the wait within this, not at the wait's timeout.
_STOP_POLL_S = 0.05

# Retention gives up quietly on these: the query has its frame either way.
_RETENTION_SKIPS = (MemoryError, AdmissionClosedError, LifecycleError, UnsafeTeardownError)


def _fingerprint(key: Hashable) -> str:
    if isinstance(key, SourceFrameKey):
        return key.fingerprint
    return hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()


def _await(
    flight: DecodeFlight, deadline: float, stop: Callable[[], None] | None
) -> FlightState | None:
    """:meth:`DecodeFlight.await_outcome`, looking at ``stop`` between slices of the wait."""
    if stop is None:
        return flight.await_outcome(deadline)
    while True:
        outcome = flight.await_outcome(min(deadline, time.monotonic() + _STOP_POLL_S))
        if outcome is not None or time.monotonic() >= deadline:
            return outcome
        stop()


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigError(f"timeout={timeout!r}; accepted: seconds > 0")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError(f"timeout={timeout!r}; accepted: a finite number of seconds > 0")
    # longer than threading's waits accept (they overflow) is the same in effect
    return min(float(timeout), threading.TIMEOUT_MAX)


class SourceCacheSubdomain(CacheSubdomain):
    """Decoded source frames on one device; single flight per key, LRU-evictable
    when unpinned. Thread-safe."""

    kind = "source"
    evicts_lru = True
    evict_on_reserve = True

    def __init__(self, ledger: DeviceLedger, factory: DeviceCacheAllocationFactory) -> None:
        super().__init__(ledger, factory)
        self._flights: dict[SourceFrameKey, DecodeFlight] = {}
        self._events = SourceEventLog()
        self._outcomes = ClaimOutcomes(self._complete, self._fail, self._abandon)

    # -- the single-flight front door ---------------------------------------------------

    def checkout_or_claim(
        self,
        key: SourceFrameKey,
        *,
        domain: AllocationDomain,
        timeout: float = SOURCE_WAIT_TIMEOUT_S,
        stop: Callable[[], None] | None = None,
        borrow: bool = False,
    ) -> SourceCheckout | SourceClaim:
        """A :class:`SourceCheckout` (hit, or a follower's copy) or a :class:`SourceClaim`
        (this caller decodes: leader, bypass, or closed cache).

        ``borrow``: a hit's value is the resident entry's own (no copy), pinned
        until the checkout is released; the caller only reads it and must not
        release it, nor keep anything that shares its buffers past the checkout
        (it builds its own result from it, e.g. a filter's gather into its
        domain). A follower still gets its own copy.

        ``domain`` is the caller's (the attempt's) allocation domain: copies
        handed to it are allocated there. A follower waits at most
        ``timeout`` seconds, then raises :class:`SourceWaitTimeoutError` and
        leaves nothing behind. A leader's deterministic failure raises
        :class:`SourceDecodeError` (chained to it) in every follower. A
        follower's value is always its own independent copy; when the
        leader's unretained value was released before it could be copied,
        this caller gets a claim and decodes instead.

        ``stop``, when given, is called about every 50 ms while this caller
        waits for a leader; whatever it raises (a cancelled query's error)
        ends the wait at once and leaves nothing behind: the flight and its
        leader go on for the other waiters. It is called under the cache's
        lock, so it must only look at a flag and raise.
        """
        if not isinstance(key, SourceFrameKey):
            raise ConfigError(
                f"checkout_or_claim needs a SourceFrameKey, got {type(key).__name__}"
            )
        if key.bypass is not None:  # never touches the cache, not even a counter
            return SourceClaim(None, None, key, status=CheckoutStatus.BYPASS)
        started = time.monotonic()
        deadline = started + _check_timeout(timeout)
        while True:
            result = self._checkout_once(key, domain, started, deadline, stop, borrow)
            if result is not None:
                return result
            # The leader's value was released before this follower copied it
            # (its attempt ended early): ask again, as a fresh leader if need be.

    def _checkout_once(
        self,
        key: SourceFrameKey,
        domain: AllocationDomain,
        started: float,
        deadline: float,
        stop: Callable[[], None] | None,
        borrow: bool = False,
    ) -> SourceCheckout | SourceClaim | None:
        """One pass of :meth:`checkout_or_claim`; None when the leader's value was gone."""
        flight: DecodeFlight | None = None  # set when this caller copies the leader's value
        source: Any = None
        with self._lock:
            if self._closed:
                return SourceClaim(None, None, key, status=CheckoutStatus.UNCACHED)
            handle = self._checkout_locked(key)
            status = CheckoutStatus.HIT
            if handle is None:
                self._counts["misses"] += 1
                waited_on = self._flights.get(key)
                if waited_on is None:
                    waited_on = DecodeFlight(key.fingerprint, self._lock)
                    self._flights[key] = waited_on
                    return SourceClaim(self._outcomes, waited_on, key)
                self._counts["waits"] += 1
                outcome = _await(waited_on, deadline, stop)
                waited = time.monotonic() - started
                if outcome is None:
                    self._counts["wait_timeouts"] += 1
                    raise SourceWaitTimeoutError(
                        f"waited {waited:.3f} s for the decode leader of source frame "
                        f"{key.fingerprint} on device {self._ledger.device_id}; raise the "
                        "timeout or retry"
                    )
                if outcome is FlightState.HANDOFF:
                    waited_on.take_lead()
                    self._counts["leader_retries"] += 1
                    return SourceClaim(self._outcomes, waited_on, key, waited_s=waited)
                if outcome is FlightState.FAILED:
                    error = waited_on.error
                    why = " ".join(str(error).split())  # what the leader itself was told
                    raise SourceDecodeError(
                        f"the decode leader of source frame {key.fingerprint} failed "
                        f"({type(error).__name__}{': ' + why if why else ''}); every waiter "
                        "gets this error"
                    ) from error
                # PUBLISHED: this caller is a copier of the flight until copied()
                status = CheckoutStatus.FOLLOWER
                try:
                    handle = self._checkout_locked(key)
                except BaseException:
                    waited_on.copied()
                    raise
                if handle is None:  # not retained (or evicted): copy the leader's value
                    flight, source = waited_on, waited_on.value
                else:
                    waited_on.copied()
        waited = time.monotonic() - started if status is CheckoutStatus.FOLLOWER else 0.0
        if flight is not None:
            return self._copy_leader_value(key, flight, source, domain, waited)
        assert handle is not None
        return self._copy_resident(key, handle, domain, status, waited, borrow)

    def checkout_resident(
        self, key: SourceFrameKey, *, domain: AllocationDomain, borrow: bool = False
    ) -> SourceCheckout | None:
        """A hit's :class:`SourceCheckout` when ``key`` is resident now, else None: no
        claim, no wait for a decode in flight, and a miss is not counted (the caller
        asks for another key next, whose :meth:`checkout_or_claim` counts it).
        ``borrow``: as :meth:`checkout_or_claim`'s."""
        if not isinstance(key, SourceFrameKey):
            raise ConfigError(
                f"checkout_resident needs a SourceFrameKey, got {type(key).__name__}"
            )
        if key.bypass is not None:
            return None
        with self._lock:
            handle = self._checkout_locked(key)
        if handle is None:
            return None
        return self._copy_resident(key, handle, domain, CheckoutStatus.HIT, 0.0, borrow)

    def _copy_resident(
        self,
        key: SourceFrameKey,
        handle: Any,
        domain: AllocationDomain,
        status: CheckoutStatus,
        waited: float,
        borrow: bool = False,
    ) -> SourceCheckout:
        """A copy of a pinned resident entry in ``domain`` (``borrow`` and a hit: the
        entry itself, read in place), carrying the pin."""
        if borrow and status is CheckoutStatus.HIT:
            detail = "borrowed from the resident entry (not copied); pinned until released"
            diag = SourceDiagnostics(key.fingerprint, status, detail, retained=True)
            return SourceCheckout(handle.value, diag, PinLease(handle))
        try:
            copy = handle.value.copy_into(domain)
        except BaseException:
            handle.release()
            raise
        detail = "copied from the resident entry; pinned until released"
        diag = SourceDiagnostics(key.fingerprint, status, detail, waited_s=waited, retained=True)
        return SourceCheckout(copy, diag, PinLease(handle))

    def _copy_leader_value(
        self,
        key: SourceFrameKey,
        flight: DecodeFlight,
        source: Any,
        domain: AllocationDomain,
        waited: float,
    ) -> SourceCheckout | None:
        """Copy the leader's value while the flight holds it; None when it was gone anyway."""
        try:
            copy = source.copy_into(domain)
        except LifecycleError:
            if domain.closed:  # this caller's own domain: leading would fail as well
                raise
            # released behind the flight's back (e.g. its attempt was torn down
            # while the leader was still publishing): never an error for this
            # caller, who asks again and decodes itself if need be
            self._events.record(
                "leader_handoff",
                key.fingerprint,
                detail="the leader's value was released before a follower copied it",
            )
            return None
        finally:
            with self._lock:
                flight.copied()
        detail = "copied from the leader's frame (not retained in the cache)"
        diag = SourceDiagnostics(
            key.fingerprint, CheckoutStatus.FOLLOWER, detail, waited_s=waited, retained=False
        )
        return SourceCheckout(copy, diag, None)

    def get_or_decode(
        self,
        key: SourceFrameKey,
        decode: Callable[[], DeviceValue],
        *,
        domain: AllocationDomain,
        timeout: float = SOURCE_WAIT_TIMEOUT_S,
    ) -> SourceCheckout:
        """:meth:`checkout_or_claim`, and when this caller leads, run ``decode()``
        (which returns the attempt-owned value) and publish it."""
        result = self.checkout_or_claim(key, domain=domain, timeout=timeout)
        if isinstance(result, SourceCheckout):
            return result
        with result:
            value = decode()
            return result.publish(value)

    # -- observability -------------------------------------------------------------------

    def event_snapshot(self) -> SourceEventSnapshot:
        """Recent fingerprinted events with the activity counters."""
        events, dropped = self._events.snapshot()
        with self._lock:
            counts = dict(self._counts)
        return SourceEventSnapshot(
            device_id=self._ledger.device_id,
            events=events,
            dropped_events=dropped,
            hits=counts["hits"],
            misses=counts["misses"],
            waits=counts["waits"],
            leader_retries=counts["leader_retries"],
            skipped_retentions=counts["skipped_retentions"],
            evictions=counts["evictions"],
        )

    def in_flight_keys(self) -> int:
        """Keys with a decode in progress (0 once every flight has settled)."""
        with self._lock:
            return len(self._flights)

    # -- leader outcomes (called by SourceClaim) -------------------------------------------

    def _complete(
        self,
        flight: DecodeFlight,
        key: SourceFrameKey,
        value: DeviceValue,
        started: float,
        share: bool = False,
    ) -> tuple[bool, str]:
        fingerprint = key.fingerprint
        retained, detail, nbytes, measured = False, "not retained", 0, 0
        copy_started = time.monotonic()
        try:
            nbytes = int(value.nbytes)
            self._events.record("load", fingerprint, nbytes=nbytes, seconds=copy_started - started)
            retained, detail, measured = self._retain(key, value, nbytes, share)
        finally:  # whatever happens (even a value that is no DeviceValue), waiters wake
            seconds = time.monotonic() - copy_started
            if retained:
                self._events.record("promotion", fingerprint, nbytes=measured, seconds=seconds)
            else:
                self._events.record(
                    "promotion_skipped", fingerprint, nbytes=nbytes, seconds=seconds, detail=detail
                )
            with self._lock:
                if not retained:
                    self._counts["skipped_retentions"] += 1
                flight.finish(value)
                if self._flights.get(key) is flight:
                    del self._flights[key]
                # the keepalive: the leader's caller gets its value back (and may
                # release it) only once every waiting follower has its own copy
                flight.await_copies()
        return retained, detail

    def _retain(
        self, key: SourceFrameKey, value: DeviceValue, nbytes: int, share: bool
    ) -> tuple[bool, str, int]:
        """Reserve, copy (or share: ``DeviceFrame.share_into``) into the cache domain,
        reconcile, publish; never raises for capacity."""
        try:
            entry = self.reserve(key, nbytes)
        except (CapacityError, AdmissionClosedError, LifecycleError) as exc:
            return False, f"not retained: {type(exc).__name__}: {exc}", 0
        try:
            sharing = getattr(value, "share_into", None) if share else None
            cached = None if sharing is None else sharing(self._factory.domain)
            if cached is None:
                cached = value.copy_into(self._factory.domain)
            entry.attach(cached, cached.device_arrays())
            del cached
        except BaseException as exc:  # allocation failure, a value that cannot copy, Ctrl-C
            # An interrupt must abandon the reservation too: else the entry
            # stays reserved and in flight, and a drain waits out its timeout.
            skipped = self._give_up(entry, exc)
            if not isinstance(exc, Exception):
                raise
            return skipped
        try:
            winner = self.publish(entry)
        except _RETENTION_SKIPS as exc:  # publish abandoned the reservation itself
            return False, f"not retained: {type(exc).__name__}: {exc}", 0
        return True, "decoded and retained in the source cache", winner.nbytes

    def _give_up(self, entry: ResidentEntry, exc: BaseException) -> tuple[bool, str, int]:
        detail = f"not retained: copying into the cache domain failed ({type(exc).__name__})"
        try:
            self.abandon(entry)
        except UnsafeTeardownError as unsafe:
            detail += f"; abandoning the reservation was unsafe: {unsafe}"
        return False, detail, 0

    def _fail(self, flight: DecodeFlight, key: SourceFrameKey, error: BaseException) -> None:
        self._events.record("load_failed", key.fingerprint, detail=type(error).__name__)
        with self._lock:
            self._counts["decode_errors"] += 1
            flight.fail(error)
            if self._flights.get(key) is flight:
                del self._flights[key]

    def _abandon(self, flight: DecodeFlight, key: SourceFrameKey, reason: str) -> None:
        with self._lock:
            handed = flight.hand_off()
            if not handed and self._flights.get(key) is flight:
                del self._flights[key]
        if handed:
            self._events.record("leader_handoff", key.fingerprint, detail=reason)

    def _note_evicted(self, entry: ResidentEntry) -> None:
        self._events.record("eviction", _fingerprint(entry.key), nbytes=entry.nbytes)
