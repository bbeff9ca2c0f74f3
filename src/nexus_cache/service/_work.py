"""The query service's working domains: one per device, lent to its borrowers.

Attempts allocate what they make (decoded frames, copies of cached frames,
graphs built uncached) in their device's working domain, so nothing lands in
a library's default pool; a device result (``execute_on_device``) keeps its
attempt's share until it is released. Once the last borrower of a device has
left, and none has come for the service's ``idle_release_s`` (default
:data:`IDLE_RELEASE_S`), the domain's free blocks go back to the device (after
an exception too): queries that follow one another reuse the blocks of the
one before (an RMM pool handed back after every query made each allocation
of the next a ``cudaMalloc``, about 45 us each, some 30 a filtered scan; a
pool built again after an idle spell cost the next query milliseconds), and
an idle device gets them back within those seconds. The borrower counts are
kept under the lock the service gives, the one its shutdown holds while it
closes the domains, so a release never touches a domain being closed.
Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from nexus_cache.backends import AllocationDomain, DeviceBackend

__all__ = ["IDLE_RELEASE_S", "WorkDomains"]

_log = logging.getLogger("nexus_cache.service")

#: seconds a working domain keeps its free blocks after its last borrower left, unless
#: the service says otherwise (``ServiceConfig.idle_release_s``)
IDLE_RELEASE_S = 5.0


#: the longest the releaser waits at once (then it looks at its deadlines again)
_LONGEST_WAIT_S = 3600.0


class _Releaser:
    """One daemon thread for every working domain of the process: it runs each
    scheduled release when its time comes. A thread per release (a timer) cost
    a thread start on each query after an idle spell; this one starts once (and
    again in a forked child, where the parent's does not exist)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[tuple[int, int], tuple[float, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None

    def schedule(self, key: tuple[int, int], deadline: float, run: Callable[[], None]) -> None:
        """Run ``run`` at ``deadline`` (``time.monotonic``), in place of any release
        ``key`` had scheduled."""
        with self._cond:
            soonest = min((at for at, _ in self._due.values()), default=None)
            self._due[key] = (deadline, run)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="nexus-work-release", daemon=True
                )
                self._thread.start()
            # Woken only for a deadline before the one it sleeps until: a query's
            # leave moves its release later, and a wake per query would take the
            # GIL from the query's thread for nothing (the thread wakes at the old
            # deadline, finds nothing due, and sleeps until the new one).
            if soonest is None or deadline < soonest:
                self._cond.notify()

    def cancel(self, key: tuple[int, int]) -> None:
        with self._cond:
            self._due.pop(key, None)

    def pending(self, key: tuple[int, int]) -> bool:
        with self._cond:
            return key in self._due

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    ready = [k for k, (at, _) in self._due.items() if at <= now]
                    if ready:
                        break
                    soonest = min((at for at, _ in self._due.values()), default=None)
                    # a wait past _LONGEST_WAIT_S (an idle_release_s of years) is
                    # taken in steps: threading's waits overflow past TIMEOUT_MAX
                    self._cond.wait(
                        None if soonest is None else min(soonest - now, _LONGEST_WAIT_S)
                    )
                runs = [self._due.pop(k)[1] for k in ready]
            for run in runs:  # outside the condition: a release takes its service's lock
                try:
                    run()
                except Exception:  # one failed release must not end the others'
                    _log.exception("giving a working domain's free blocks back failed")

    def after_fork(self) -> None:
        """In a forked child: the parent's thread and pending releases are not ours."""
        self._cond = threading.Condition()
        self._due = {}
        self._thread = None


_RELEASER = _Releaser()
os.register_at_fork(after_in_child=_RELEASER.after_fork)


class WorkDomains:
    """One working domain per device of ``device_ids``, with its borrowers counted;
    each domain's free blocks go back ``idle_release_s`` after its last borrower left."""

    def __init__(
        self,
        backend: DeviceBackend,
        device_ids: Iterable[int],
        lock: threading.Lock,
        idle_release_s: float = IDLE_RELEASE_S,
    ) -> None:
        self._backend = backend
        self._idle_s = idle_release_s
        self._domains = {d: backend.create_domain(d) for d in device_ids}
        self._borrowers = dict.fromkeys(self._domains, 0)
        self._left_at = dict.fromkeys(self._domains, 0.0)  # when the last borrower left
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
        ``idle_release_s`` (by the process's one releaser thread)."""
        with self._lock:
            self._borrowers[device_id] -= 1
            if self._borrowers[device_id] == 0:
                now = time.monotonic()
                self._left_at[device_id] = now
                _RELEASER.schedule(
                    (id(self), device_id), now + self._idle_s, self._releaser(device_id)
                )

    def release_pending(self, device_id: int) -> bool:
        """Whether a release of ``device_id``'s free blocks is scheduled."""
        return _RELEASER.pending((id(self), device_id))

    def _releaser(self, device_id: int) -> Callable[[], None]:
        return lambda: self._release_if_idle(device_id)

    def _release_if_idle(self, device_id: int) -> None:
        with self._lock:
            domain = self._domains[device_id]
            if domain.closed or self._borrowers[device_id]:
                return  # closed by shutdown; or borrowed again: its last leave schedules
            if time.monotonic() < self._left_at[device_id] + self._idle_s:
                return  # left again since: that leave's release is scheduled
            # the releaser thread has no device of its own: the pool goes back from
            # its device, as it would from a query's thread
            with self._backend.device_scope(device_id):
                domain.release_unused()

    def cancel_releases(self) -> None:
        """Forget the pending releases (shutdown, which returns the blocks itself)."""
        for device_id in self._domains:
            _RELEASER.cancel((id(self), device_id))
