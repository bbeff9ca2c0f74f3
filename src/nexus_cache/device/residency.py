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
``Evictable``.

Ownership: a :class:`ResidentEntry` owns its state, charge and pin count, and
the :data:`TRANSITIONS` table (defined in ``_states``) is the only way they change. The
ledger owns the byte buckets; an entry moves its bytes from one bucket to the
next through the ledger's public :class:`LedgerBooks` methods while holding
the ledger's lock, so a state and its bytes always move together. This module
never imports the ledger (the ledger imports it).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Hashable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from nexus_cache.device._checks import check_byte_count
from nexus_cache.device._states import TRANSITIONS, LedgerBooks, ResidencyState
from nexus_cache.errors import LifecycleError, UnsafeTeardownError

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain, DeviceBackend

__all__ = ["TRANSITIONS", "LedgerBooks", "PinHandle", "ResidencyState", "ResidentEntry"]

_S = ResidencyState
_ATTEMPT_OWNED = _S.ATTEMPT_OWNED
_EVICTABLE = _S.EVICTABLE
_PINNED = _S.PINNED
_DESTROYING = _S.DESTROYING


class ResidentEntry:
    """One charged object in a device cache. Created by ``DeviceLedger.reserve``.

    The entry is the one owner of its lifecycle state (state, charge, pins,
    pin blocking); every change goes through :data:`TRANSITIONS` under the
    ledger's lock. Thread-safe for pins, releases, publication and
    destruction; filling an AttemptOwned entry (:meth:`attach`) belongs to the
    one thread that reserved it.
    """

    __slots__ = (
        "__weakref__",
        "_backend",
        "_closing",
        "_domain",
        "_failure",
        "_idle",
        "_key",
        "_ledger",
        "_lock",
        "_move_bytes",
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
        ledger: LedgerBooks,
        key: Hashable,
        nbytes: int,
        *,
        domain: AllocationDomain | None = None,
        backend: DeviceBackend | None = None,
    ) -> None:
        """An AttemptOwned entry; the ledger has already charged ``nbytes`` as reserved."""
        self._ledger = ledger
        self._lock = ledger.lock
        self._move_bytes = ledger.move_locked
        self._key = key
        self._nbytes = nbytes
        self._reserved_bytes = nbytes
        self._state = _ATTEMPT_OWNED
        self._pins = 0
        self._closing = False
        self._idle: threading.Condition | None = None
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
    def ledger(self) -> LedgerBooks:
        return self._ledger

    @property
    def domain(self) -> AllocationDomain | None:
        return self._domain

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

    @property
    def owner(self) -> Any:
        """The cache that claimed this entry (:meth:`claim`), or None."""
        return self._owner

    # -- filling (AttemptOwned) ------------------------------------------------

    def claim(self, owner: Any) -> None:
        """Bind this AttemptOwned entry to the cache that will own it (once).

        From then on only ``destroy(owner=owner)`` tears it down: published
        cache entries leave by eviction or shutdown, never by a per-key clear.
        """
        self._require_owned("claim")
        if self._owner is not None:
            raise LifecycleError(f"{self!r} is already claimed by the {self._owner.kind} cache")
        self._owner = owner

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
        reservation is a new cache charge and must fit the ledger (with
        ``evict``, by evicting); on refusal the entry stays AttemptOwned and
        the caller should :meth:`destroy` it. Shrinking always succeeds.
        """
        if measured_bytes is None:
            measured_bytes = self.measured_bytes()
        check_byte_count("measured_bytes", measured_bytes)
        ledger = self._ledger
        with ledger.lock:
            self._require_owned("publish")
            growth = measured_bytes - self._nbytes
            if growth <= 0:
                self._move_locked(_EVICTABLE, measured_bytes)
                return

        def commit() -> None:
            self._require_owned("publish")
            self._move_locked(_EVICTABLE, measured_bytes)

        ledger.charge_cache(growth, commit, evict=evict)

    # -- pins (the hot path: one lock acquisition, integers) ---------------------

    def pin(self) -> PinHandle:
        """Check the entry out; the whole charge is Pinned until the last release."""
        with self._lock:
            if self._closing:
                raise LifecycleError(f"cannot pin {self!r}: it is being destroyed")
            state = self._state
            if state is _PINNED:
                self._pins += 1
            elif state is _EVICTABLE:  # the Evictable -> Pinned edge, inlined (hot path)
                nbytes = self._nbytes
                self._move_bytes(_EVICTABLE, _PINNED, nbytes, nbytes)
                self._state = _PINNED
                self._pins = 1
            else:
                raise LifecycleError(
                    f"cannot pin {self!r}: only evictable or pinned entries can be pinned"
                )
        return PinHandle(self)

    def _unpin_locked(self) -> None:
        if self._state is not _PINNED:
            raise LifecycleError(f"{self!r} holds no pin to release")
        self._pins -= 1
        if self._pins == 0:  # the Pinned -> Evictable edge, inlined (hot path)
            nbytes = self._nbytes
            self._move_bytes(_PINNED, _EVICTABLE, nbytes, nbytes)
            self._state = _EVICTABLE
            if self._idle is not None:
                self._idle.notify_all()

    # -- destruction -------------------------------------------------------------

    def destroy(self, timeout: float | None = 0.0, *, owner: Any = None) -> None:
        """Block new pins, wait up to ``timeout`` s (None: forever) for the last
        release, then tear down (:meth:`teardown`).

        An entry a cache claimed is destroyed only by that cache (pass it as
        ``owner``): published entries leave by eviction or shutdown, there is
        no per-key clear. Raises :class:`LifecycleError` when pins outlive the
        timeout (pins stay blocked; destroy again later) and
        :class:`UnsafeTeardownError` when teardown is not provably safe.
        """
        if self._owner is not None and owner is not self._owner:
            raise LifecycleError(
                f"{self!r} is published in the {self._owner.kind} cache; it leaves only by "
                "eviction or shutdown (there is no per-key clear)"
            )
        self._begin_destroy(timeout)
        self.teardown()

    def _begin_destroy(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ledger.lock:
            if self._state not in (_ATTEMPT_OWNED, _EVICTABLE, _PINNED):
                raise LifecycleError(f"cannot destroy {self!r}: already being destroyed")
            self._closing = True
            while self._state is _PINNED:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LifecycleError(
                        f"cannot destroy {self!r} yet: {self._pins} pin(s) still held after "
                        f"{timeout} s; new pins are blocked, destroy again after they release"
                    )
                if self._idle is None:
                    self._idle = threading.Condition(self._ledger.lock)
                self._idle.wait(remaining)
            self._move_locked(_DESTROYING)

    def begin_eviction(self) -> bool:
        """Start destroying this entry if it is evictable right now; never waits.

        Returns False (and changes nothing) for any other state. On True the
        caller must finish with :meth:`teardown`.
        """
        with self._ledger.lock:
            if self._state is not _EVICTABLE or self._closing:
                return False
            self._closing = True
            self._move_locked(_DESTROYING)
            return True

    def teardown(self) -> None:
        """Prove the memory idle and free, then release the charge (Destroying only).

        Order: synchronize the recorded streams (or the whole device), drop
        the cache's references and prove the owning arrays unreachable,
        return freed blocks to the device, and only then release the charge.
        Raises :class:`UnsafeTeardownError` (after quarantining: the charge
        stays and admission closes) when any step fails.
        """
        if self._state is not _DESTROYING:
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
        with self._ledger.lock:
            self._move_locked(_S.DESTROYED)

    def _quarantine(self, reason: str, cause: BaseException | None) -> None:
        ledger = self._ledger
        with ledger.lock:
            described = f"unsafe teardown of {self!r}: {reason}"
            self._failure = reason
            self._move_locked(_S.QUARANTINED)
            ledger.record_unsafe_teardown_locked(described)
        raise UnsafeTeardownError(
            f"teardown of {self!r} is not provably safe: {reason}; its {self._nbytes} B stay "
            f"charged and admission on device {ledger.device_id} is closed"
        ) from cause

    # -- the state table -----------------------------------------------------------

    def _move_locked(self, dst: ResidencyState, nbytes: int | None = None) -> None:
        """Take the edge to ``dst`` (ledger lock held), moving the charge with it."""
        src = self._state
        if dst not in TRANSITIONS[src]:
            raise LifecycleError(f"{self!r}: {src.value} -> {dst.value} is not a transition")
        new = self._nbytes if nbytes is None else nbytes
        self._move_bytes(src, dst, self._nbytes, new)
        self._nbytes = new
        self._state = dst

    def _require_owned(self, what: str) -> None:
        if self._state is not _ATTEMPT_OWNED:
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
        entry = self._entry
        with entry._lock:
            if self._released:
                raise LifecycleError(f"pin on {entry!r} was already released")
            entry._unpin_locked()
            self._released = True

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
