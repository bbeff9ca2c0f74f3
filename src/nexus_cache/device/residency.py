"""The residency lifecycle of one cached device object, as an explicit state machine.

::

    AttemptOwned --reconcile--> Evictable <--pin / last release--> Pinned
         |                          |
         +-------- destroy ---------+--> Destroying --teardown ok--> Destroyed
                                                   \\--teardown unsafe--> Quarantined

* **AttemptOwned**: the ledger holds a reservation (the precharge) made
  before any byte is copied or built; the owner fills the entry.
* **Evictable**: published; the charge is the measured allocation.
* **Pinned**: checked out by one or more explicit :class:`PinHandle`; the
  whole charge moves here with the first pin and back with the last release.
* **Destroying**: new pins are blocked, the charge is held aside while the
  streams are synchronized and the memory freed.
* **Destroyed**: teardown proved the memory idle and free; charge released.
* **Quarantined**: teardown could not be proven safe; the charge stays and
  the device's admission is closed.

A pinned entry is never destroyed directly: destruction blocks new pins and
waits for the last release, so ``Pinned -> Destroyed`` always passes through
``Evictable``. Every transition happens under the owning ledger's lock, so the
ledger's byte buckets and the entries' states move together.
"""

from __future__ import annotations

import enum
import gc
import weakref
from collections.abc import Hashable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from nexus_cache.errors import LifecycleError, UnsafeTeardownError

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain, DeviceBackend
    from nexus_cache.device.ledger import DeviceLedger

__all__ = ["TRANSITIONS", "PinHandle", "ResidencyState", "ResidentEntry"]


class ResidencyState(enum.Enum):
    ATTEMPT_OWNED = "attempt_owned"
    EVICTABLE = "evictable"
    PINNED = "pinned"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    QUARANTINED = "quarantined"


_S = ResidencyState

#: Every transition the ledger may perform; anything else is a defect.
TRANSITIONS: Mapping[ResidencyState, frozenset[ResidencyState]] = {
    _S.ATTEMPT_OWNED: frozenset({_S.EVICTABLE, _S.DESTROYING}),
    _S.EVICTABLE: frozenset({_S.PINNED, _S.DESTROYING}),
    _S.PINNED: frozenset({_S.EVICTABLE}),
    _S.DESTROYING: frozenset({_S.DESTROYED, _S.QUARANTINED}),
    _S.DESTROYED: frozenset(),
    _S.QUARANTINED: frozenset(),
}


