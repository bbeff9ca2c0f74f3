"""The interface every device backend implements (``cuda`` and ``host``).

A backend gives the cache layer what it needs and nothing more: its
``kind`` (the registry entry of ``backends.kinds``: name, host or device
memory, whether queries run CUDA kernels), the array module ``xp``, device
memory information, a device scope, allocation domains (each answering
``host_memory``), and stream synchronization. Cache logic is written once
against this interface and asks it instead of comparing backend names, so
the host backend runs in CI exactly the code paths the GPU runs.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from nexus_cache.backends.kinds import BackendKind
from nexus_cache.errors import ConfigError, LifecycleError

__all__ = [
    "ALLOCATION_ROUNDING_BYTES",
    "AllocationDomain",
    "AllocationScope",
    "DeviceBackend",
    "DomainCounters",
    "MemoryInfo",
    "round_allocation",
]

#: Both backends round every allocation up to this many bytes (CuPy's pool
#: granularity), so measured sizes agree between CI and the GPU.
ALLOCATION_ROUNDING_BYTES = 512


def round_allocation(nbytes: int) -> int:
    """Bytes an allocation of ``nbytes`` really occupies in a domain (0 stays 0)."""
    unit = ALLOCATION_ROUNDING_BYTES
    return -(-nbytes // unit) * unit


@dataclass(frozen=True)
class MemoryInfo:
    """Free and total memory of one device, in bytes, as the driver reports it."""

    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class DomainCounters:
    """Physical usage and activity of one allocation domain.

    ``used_bytes`` is what live allocations occupy; ``held_bytes`` adds the
    freed blocks the domain still keeps from the device until
    :meth:`AllocationDomain.release_unused` gives them back.
    """

    used_bytes: int
    held_bytes: int
    allocations: int
    allocated_bytes: int
    releases: int
    returned_bytes: int


class AllocationScope:
    """Bytes allocated in a domain by one thread while the scope was open.

    Not thread-safe by design: a scope belongs to the thread that opened it.
    """

    __slots__ = ("allocated_bytes", "allocations")

    def __init__(self) -> None:
        self.allocated_bytes = 0
        self.allocations = 0

    def add(self, nbytes: int) -> None:
        """Count one allocation of ``nbytes`` (the domain calls this)."""
        self.allocated_bytes += nbytes
        self.allocations += 1


class _ScopeStack(threading.local):
    """Per-thread stack of open scopes of one domain."""

    def __init__(self) -> None:
        self.scopes: list[AllocationScope] = []


class AllocationDomain(abc.ABC):
    """Where cache bytes of one device are allocated and measured.

    The base class keeps the activity counters every domain reports
    (allocations, allocated bytes, releases, returned bytes) and the closed
    flag; a subclass supplies the physical usage (:meth:`physical_usage`) and
    calls :meth:`count_allocation` / :meth:`count_release`.

    Thread-safe: allocations may come from any thread; a scope counts only the
    allocations of the thread that opened it.
    """

    #: the backend whose memory this domain allocates (its registry entry)
    kind: ClassVar[BackendKind]
    #: True when allocations past :attr:`limit_bytes` fail in the allocator
    #: itself (RMM's limiting adaptor); otherwise the ledger alone holds the cap
    enforces_limit: bool = False

    def __init__(self, device_id: int, *, limit_bytes: int | None = None) -> None:
        self._device_id = device_id
        self._limit_bytes = limit_bytes
        self._scope_stack = _ScopeStack()
        self._counter_lock = threading.Lock()
        self._allocations = 0
        self._allocated_bytes = 0
        self._releases = 0
        self._returned_bytes = 0
        self._closed = False

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def limit_bytes(self) -> int | None:
        """The limit the domain was built with (the cache cap), or None."""
        return self._limit_bytes

    @property
    def host_memory(self) -> bool:
        """True when the domain's arrays live in host memory: a host buffer gets
        in by a plain copy (no pinned staging, no copy stream) and an array may
        be read by the host in place. False for device memory."""
        return self.kind.host_memory

    @property
    @abc.abstractmethod
    def xp(self) -> Any:
        """The array module whose arrays this domain allocates."""

    @abc.abstractmethod
    def scope(self) -> AbstractContextManager[AllocationScope]:
        """Route this thread's allocations into the domain and count them."""

    @abc.abstractmethod
    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array allocated in the domain."""

    @abc.abstractmethod
    def copy_in(self, array: Any) -> Any:
        """A copy of ``array`` (host or device) allocated in the domain."""

    def adopt(self, array: Any) -> Any | None:
        """``array`` itself, booked as an allocation of this domain (no copy), or None
        where the domain cannot take it: it then goes in by a copy. The caller hands
        over a buffer nothing else reads, writes or frees (one a decoder allocated
        for it alone). Device domains take none (their memory comes from their own
        pool); the host domain takes a writable, contiguous NumPy array that owns
        its view of the memory."""
        return None

    def disown(self, array: Any) -> Any | None:
        """``array`` (an allocation of this domain, the array :meth:`root_of` gives)
        taken off the domain's books, the inverse of :meth:`adopt`, or None where
        the domain cannot give it away: it then stays an allocation of the domain.
        Its bytes count as freed, but the memory is neither freed nor kept for reuse:
        it belongs to whatever references it from now on (host buffers an Arrow
        result wraps, kept alive by their reference count). The caller hands over
        a buffer nothing else writes. Device domains give none (their memory goes
        back to their own pool); the host domain gives any live allocation."""
        return None

    def share(self, array: Any) -> Any | None:
        """A new array over ``array``'s memory (an allocation of another domain, the
        array :meth:`root_of` gives there), booked as an allocation of this domain
        with no copy and read-only, or None where the domain cannot share it: the
        caller then copies it in. Sharing is safe only for memory that nobody
        writes and nothing reuses while any array references it. Device domains
        share none (a pool reuses freed memory); the host domain shares an array
        whose memory is a reference-counted Arrow buffer, which lives as long as
        either array (or any view of them) does."""
        return None

    @abc.abstractmethod
    def root_of(self, array: Any) -> Any:
        """The array that owns ``array``'s allocation (itself unless a view)."""

    @abc.abstractmethod
    def allocation_bytes(self, array: Any) -> int:
        """Rounded bytes of the allocation behind ``array``; raises if not ours."""

    @abc.abstractmethod
    def physical_usage(self) -> tuple[int, int]:
        """``(used_bytes, held_bytes)`` as the allocator reports them now."""

    def counters(self) -> DomainCounters:
        """A snapshot of physical usage and activity."""
        used, held = self.physical_usage()
        with self._counter_lock:
            return DomainCounters(
                used_bytes=used,
                held_bytes=held,
                allocations=self._allocations,
                allocated_bytes=self._allocated_bytes,
                releases=self._releases,
                returned_bytes=self._returned_bytes,
            )

    def count_allocation(self, nbytes: int) -> None:
        """Record one allocation of ``nbytes`` (rounded) in the counters and open scopes."""
        with self._counter_lock:
            self._allocations += 1
            self._allocated_bytes += nbytes
        for scope in self._scope_stack.scopes:
            scope.add(nbytes)

    def count_release(self, returned_bytes: int) -> None:
        """Record one :meth:`release_unused` that gave ``returned_bytes`` back."""
        with self._counter_lock:
            self._releases += 1
            self._returned_bytes += returned_bytes

    @abc.abstractmethod
    def release_unused(self) -> int:
        """Give freed blocks back to the device; returns how many bytes."""

    def close(self) -> None:
        """Release the domain: give every freed block back, refuse new allocations.

        Idempotent. Raises :class:`LifecycleError` while allocations live
        (dropping the allocator then would strand them); nothing changes.
        """
        with self._counter_lock:
            if self._closed:
                return
        used = self.physical_usage()[0]
        if used:
            raise LifecycleError(
                f"cannot close the allocation domain of {self.kind.label} device "
                f"{self._device_id}: {used} B are still live in it"
            )
        self.release_unused()
        with self._counter_lock:
            self._closed = True

    def require_open(self) -> None:
        """Raise :class:`LifecycleError` once the domain is closed."""
        if self._closed:
            raise LifecycleError(
                f"allocation domain of {self.kind.label} device {self._device_id} is closed"
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def used_bytes(self) -> int:
        return self.counters().used_bytes

    def measured_bytes(self, arrays: Iterable[Any]) -> int:
        """Rounded bytes of the distinct allocations behind ``arrays``."""
        seen: dict[int, int] = {}
        for array in arrays:
            root = self.root_of(array)
            if id(root) not in seen:
                seen[id(root)] = self.allocation_bytes(root)
        return sum(seen.values())

    def _push_scope(self) -> AllocationScope:
        scope = AllocationScope()
        self._scope_stack.scopes.append(scope)
        return scope

    def _pop_scope(self, scope: AllocationScope) -> None:
        self._scope_stack.scopes.remove(scope)


class DeviceBackend(abc.ABC):
    """One kind of device (CUDA GPU or simulated host device).

    Implementations are thread-safe.
    """

    #: what this backend is (its registry entry in ``backends.kinds``)
    kind: ClassVar[BackendKind]

    @property
    def name(self) -> str:
        """Short name used in reports and ``NEXUS_DEVICE_BACKEND`` (``kind.name``)."""
        return self.kind.name

    @property
    @abc.abstractmethod
    def xp(self) -> Any:
        """The array module (NumPy or CuPy)."""

    @property
    @abc.abstractmethod
    def sparse(self) -> Any:
        """The sparse-matrix module (scipy.sparse or cupyx.scipy.sparse)."""

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def mem_info(self, device_id: int) -> MemoryInfo: ...

    @abc.abstractmethod
    def create_domain(self, device_id: int, *, limit_bytes: int | None = None) -> AllocationDomain:
        """A new allocation domain on ``device_id`` with ``limit_bytes`` (the cache
        cap, None for none). Domains with ``enforces_limit`` refuse allocations past
        it (``MemoryError``); the others leave the cap to the ledger."""

    @abc.abstractmethod
    def device_scope(self, device_id: int) -> AbstractContextManager[Any]:
        """Make ``device_id`` current for this thread's array work inside the
        ``with`` (CUDA: ``cupy.cuda.Device``; host: nothing to do). Raises
        :class:`ConfigError` for a device the backend does not have."""

    @abc.abstractmethod
    def synchronize(self, device_id: int, streams: Iterable[Any] = ()) -> None:
        """Block until work on ``streams`` (or, with none, the whole device) is done.

        Raises whatever the driver raises; callers treat any exception as
        "memory not provably idle".
        """

    def check_device(self, device_id: int) -> None:
        """Raise :class:`ConfigError` unless ``device_id`` names a device of this backend."""
        count = self.device_count()
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            raise ConfigError(f"device_id must be an int, got {device_id!r}")
        if not 0 <= device_id < count:
            raise ConfigError(
                f"device_id {device_id} does not exist on the {self.name} backend; "
                f"accepted: 0..{count - 1}"
            )
