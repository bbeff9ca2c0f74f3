"""Background fills: the small thread pool behind ``read_through``.

A remote read that should warm the cache hands its planned identity to
:meth:`BackgroundFills.schedule` when the read closes. Scheduling never waits: a
fill starts only when the service-wide budget grants a lease at once and no fill
of the same entry is queued or running in this cache; otherwise the skip is an
event (``fill_skipped`` with reason ``no_budget``, ``in_progress`` or
``shutdown``). Never more jobs are queued than leases granted, so never more
than ``max_concurrency`` worker threads exist; they start on demand.

**Interpreter exit.** Scripts and batch jobs exit right after their last read,
which is when ``read_through`` queues its fills. An ``atexit`` hook therefore
waits, at most ``exit_wait_s`` seconds (``NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S``,
default 30), for the queued and running fills of every live pool to publish.
The workers stay daemon threads, so a fill still running when the wait ends is
cut off: it leaves only a temp, which the next open of the root sweeps, and
the hook logs a warning naming how many fills were abandoned.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from typing import Any

from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog
from nexus_cache.lakehouse._vocabulary import FillMode
from nexus_cache.lakehouse.fill._fill import Filler
from nexus_cache.lakehouse.fill._limits import FillLease, FillLimits
from nexus_cache.lakehouse.identity._identity import SourceIdentity
from nexus_cache.lakehouse.store._durable import pending_syncs, wait_for_syncs

__all__ = ["BackgroundFills", "finish_at_exit"]

_Job = tuple[Any, str, SourceIdentity, FillLease]

logger = logging.getLogger("nexus_cache.lakehouse")

#: every pool that may still have work at exit (weak: a collected cache has none)
_live: weakref.WeakSet[BackgroundFills] = weakref.WeakSet()
_live_lock = threading.Lock()
#: the longest ``exit_wait_s`` of any pool created in this process: the fsyncs
#: of entries it published get it at exit even once its cache was collected
_longest_exit_wait_s = 0.0


def finish_at_exit() -> None:
    """Give each live pool up to its own ``exit_wait_s`` to finish, all at once,
    then the published entries' fsyncs the rest of the longest wait.

    Called once at interpreter exit (registered by :mod:`.._cache`, so that it
    runs before the read summaries are written).
    """
    with _live_lock:
        pools = [p for p in _live if p.pending()]
    start = time.monotonic()
    for pool in sorted(pools, key=lambda p: p.exit_wait_s):
        remaining = pool.exit_wait_s - (time.monotonic() - start)
        if not pool.wait(max(0.0, remaining)) and (left := pool.pending()):
            logger.warning(
                "lakehouse: %d background fill(s) still running after waiting %.1f s at exit "
                "(NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S); they leave only temps",
                left,
                pool.exit_wait_s,
            )
    # Then the fsyncs of what was published (this process's fills, blocking ones
    # included). One cut off leaves a 0700 entry: read in this boot, refilled after.
    budget = _longest_exit_wait_s
    if pending_syncs() and not wait_for_syncs(max(0.0, budget - (time.monotonic() - start))):
        logger.info(
            "lakehouse: %d published entr(ies) not yet fsynced at exit; they are filled "
            "again after a reboot",
            pending_syncs(),
        )


class BackgroundFills:
    """Background fill workers of one cache. Thread-safe."""

    def __init__(
        self, filler: Filler, limits: FillLimits, events: EventLog, *, exit_wait_s: float = 30.0
    ) -> None:
        self.exit_wait_s = exit_wait_s
        self._filler = filler
        self._limits = limits
        self._events = events
        self._lock = threading.Condition()
        self._inflight: set[str] = set()
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = False
        global _longest_exit_wait_s
        with _live_lock:
            _live.add(self)
            _longest_exit_wait_s = max(_longest_exit_wait_s, exit_wait_s)

    def schedule(self, fs: Any, path: str, identity: SourceIdentity) -> None:
        """Queue a fill of ``identity`` now, or report why not (never waits)."""
        reason = None
        with self._lock:
            if self._closed:
                reason = "shutdown"
            elif identity.key in self._inflight:
                reason = "in_progress"
            else:
                lease = self._limits.try_acquire(identity.content.size)
                if lease is None:
                    reason = "no_budget"
                elif not self._start_worker_locked(len(self._inflight) + 1):
                    lease.release()
                    reason = "shutdown"
                else:
                    self._inflight.add(identity.key)
                    self._queue.put((fs, path, identity, lease))
        if reason is not None:
            self._events.emit(
                CacheEvent(
                    EventKind.FILL_SKIPPED,
                    identity.key,
                    identity.location,
                    FillMode.BACKGROUND,
                    reason=reason,
                )
            )

    def _start_worker_locked(self, busy: int) -> bool:
        """Start a worker if fewer than ``busy`` (capped) run; ``False`` when no
        worker runs and none can start, so a job queued now would never run."""
        # Daemon threads, so that a stuck remote store cannot hang interpreter exit.
        if len(self._workers) < min(busy, self._limits.max_concurrency):
            worker = threading.Thread(
                target=self._worker, name="nexus-lakehouse-fill", daemon=True
            )
            try:
                worker.start()
            except RuntimeError:
                # Interpreter shutdown (Python 3.12+ refuses new threads then,
                # e.g. a read in an atexit handler): the workers already
                # running take the job, if there are any.
                return bool(self._workers)
            self._workers.append(worker)
        return True

    def _worker(self) -> None:
        while (job := self._queue.get()) is not None:
            fs, path, identity, lease = job
            try:
                self._filler.background(fs, path, identity, lease)
            except Exception as exc:  # already reported as an event where it mattered
                self._events.emit(
                    CacheEvent(
                        EventKind.FILL_FAILED,
                        identity.key,
                        identity.location,
                        FillMode.BACKGROUND,
                        reason="error",
                        error=f"{type(exc).__name__}: {exc}",
                    )
                )
            finally:
                lease.release()
                with self._lock:
                    self._inflight.discard(identity.key)
                    self._lock.notify_all()

    def pending(self) -> int:
        """Fills queued or running now."""
        with self._lock:
            return len(self._inflight)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no fill is queued or running; ``False`` on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._inflight, timeout)

    def close(self) -> None:
        """Stop accepting fills; queued ones still run, then the workers exit."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, []
        for _ in workers:
            self._queue.put(None)

    def _after_fork_in_child(self) -> None:
        # The workers and the fills they ran or had queued stayed in the parent
        # (their leases are the parent's too, see FillLimits): a child that kept
        # them would wait for them forever (wait_for_fills, its exit wait) and
        # count dead threads as workers. Its lock may have been held.
        self._lock = threading.Condition()
        self._inflight = set()
        self._queue = queue.SimpleQueue()
        self._workers = []


def _reset_after_fork() -> None:
    global _live_lock
    _live_lock = threading.Lock()
    for pool in list(_live):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
