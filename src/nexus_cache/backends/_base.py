"""The interface every device backend implements (``cuda`` and ``host``).

A backend gives the cache layer four things and nothing more: the array
module ``xp``, device memory information, allocation domains, and stream
synchronization. Cache logic is written once against this interface, so the
host backend runs in CI exactly the code paths the GPU runs.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

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

    def _add(self, nbytes: int) -> None:
        self.allocated_bytes += nbytes
        self.allocations += 1


class _ScopeStack(threading.local):
    """Per-thread stack of open scopes of one domain."""

    def __init__(self) -> None:
        self.scopes: list[AllocationScope] = []


class AllocationDomain(abc.ABC):
    """Where cache bytes of one device are allocated and measured.

    Thread-safe: allocations may come from any thread; a scope counts only the
    allocations of the thread that opened it.
    """

    def __init__(self, device_id: int) -> None:
        self._device_id = device_id
        self._scope_stack = _ScopeStack()

    @property
    def device_id(self) -> int:
        return self._device_id

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

    @abc.abstractmethod
    def root_of(self, array: Any) -> Any:
        """The array that owns ``array``'s allocation (itself unless a view)."""

    @abc.abstractmethod
    def allocation_bytes(self, array: Any) -> int:
        """Rounded bytes of the allocation behind ``array``; raises if not ours."""

    @abc.abstractmethod
    def counters(self) -> DomainCounters:
        """A consistent snapshot of physical usage and activity."""

    @abc.abstractmethod
    def release_unused(self) -> int:
        """Give freed blocks back to the device; returns how many bytes."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the domain; refuses (LifecycleError) while allocations live."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

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

    def _active_scopes(self) -> list[AllocationScope]:
        return self._scope_stack.scopes

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

    #: short name used in reports and NEXUS_DEVICE_BACKEND
    name: str = ""

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
    def create_domain(self, device_id: int) -> AllocationDomain: ...

    @abc.abstractmethod
    def synchronize(self, device_id: int, streams: Iterable[Any] = ()) -> None:
        """Block until work on ``streams`` (or, with none, the whole device) is done.

        Raises whatever the driver raises; callers treat any exception as
        "memory not provably idle".
        """

    def check_device(self, device_id: int) -> None:
        from nexus_cache.errors import ConfigError

        count = self.device_count()
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            raise ConfigError(f"device_id must be an int, got {device_id!r}")
        if not 0 <= device_id < count:
            raise ConfigError(
                f"device_id {device_id} does not exist on the {self.name} backend; "
                f"accepted: 0..{count - 1}"
            )
