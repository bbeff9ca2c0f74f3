"""The allocation-domain owner of one device: ``DeviceCacheAllocationFactory``."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING

from nexus_cache.errors import LifecycleError

if TYPE_CHECKING:
    from nexus_cache.backends import AllocationDomain, DeviceBackend, DomainCounters
    from nexus_cache.device.ledger import DeviceLedger
    from nexus_cache.device.residency import ResidentEntry

__all__ = ["DeviceCacheAllocationFactory"]


class DeviceCacheAllocationFactory:
    """Owns the one cache allocation domain of a device; its subdomains share it.

    Every cache entry it produces is charged to the device ledger before any
    byte is allocated for it. Thread-safe.
    """

    def __init__(
        self, backend: DeviceBackend, device_id: int, *, limit_bytes: int | None = None
    ) -> None:
        """``limit_bytes`` (the device's ``cache_cap_bytes``) bounds the domain's live
        allocations physically as well: a backstop behind the ledger's charges."""
        self._backend = backend
        self._device_id = device_id
        self._domain: AllocationDomain = backend.create_domain(device_id, limit_bytes=limit_bytes)
        self._lock = threading.Lock()
        self._released = False

    def __repr__(self) -> str:
        state = "released" if self._released else "open"
        name = self._backend.name
        return f"DeviceCacheAllocationFactory({name}, device={self._device_id}, {state})"

    @property
    def backend(self) -> DeviceBackend:
        return self._backend

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def released(self) -> bool:
        return self._released

    @property
    def domain(self) -> AllocationDomain:
        if self._released:
            raise LifecycleError(f"the allocation domain of device {self._device_id} was released")
        return self._domain

    def reserve(
        self, ledger: DeviceLedger, key: Hashable, nbytes: int, *, evict: bool
    ) -> ResidentEntry:
        """Precharge ``ledger`` and return an AttemptOwned entry bound to this domain."""
        return ledger.reserve(
            nbytes, key=key, domain=self.domain, backend=self._backend, evict=evict
        )

    def counters(self) -> DomainCounters:
        return self._domain.counters()

    def release(self) -> None:
        """Release the domain owner. Idempotent; refuses while allocations live."""
        with self._lock:
            if self._released:
                return
            self._domain.close()
            self._released = True
