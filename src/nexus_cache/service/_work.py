"""The query service's working domains: one per device, lent to its borrowers.

Attempts allocate what they make (decoded frames, copies of cached frames,
graphs built uncached) in their device's working domain, so nothing lands in
a library's default pool; a device result (``execute_on_device``) keeps its
attempt's share until it is released. Once the last borrower of a device has
left, and none has come for :data:`IDLE_RELEASE_S`, the domain's free blocks
go back to the device (after an exception too): queries that follow one
another reuse the blocks of the one before (an RMM pool handed back after
every query made each allocation of the next a ``cudaMalloc``, about 45 us
each, some 30 a filtered scan), and an idle device gets them back within
half a second. The borrower counts are kept under the lock the service
gives, the one its shutdown holds while it closes the domains, so a release
never touches a domain being closed. Thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator

from nexus_cache.backends import AllocationDomain, DeviceBackend

__all__ = ["IDLE_RELEASE_S", "WorkDomains"]

#: seconds a working domain keeps its free blocks after its last borrower left
IDLE_RELEASE_S = 0.5


class WorkDomains:
    """One working domain per device of ``device_ids``, with its borrowers counted."""

    def __init__(
        self, backend: DeviceBackend, device_ids: Iterable[int], lock: threading.Lock
    ) -> None:
        self._backend = backend
        self._domains = {d: backend.create_domain(d) for d in device_ids}
        self._borrowers = dict.fromkeys(self._domains, 0)
        self._left_at = dict.fromkeys(self._domains, 0.0)  # when the last borrower left
        self._timers: dict[int, threading.Timer] = {}  # one pending release a device
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
        """One borrower of ``device_id``'s domain left; after the last one, the free
        blocks go back to the device once the domain has had no borrower for
        :data:`IDLE_RELEASE_S` (a timer thread, one at a time per device)."""
        with self._lock:
            self._borrowers[device_id] -= 1
            if self._borrowers[device_id] == 0:
                self._left_at[device_id] = time.monotonic()
                pending = self._timers.get(device_id)
                # a pending timer's thread lives until it has taken the lock (or been
                # cancelled, which forgets it); one that does not is a parent's, copied
                # by fork into a child where its thread never ran: that would never fire
                if pending is None or not pending.is_alive():
                    self._schedule(device_id, IDLE_RELEASE_S)

    def _schedule(self, device_id: int, delay: float) -> None:
        """A release of ``device_id``'s free blocks in ``delay`` seconds (lock held)."""
        timer = threading.Timer(delay, self._release_if_idle, (device_id,))
        timer.daemon = True
        self._timers[device_id] = timer
        timer.start()

    def _release_if_idle(self, device_id: int) -> None:
        with self._lock:
            self._timers.pop(device_id, None)
            domain = self._domains[device_id]
            if domain.closed or self._borrowers[device_id]:
                return  # closed by shutdown; or borrowed again: its last leave schedules
            wait = self._left_at[device_id] + IDLE_RELEASE_S - time.monotonic()
            if wait > 0:  # borrowed and left again since this was scheduled
                self._schedule(device_id, wait)
                return
            # the timer's thread has no device of its own: the pool goes back from
            # its device, as it would from a query's thread
            with self._backend.device_scope(device_id):
                domain.release_unused()

    def cancel_releases(self) -> None:
        """Stop the pending releases (shutdown, which returns the blocks itself; lock held)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
