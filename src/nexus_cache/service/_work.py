"""The query service's working domains: one per device, lent to its borrowers.

Attempts allocate what they make (decoded frames, copies of cached frames,
graphs built uncached) in their device's working domain, so nothing lands in
a library's default pool; a device result (``execute_on_device``) keeps its
attempt's share until it is released. When the last borrower of a device
leaves, the domain's free blocks go back to the device (on every exception
too). The borrower counts are kept under the lock the service gives, the one
its shutdown holds while it closes the domains, so a leaving borrower never
returns blocks of a domain being closed. Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

from nexus_cache.backends import AllocationDomain, DeviceBackend

__all__ = ["WorkDomains"]


class WorkDomains:
    """One working domain per device of ``device_ids``, with its borrowers counted."""

    def __init__(
        self, backend: DeviceBackend, device_ids: Iterable[int], lock: threading.Lock
    ) -> None:
        self._domains = {d: backend.create_domain(d) for d in device_ids}
        self._borrowers = dict.fromkeys(self._domains, 0)
        self._lock = lock

    def __getitem__(self, device_id: int) -> AllocationDomain:
        return self._domains[device_id]

    def items(self) -> Iterable[tuple[int, AllocationDomain]]:
        return self._domains.items()

    def borrowers(self, device_id: int) -> int:
        """How many borrowers ``device_id``'s domain has now."""
        with self._lock:
            return self._borrowers[device_id]

    @contextlib.contextmanager
    def borrow(self, device_id: int) -> Iterator[AllocationDomain]:
        """Lend ``device_id``'s domain for the block; the borrower leaves at its end."""
        self.stay(device_id)
        try:
            yield self._domains[device_id]
        finally:
            self.leave(device_id)

    def stay(self, device_id: int) -> None:
        """One more borrower of ``device_id``'s domain (an attempt, or the device result
        it hands out), until its :meth:`leave`."""
        with self._lock:
            self._borrowers[device_id] += 1

    def leave(self, device_id: int) -> None:
        """One borrower of ``device_id``'s domain left; the last one returns its free
        blocks to the device."""
        with self._lock:
            self._borrowers[device_id] -= 1
            if self._borrowers[device_id] == 0:
                self._domains[device_id].release_unused()