class ResidentEntry:
    """One charged object in a device cache. Created by :meth:`DeviceLedger.reserve`.

    Thread-safe for pins, releases and destruction (they run under the
    ledger's lock); filling an AttemptOwned entry (:meth:`attach`) belongs to
    the one thread that reserved it.
    """

    __slots__ = (
        "__weakref__",
        "_backend",
        "_closing",
        "_domain",
        "_failure",
        "_key",
        "_ledger",
        "_nbytes",
        "_owner",
        "_payload",
        "_pins",
        "_reserved_bytes",
        "_roots",
        "_state",
        "_streams",
    )

    def __init__(
        self,
        ledger: DeviceLedger,
        key: Hashable,
        nbytes: int,
        *,
        domain: AllocationDomain | None = None,
        backend: DeviceBackend | None = None,
    ) -> None:
        self._ledger = ledger
        self._key = key
        self._nbytes = nbytes
        self._reserved_bytes = nbytes
        self._state = _S.ATTEMPT_OWNED
        self._pins = 0
        self._closing = False
        self._domain = domain
        self._backend = backend
        self._payload: Any = None
        self._roots: tuple[Any, ...] = ()
        self._streams: tuple[Any, ...] = ()
        self._owner: Any = None
        self._failure: str | None = None

    def __repr__(self) -> str:
        return (
            f"ResidentEntry(key={self._key!r}, device={self._ledger.device_id}, "
            f"state={self._state.value}, nbytes={self._nbytes}, pins={self._pins})"
        )

    @property
    def key(self) -> Hashable:
        return self._key

    @property
    def ledger(self) -> DeviceLedger:
        return self._ledger

    @property
    def state(self) -> ResidencyState:
        return self._state

    @property
    def nbytes(self) -> int:
        """Bytes charged to the ledger: the reservation, then the measured size."""
        return self._nbytes

    @property
    def reserved_bytes(self) -> int:
        return self._reserved_bytes

    @property
    def pins(self) -> int:
        return self._pins

    @property
    def pins_blocked(self) -> bool:
        """True once destruction began: no new pin is granted."""
        return self._closing

    @property
    def failure(self) -> str | None:
        """Why teardown was unsafe (Quarantined entries only)."""
        return self._failure

    # -- filling (AttemptOwned) ------------------------------------------------

    def attach(self, value: Any, arrays: tuple[Any, ...] | list[Any] = ()) -> None:
        """Set the cached value and the domain arrays it holds (AttemptOwned only).

        ``arrays`` must be allocated in the entry's domain; they are what
        :meth:`measured_bytes` counts and what teardown proves unreachable.
        """
        self._require_owned("attach a value")
        roots = []
        for array in arrays:
            if self._domain is None:
                raise LifecycleError("this entry has no allocation domain; attach no arrays")
            self._domain.allocation_bytes(array)  # raises for a foreign array
            roots.append(self._domain.root_of(array))
        self._payload = value
        self._roots = (*self._roots, *roots)

    def record_stream(self, stream: Any) -> None:
        """Remember a stream that used this entry's memory; teardown synchronizes it."""
        if self._state in (_S.DESTROYED, _S.QUARANTINED):
            raise LifecycleError(f"{self!r} is already torn down")
        self._streams = (*self._streams, stream)

    def measured_bytes(self) -> int:
        """Rounded bytes of the distinct domain allocations attached so far."""
        if self._domain is None:
            return 0
        return self._domain.measured_bytes(self._roots)

    def publish(self, measured_bytes: int | None = None, *, evict: bool = True) -> None:
        """Reconcile the reservation to the measured bytes; AttemptOwned -> Evictable.

        ``measured_bytes`` defaults to :meth:`measured_bytes`. Growth beyond the
        reservation must fit the ledger (with ``evict``, by evicting); on
        refusal the entry stays AttemptOwned and the caller should
        :meth:`destroy` it.
        """
        if measured_bytes is None:
            measured_bytes = self.measured_bytes()
        self._ledger.reconcile(self, measured_bytes, evict=evict)

    # -- pins ------------------------------------------------------------------

    def pin(self) -> PinHandle:
        """Check the entry out; the whole charge is Pinned until the last release."""
        return self._ledger.pin(self)

    # -- destruction -------------------------------------------------------------

    def destroy(self, timeout: float = 0.0) -> None:
        """Tear down an entry that no cache owns (e.g. abandon a reservation).

        Published cache entries leave only by eviction or shutdown (there is
        no per-key clear), so this raises :class:`LifecycleError` for them.
        """
        if self._owner is not None:
            raise LifecycleError(
                f"{self!r} is published in the {self._owner.kind} cache; it leaves only by "
                "eviction or shutdown (there is no per-key clear)"
            )
        self._destroy(timeout)

    def _destroy(self, timeout: float | None) -> None:
        self._ledger._begin_destroy(self, timeout)
        self._teardown()

    def _teardown(self) -> None:
        """Prove the memory idle and free, then release the charge (Destroying only).

        Raises :class:`UnsafeTeardownError` (after quarantining) when any step fails.
        """
        if self._state is not _S.DESTROYING:
            raise LifecycleError(f"{self!r} is not being destroyed")
        streams, self._streams = self._streams, ()
        try:
            if self._backend is not None:
                self._backend.synchronize(self._ledger.device_id, streams)
            else:
                for stream in streams:
                    stream.synchronize()
        except BaseException as exc:
            self._quarantine(f"stream synchronization failed: {exc!r}", exc)
        refs = [weakref.ref(root) for root in self._roots]
        self._roots = ()
        self._payload = None
        alive = [ref for ref in refs if ref() is not None]
        if alive:
            gc.collect()  # a reference cycle may be all that keeps them
            alive = [ref for ref in alive if ref() is not None]
        if alive:
            self._quarantine(
                f"{len(alive)} allocation(s) are still referenced outside the cache "
                "(a pin holder kept an array past its release)",
                None,
            )
        if self._domain is not None:
            try:
                self._domain.release_unused()
            except BaseException as exc:
                self._quarantine(f"returning freed blocks to the device failed: {exc!r}", exc)
        self._ledger._complete_destroy(self)

    def _quarantine(self, reason: str, cause: BaseException | None) -> None:
        self._failure = reason
        self._ledger._fail_destroy(self, reason)
        raise UnsafeTeardownError(
            f"teardown of {self!r} is not provably safe: {reason}; its {self._nbytes} B stay "
            f"charged and admission on device {self._ledger.device_id} is closed"
        ) from cause

    def _require_owned(self, what: str) -> None:
        if self._state is not _S.ATTEMPT_OWNED:
            raise LifecycleError(
                f"cannot {what}: {self!r} is {self._state.value}, not attempt_owned"
            )


class PinHandle:
    """An explicit pin on a resident entry. Release exactly once.

    As a context manager it releases on exit unless already released inside
    the block; calling :meth:`release` twice raises :class:`LifecycleError`
    and leaves the ledger untouched. Thread-safe.
    """

    __slots__ = ("_entry", "_released")

    def __init__(self, entry: ResidentEntry) -> None:
        self._entry = entry
        self._released = False

    def __repr__(self) -> str:
        return f"PinHandle({self._entry!r}, released={self._released})"

    @property
    def entry(self) -> ResidentEntry:
        return self._entry

    @property
    def released(self) -> bool:
        return self._released

    @property
    def value(self) -> Any:
        """The cached value; only while this pin is held."""
        if self._released:
            raise LifecycleError("the pin was released; check the entry out again")
        return self._entry._payload

    def release(self) -> None:
        self._entry._ledger._release_pin(self)

    def __enter__(self) -> PinHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._released:
            self.release()
