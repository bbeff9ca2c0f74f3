"""Service-wide fill budget: concurrent fills and in-flight host bytes.

Blocking (``fill_before_read``) and background (``read_through``) fills of one
service draw on the same :class:`FillLimits`. A fill is charged its object's size
for its whole duration, until the entry is published: those bytes sit in host
memory (buffers, then dirty page cache until the fsync worker of :mod:`..store._durable`
writes them back, which the kernel's writeback limits bound). An object larger
than the whole byte budget is charged the whole budget, so it can still run,
alone.

The budget never queues: :meth:`FillLimits.try_acquire` answers at once (background
fills that find no room are skipped by the caller), and :meth:`FillLimits.acquire`
waits at most ``timeout`` seconds (blocking fills then read remotely).
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from nexus_cache.errors import ConfigError

__all__ = ["FillLease", "FillLimits"]


class FillLease:
    """A granted share of the budget; release it exactly once (idempotent)."""

    __slots__ = ("_generation", "_limits", "_released", "charge")

    def __init__(self, limits: FillLimits, charge: int, generation: int) -> None:
        self._limits = limits
        self.charge = charge
        self._generation = generation
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits._release(self.charge, self._generation)

    def __enter__(self) -> FillLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class FillLimits:
    """Budget of concurrent fills and host bytes, shared by all fills of a service.

    Thread-safe; per process (the service). Processes coordinate on entries
    through per-entry file locks, not through this budget. A forked child
    starts with the whole budget: the fills charged to it are the parent's.

    Parameters
    ----------
    max_concurrency : int
        Fills running at once, >= 1.
    max_host_bytes : int
        Host bytes all running fills may hold, >= 1 (a fill is charged its
        object's size, at most this).

    Raises
    ------
    ConfigError
        A bound is below 1.

    Examples
    --------
    >>> from nexus_cache.lakehouse import FillLimits
    >>> limits = FillLimits(max_concurrency=1, max_host_bytes=1 << 20)
    >>> with limits.try_acquire(4096):
    ...     limits.in_flight(), limits.try_acquire(10) is None
    ((1, 4096), True)
    >>> limits.in_flight()
    (0, 0)
    """

    def __init__(self, max_concurrency: int, max_host_bytes: int) -> None:
        if max_concurrency < 1:
            raise ConfigError(
                f"FillLimits max_concurrency={max_concurrency!r} is not accepted; "
                "use a whole number >= 1 (NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY)"
            )
        if max_host_bytes < 1:
            raise ConfigError(
                f"FillLimits max_host_bytes={max_host_bytes!r} is not accepted; "
                "use a byte count >= 1 (NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES)"
            )
        self.max_concurrency = max_concurrency
        self.max_host_bytes = max_host_bytes
        self._cond = threading.Condition()
        self._fills = 0
        self._bytes = 0
        self._generation = 0  # bumped in a forked child: older leases are the parent's
        _every.add(self)

    def _charge(self, nbytes: int) -> int:
        return max(0, min(int(nbytes), self.max_host_bytes))

    def _fits(self, charge: int) -> bool:
        return self._fills < self.max_concurrency and self._bytes + charge <= self.max_host_bytes

    def try_acquire(self, nbytes: int) -> FillLease | None:
        """A lease now, or ``None`` when the budget is full. Never waits."""
        return self.acquire(nbytes, timeout=0.0)

    def acquire(self, nbytes: int, timeout: float) -> FillLease | None:
        """Wait up to ``timeout`` seconds for room for ``nbytes``; ``None`` on timeout."""
        charge = self._charge(nbytes)
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not self._fits(charge):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            self._fills += 1
            self._bytes += charge
            return FillLease(self, charge, self._generation)

    def _release(self, charge: int, generation: int) -> None:
        with self._cond:
            if generation != self._generation:
                return  # charged before a fork, to the parent's budget
            self._fills -= 1
            self._bytes -= charge
            self._cond.notify_all()

    def _after_fork_in_child(self) -> None:
        # The threads running the charged fills stayed in the parent: without
        # this, a child would wait for (or skip fills for want of) a budget
        # that nothing in it will ever release. Its lock may have been held.
        self._cond = threading.Condition()
        self._fills = self._bytes = 0
        self._generation += 1

    def in_flight(self) -> tuple[int, int]:
        """(fills, host bytes) currently charged."""
        with self._cond:
            return self._fills, self._bytes


_every: weakref.WeakSet[FillLimits] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for limits in list(_every):
        limits._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
