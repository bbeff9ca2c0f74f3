"""Bounded-work eviction for a capped file-stream cache.

One scan of ``entries/`` yields a list of the least recently read entries
(oldest first). Instead of draining the store to its low-water mark in the
store that crossed the cap (O(entries) unlinks in one call), every store
above the low-water mark pops a bounded batch off that list: enough to get
back under the cap, plus at most ``extra`` more. The list is rebuilt by a
fresh scan only when a store is over the cap and the list is empty, so the
scan is amortised over many stores as before.

A list outlives the scan that made it, so each candidate is re-checked
before it goes: an entry read since the scan (its atime moved) is skipped,
because it is no longer among the least recently read; one rewritten since
is left alone by the stat guard (``CHANGED``); one another process removed
(``GONE``) is credited by re-reading the shared counter, which the deleter
has already decremented. Entries written after the scan are not on the list,
and they are newer than everything on it, so LRU order is kept.
"""

from __future__ import annotations

import os
from collections import deque

from nexus_cache._storage import UnlinkResult
from nexus_cache.program.filestream import _scan
from nexus_cache.program.filestream._usage import UsageCounter

__all__ = ["CandidateQueue"]

# A list always holds at least this many candidates (when there are that
# many), so a small cache keeps its whole scan, as a full pass would, and a
# batch rarely runs dry because a few candidates were read or rewritten.
_MIN_KEEP = 1024


class CandidateQueue:
    """Oldest-first eviction candidates from the last scan; guarded by the evict lock."""

    def __init__(self) -> None:
        self._queue: deque[_scan.ScanEntry] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def refill(self, result: _scan.ScanResult, keep_bytes: int) -> None:
        """Replace the list with ``result``'s oldest entries: ``keep_bytes`` of them, or
        ``_MIN_KEEP`` entries if that is more."""
        queue: deque[_scan.ScanEntry] = deque()
        held = 0
        for entry in sorted(result.entries, key=lambda e: e.atime_ns):
            if held >= keep_bytes and len(queue) >= _MIN_KEEP:
                break
            queue.append(entry)
            held += entry.key.size
        self._queue = queue

    def evict_batch(
        self,
        usage: UsageCounter,
        total: int,
        cap: int,
        low: int,
        *,
        extra: int,
        aside_dir: str,
        keep: str | None,
        sidecars: bool,
    ) -> tuple[int, int, int]:
        """Evict until ``total <= cap``, then up to ``extra`` more while above ``low``.

        ``total`` is the shared counter's value; each removal updates the
        counter and takes its new value (so other processes' deltas count).
        Returns ``(entries evicted, bytes removed, total after)``.
        """
        evicted = removed = extra_done = 0
        queue = self._queue
        while queue and total > low:
            if total <= cap:
                if extra_done >= extra:
                    break
                extra_done += 1
            entry = queue.popleft()
            if entry.path == keep:
                continue  # the entry just stored (its old version): never chosen
            try:
                atime = os.lstat(entry.path).st_atime_ns
            except FileNotFoundError:
                atime = entry.atime_ns  # let the guard report GONE below
            if atime != entry.atime_ns:
                continue  # read since the scan: no longer among the oldest
            # Under the counter's lock, like every capped store and removal, so
            # the count stays exact. Looked up through the module so tests can
            # interpose on the guard.
            with usage.hold() as held:
                outcome = _scan.unlink_if_unchanged(entry.path, entry.key, aside_dir=aside_dir)
                if outcome is UnlinkResult.CHANGED:
                    continue
                # GONE: the deleter subtracted its bytes itself; re-read rather
                # than subtract again, which would stop this batch too early.
                gone = outcome is not UnlinkResult.REMOVED
                now = held.read() if gone else held.add(-entry.key.size)
            if outcome is UnlinkResult.REMOVED:
                evicted += 1
                removed += entry.key.size
                if sidecars:
                    _scan.remove_sidecar(entry.path)
            total = now if now is not None else total - entry.key.size
        return evicted, removed, total
