"""Eviction of a FileStream program cache: administrative prune, a store's batch, rescans.

Kept apart from :mod:`nexus_cache.program.filestream._cache` (reads and writes) so
the store path stays readable; the cache owns one :class:`FileStreamEviction`
and shares its counter, candidate list and op counters with it.

Guarantees: thread- and process-safe. Only one thread or process evicts at
a time (``evict.lock`` under the cache root); removals are stat-guarded, so
an entry rewritten after the scan that listed it is never removed, and the
shared byte counter is replaced by a scan's total under the counter's lock
(drift never outlives a scan).
"""

from __future__ import annotations

from pathlib import Path

from nexus_cache._storage import FileLock, sweep_stale_temps
from nexus_cache.program._counters import OpCounters
from nexus_cache.program.filestream import _scan, _stamps
from nexus_cache.program.filestream._evictq import CandidateQueue
from nexus_cache.program.filestream._usage import UsageCounter

__all__ = ["FileStreamEviction"]


class FileStreamEviction:
    """The eviction side of one FileStream cache object (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        entries: str,
        tmp: str,
        *,
        usage: UsageCounter,
        candidates: CandidateQueue,
        counts: OpCounters,
        sidecars: bool,
    ) -> None:
        self._lock_path = str(root / "evict.lock")
        self._entries = entries
        self._tmp = tmp
        self._usage = usage
        self._candidates = candidates
        self._counts = counts
        self._sidecars = sidecars

    def scan_total(self) -> int:
        """Bytes of every entry on disk now (the counter's truth)."""
        return _scan.scan(self._entries).total_bytes

    def evict_to(self, target: int) -> tuple[int, int]:
        """One eviction pass down to ``target`` bytes; ``(entries, bytes)`` removed.

        Scans and removes under the counter's lock, so the count it leaves is
        the truth (capped stores wait for the pass; it is an administrative call).
        """
        lock = FileLock(self._lock_path)
        lock.acquire()
        try:
            sweep_stale_temps(self._tmp)
            with self._usage.hold() as held:
                result = _scan.scan(self._entries)
                done = _scan.evict_oldest(
                    result, target, aside_dir=self._tmp, sidecars=self._sidecars
                )
                counted = held.read() is not None
                held.set(done.remaining_bytes)
            if not counted:
                self._usage.initialise(lambda: done.remaining_bytes)
        finally:
            lock.release()
        self._counts.evicted(done.evicted)
        return done.evicted, done.removed_bytes

    def evict_batch(self, total: int, cap: int, low: int, *, keep: str, extra: int) -> None:
        """A store's share of eviction: back under ``cap``, then a bounded batch toward ``low``.

        ``extra`` bounds how many entries past the cap one store removes;
        ``keep`` (the entry just stored) is never a candidate.
        """
        lock = FileLock(self._lock_path)
        if not lock.acquire(timeout=0):
            return  # another thread or process is evicting; it will get under the cap
        # The candidate list skips entries read since its scan by their atime:
        # this process's queued stamps must be on disk for that.
        _stamps.flush()
        evicted = 0
        try:
            queue = self._candidates
            scanned = False
            while True:
                if total > cap and not len(queue) and not scanned:
                    total = self._rescan(cap, low)
                    scanned = True
                got, _, total = queue.evict_batch(
                    self._usage,
                    total,
                    cap,
                    low,
                    extra=extra,
                    aside_dir=self._tmp,
                    keep=keep,
                    sidecars=self._sidecars,
                )
                evicted += got
                # A stale list can run dry while still over the cap (its
                # entries were read, rewritten or deleted): rescan once.
                if total <= cap or scanned:
                    break
            if self._usage.read() is None:  # removed meanwhile (uncapped store)
                self._usage.initialise(lambda: total)
        finally:
            lock.release()
        self._counts.evicted(evicted)

    def _rescan(self, cap: int, low: int) -> int:
        """Scan, replace the counter with the scan's truth, refill the list; the new total."""
        sweep_stale_temps(self._tmp)
        # Under the counter's lock no capped store or removal is half counted,
        # so the scan's total is the count (drift never outlives a scan).
        with self._usage.hold() as held:
            result = _scan.scan(self._entries)
            total = result.total_bytes
            counted = held.read() is not None
            held.set(total)
        if not counted:
            total = self._usage.initialise(lambda: result.total_bytes)
        # Keep the oldest entries worth twice the cap-to-low-water gap (plus
        # any overshoot): one scan serves about two drains, and the list holds
        # a fraction of the entries in memory, not all of them.
        self._candidates.refill(result, 2 * (cap - low) + max(0, total - cap))
        return total
