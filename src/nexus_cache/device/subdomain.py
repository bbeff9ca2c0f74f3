"""What the source and graph caches share: an entry registry on one domain.

A subdomain owns its entries from reservation to teardown. It offers
reserve, publish, abandon, checkout, close and drain; there is deliberately
no per-key removal. Lock order: subdomain lock, then ledger lock; the ledger
never calls back into a subdomain while holding its own lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from nexus_cache.device.domain import DeviceCacheAllocationFactory
from nexus_cache.device.ledger import DeviceLedger
from nexus_cache.device.residency import PinHandle, ResidencyState, ResidentEntry
from nexus_cache.errors import LifecycleError, UnsafeTeardownError

__all__ = ["CacheSubdomain", "DrainResult", "EntryView", "SubdomainStats"]

_GONE = (ResidencyState.DESTROYING, ResidencyState.DESTROYED, ResidencyState.QUARANTINED)


@dataclass(frozen=True)
class SubdomainStats:
    """Registry size and activity counters of one subdomain."""

    kind: str
    closed: bool
    entries: int
    in_flight: int
    quarantined: int
    hits: int
    misses: int
    waits: int
    leader_retries: int
    wait_timeouts: int
    decode_errors: int
    skipped_retentions: int
    reservations: int
    publishes: int
    duplicates: int
    abandoned: int
    evictions: int
    evicted_bytes: int
    destroyed: int
    unsafe_teardowns: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EntryView:
    """One published entry as a status page shows it: its key (an object the
    subclass knows how to summarize), charged bytes, pins held now, hits since it
    was published, and when it was published and last checked out (wall-clock
    seconds since the epoch)."""

    key: Hashable
    nbytes: int
    pins: int
    hits: int
    published_at: float
    last_used_at: float
    #: what the subclass adds (a parked graph: ``vertices`` and ``edges``)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DrainResult:
    """What a drain left behind; ``complete`` when nothing."""

    kind: str
    destroyed: int
    still_pinned: int
    in_flight: int
    quarantined: int

    @property
    def complete(self) -> bool:
        return not (self.still_pinned or self.in_flight or self.quarantined)


_COUNTERS = (
    "hits",
    "misses",
    "waits",
    "leader_retries",
    "wait_timeouts",
    "decode_errors",
    "skipped_retentions",
    "reservations",
    "publishes",
    "duplicates",
    "abandoned",
    "evictions",
    "evicted_bytes",
    "destroyed",
    "unsafe_teardowns",
)


class CacheSubdomain:
    """Registry of resident entries of one kind on one device. Thread-safe."""

    #: name in reports ("source", "graph")
    kind: ClassVar[str] = "cache"
    #: register an LRU evictor with the ledger, so grants and reservations
    #: may reclaim this subdomain's unpinned entries
    evicts_lru: ClassVar[bool] = False
    #: let this subdomain's own reservations evict to make room
    evict_on_reserve: ClassVar[bool] = False

    def __init__(self, ledger: DeviceLedger, factory: DeviceCacheAllocationFactory) -> None:
        self._ledger = ledger
        self._factory = factory
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._entries: OrderedDict[Hashable, ResidentEntry] = OrderedDict()
        self._in_flight: dict[int, ResidentEntry] = {}
        self._tearing_down = 0
        self._quarantined: list[ResidentEntry] = []
        self._closed = False
        self._counts = dict.fromkeys(_COUNTERS, 0)
        # per published key: [hits, published_at, last_used_at] (wall clock)
        self._uses: dict[Hashable, list[Any]] = {}
        if self.evicts_lru:
            ledger.add_evictor(self._evict)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(device={self._ledger.device_id}, entries={len(self._entries)})"

    @property
    def ledger(self) -> DeviceLedger:
        return self._ledger

    @property
    def factory(self) -> DeviceCacheAllocationFactory:
        return self._factory

    @property
    def closed(self) -> bool:
        return self._closed

    # -- filling ---------------------------------------------------------------------

    def reserve(self, key: Hashable, nbytes: int) -> ResidentEntry:
        """Precharge ``nbytes`` for ``key``; returns an AttemptOwned entry to fill.

        Raises a :class:`CapacityError` subclass or :class:`AdmissionClosedError`
        when it cannot be charged (the caller then runs uncached), and
        :class:`LifecycleError` once the subdomain is closed.
        """
        self._require_open()
        entry = self._factory.reserve(self._ledger, key, nbytes, evict=self.evict_on_reserve)
        entry.claim(self)
        with self._lock:
            self._in_flight[id(entry)] = entry
            self._counts["reservations"] += 1
        return entry

    def publish(self, entry: ResidentEntry, measured_bytes: int | None = None) -> ResidentEntry:
        """Reconcile ``entry`` to its measured bytes and make it visible.

        Returns the resident entry for the key: ``entry`` itself, or the one
        already published by a concurrent builder (then ``entry`` is torn
        down). If reconciling fails the reservation is abandoned and the error
        re-raised.
        """
        self._require_in_flight(entry)
        try:
            entry.publish(measured_bytes, evict=self.evict_on_reserve)
        except BaseException:
            self.abandon(entry)
            raise
        with self._lock:
            existing = self._entries.get(entry.key)
            if not self._closed and existing is None:
                del self._in_flight[id(entry)]
                self._entries[entry.key] = entry
                now = time.time()
                self._uses[entry.key] = [0, now, now]
                self._counts["publishes"] += 1
                self._settled.notify_all()
                return entry
        self._discard(entry, "duplicates")
        if existing is None:
            raise LifecycleError(f"the {self.kind} cache closed; {entry!r} was discarded")
        return existing

    def abandon(self, entry: ResidentEntry) -> None:
        """Tear down a reservation that will not be published (copy failed, pressure)."""
        self._require_in_flight(entry)
        self._discard(entry, "abandoned")

    # -- hits ------------------------------------------------------------------------

    def checkout(self, key: Hashable) -> PinHandle | None:
        """Pin the resident entry for ``key``; None on a miss (or once closed)."""
        with self._lock:
            handle = self._checkout_locked(key)
            if handle is None:
                self._counts["misses"] += 1
            return handle

    def _checkout_locked(self, key: Hashable) -> PinHandle | None:
        """Pin and LRU-touch the resident entry (counts the hit); None if absent."""
        entry = None if self._closed else self._entries.get(key)
        if entry is None:
            return None
        try:
            handle = entry.pin()
        except LifecycleError:  # being evicted right now
            return None
        self._entries.move_to_end(key)
        self._counts["hits"] += 1
        use = self._uses.get(key)
        if use is not None:
            use[0] += 1
            use[2] = time.time()
        return handle

    # -- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new reservations and hits; publications after this are discarded."""
        with self._lock:
            self._closed = True

    def drain(self, timeout: float = 10.0) -> DrainResult:
        """Close, then destroy every entry, waiting up to ``timeout`` s for pins and builders."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
        destroyed = still_pinned = 0
        for entry in entries:
            remaining = max(0.0, deadline - time.monotonic())
            with self._lock:
                self._tearing_down += 1
            try:
                entry.destroy(remaining, owner=self)
            except UnsafeTeardownError:
                self._record_unsafe(entry)
            except LifecycleError:
                if entry.state not in _GONE:
                    still_pinned += 1
                continue
            else:
                destroyed += 1
                with self._lock:
                    self._counts["destroyed"] += 1
            finally:
                with self._lock:
                    self._tearing_down -= 1
                    self._settled.notify_all()
            with self._lock:
                self._remove_published(entry)
        with self._lock:
            while self._in_flight or self._tearing_down:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._settled.wait(remaining)
            return DrainResult(
                kind=self.kind,
                destroyed=destroyed,
                still_pinned=still_pinned,
                in_flight=len(self._in_flight),
                quarantined=len(self._quarantined),
            )

    def resident_bytes(self) -> int:
        """Charged bytes of the published entries (pinned or not)."""
        with self._lock:
            return sum(entry.nbytes for entry in self._entries.values())

    def entries(self) -> list[EntryView]:
        """The published entries, most recently used first."""
        with self._lock:
            rows = [
                (entry, self._uses.get(key) or [0, 0.0, 0.0])
                for key, entry in reversed(self._entries.items())
            ]
        return [
            EntryView(entry.key, entry.nbytes, entry.pins, int(use[0]), use[1], use[2])
            for entry, use in rows
        ]

    def stats(self) -> SubdomainStats:
        with self._lock:
            return SubdomainStats(
                kind=self.kind,
                closed=self._closed,
                entries=len(self._entries),
                in_flight=len(self._in_flight),
                quarantined=len(self._quarantined),
                **self._counts,
            )

    # -- internals ----------------------------------------------------------------------

    def _evict(self, nbytes: int) -> int:
        """Ledger evictor: tear down unpinned entries, least recently used first."""
        gone = self._tear_down(self._take_unpinned(lambda _key: True, nbytes))
        freed = sum(entry.nbytes for entry in gone)
        with self._lock:
            self._counts["evictions"] += len(gone)
            self._counts["evicted_bytes"] += freed
        for entry in gone:
            self._note_evicted(entry)
        return freed

    def _take_unpinned(
        self, select: Callable[[Hashable], bool], nbytes: int
    ) -> list[ResidentEntry]:
        """Unpublish unpinned entries whose key ``select`` accepts, least recently used
        first, until ``nbytes`` are planned; each is then being torn down."""
        victims: list[ResidentEntry] = []
        with self._lock:
            planned = 0
            for key, entry in self._entries.items():
                if planned >= nbytes:
                    break
                if select(key) and entry.begin_eviction():
                    victims.append(entry)
                    planned += entry.nbytes
            for entry in victims:
                del self._entries[entry.key]
                self._uses.pop(entry.key, None)
            self._tearing_down += len(victims)
        return victims

    def _tear_down(self, victims: list[ResidentEntry]) -> list[ResidentEntry]:
        """Tear down entries :meth:`_take_unpinned` returned; those safely destroyed
        (an unsafe one is quarantined)."""
        gone: list[ResidentEntry] = []
        for entry in victims:
            try:
                entry.teardown()
            except UnsafeTeardownError:
                self._record_unsafe(entry)
            else:
                gone.append(entry)
            finally:
                with self._lock:
                    self._tearing_down -= 1
                    self._settled.notify_all()
        return gone

    def _note_evicted(self, entry: ResidentEntry) -> None:
        """Hook for subclasses: ``entry`` was evicted (no lock held)."""

    def _discard(self, entry: ResidentEntry, counter: str) -> None:
        try:
            entry.destroy(0.0, owner=self)
        except UnsafeTeardownError:
            self._record_unsafe(entry)
            raise
        finally:
            with self._lock:
                self._in_flight.pop(id(entry), None)
                self._counts[counter] += 1
                self._settled.notify_all()

    def _record_unsafe(self, entry: ResidentEntry) -> None:
        with self._lock:
            self._remove_published(entry)
            self._quarantined.append(entry)
            self._counts["unsafe_teardowns"] += 1

    def _remove_published(self, entry: ResidentEntry) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
            self._uses.pop(entry.key, None)

    def _require_open(self) -> None:
        if self._closed:
            raise LifecycleError(
                f"the {self.kind} cache on device {self._ledger.device_id} is closed"
            )

    def _require_in_flight(self, entry: ResidentEntry) -> None:
        with self._lock:
            if self._in_flight.get(id(entry)) is not entry:
                raise LifecycleError(f"{entry!r} is not a reservation of this {self.kind} cache")
