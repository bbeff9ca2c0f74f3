"""Durability of published entries, made off the read path.

An ``fsync`` of a freshly written 32 MiB entry costs tens of milliseconds, more
than the rest of a fill together. A fill therefore publishes its entry as soon
as the bytes are complete and validated, and a worker thread makes it durable
afterwards. The entry's owner-execute bit says which state it is in (it never
grants anything: entries are data, and it leaves the file writable for its
owner):

* ``0700``: published, maybe not on disk yet. Within the boot that published
  it, every process reads the same page cache, so the bytes are whole.
* ``0600``: durable. The worker sets it only after fsyncing the record and the
  data, so a power cut can never leave a ``0600`` entry torn.

After a power cut, an entry still ``0700`` whose bytes were written (its
mtime) before the current boot may be torn (on ext4 and XFS a torn new file is
short, which the size check already catches; other filesystems give weaker
promises). The mtime, not the inode change time: a ``chown -R`` by an
administrator, or the sweep of a temp still hard-linked to the entry after the
crash, changes the inode but not the bytes, and must not make them trusted.
:func:`needs_refill` flags it, and the store reports it as ``NOT_DURABLE``: it
is removed and filled again, never read.

The boot time comes from ``CLOCK_BOOTTIME``. Where it is missing (not Linux),
fills fsync before publishing, as every fill did before.

Thread-safe. The worker is a daemon thread started on demand; at interpreter
exit the lakehouse's exit hook gives it the fill exit wait to finish. An entry
whose fsync was cut off stays ``0700``: correct for the rest of the boot, and
filled again after the next one. Where no thread can start (interpreter
shutdown), the publishing thread syncs the entry itself.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable

__all__ = [
    "DURABLE_MODE",
    "PENDING_MODE",
    "can_defer",
    "make_durable_later",
    "needs_refill",
    "pending_syncs",
    "wait_for_syncs",
]

logger = logging.getLogger("nexus_cache.lakehouse")

DURABLE_MODE = 0o600
PENDING_MODE = 0o700
#: queued syncs beyond this are done by the publishing thread itself, so that a
#: burst of fills cannot hold an unbounded number of descriptors open
_MAX_QUEUED = 64


def _boot_time_ns() -> int | None:
    """Wall-clock time of this boot, or ``None`` where the clock is missing."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return None
    return time.time_ns() - time.clock_gettime_ns(boottime)


_BOOT_NS = _boot_time_ns()


def can_defer() -> bool:
    """Whether fills may publish before fsyncing (the boot time is known)."""
    return _BOOT_NS is not None


def needs_refill(st: os.stat_result) -> bool:
    """Whether the entry with ``st`` (an ``lstat``) was published but never made durable
    before the current boot, so its bytes may not be the ones published."""
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXUSR:
        return False  # a link or a directory there is refused by the read, not refilled
    # Without a boot time nothing is deferred, so a 0700 entry is not ours to trust.
    return _BOOT_NS is None or st.st_mtime_ns < _BOOT_NS


#: what to do with an entry whose fsync failed (the filler removes it)
Discard = Callable[[OSError], None]
_Job = tuple[int, str, Discard]
_fsync = os.fsync  # a seam: tests make it fail as a dying disk does


class _Syncer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._busy = 0
        self._worker: threading.Thread | None = None

    def submit(self, fd: int, record: str, discard: Discard) -> None:
        with self._cond:
            if len(self._jobs) < _MAX_QUEUED and self._has_worker_locked():
                self._jobs.append((fd, record, discard))
                self._busy += 1
                self._cond.notify()
                return
        _sync(fd, record, discard)

    def _has_worker_locked(self) -> bool:
        """Start the worker if needed; ``False`` when no thread can start."""
        if self._worker is None:
            worker = threading.Thread(target=self._run, name="nexus-lakehouse-sync", daemon=True)
            try:
                worker.start()
            except RuntimeError:
                # Interpreter shutdown (Python 3.12+ refuses new threads once it
                # begins, which is when one-shot scripts publish their fills):
                # the publishing thread syncs itself rather than queue a job no
                # worker would ever take, which would hold the exit for the
                # whole NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S.
                return False
            self._worker = worker
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                fd, record, discard = self._jobs.popleft()
            try:
                _sync(fd, record, discard)
            except Exception:  # never let the worker die: its queue would hang waiters
                logger.exception("lakehouse: making a published entry durable failed")
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return self._busy

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout)


def _sync(fd: int, record: str, discard: Discard) -> None:
    """fsync the record, then the data, then mark the data durable; closes ``fd``.

    A failed fsync discards the entry: after a write-back error Linux may drop
    the dirty pages or keep them marked clean, so later reads of the file
    could return bytes that are neither the fill's nor whole.
    """
    try:
        try:
            rfd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return  # removed meanwhile (retention, clear): nothing left to keep
        try:
            try:
                _fsync(rfd)
            finally:
                os.close(rfd)
            _fsync(fd)
        except OSError as exc:
            logger.warning("lakehouse: fsync of a published entry failed (%s); removing it", exc)
            discard(exc)
            return
        os.fchmod(fd, DURABLE_MODE)
    except OSError:
        # The bytes are on disk but the mark is not: the entry stays 0700, read in
        # this boot and filled again after the next one.
        logger.warning("lakehouse: could not mark a published entry durable", exc_info=True)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


_syncer = _Syncer()


def _after_fork_in_child() -> None:
    # The worker thread does not survive a fork: a child waiting on the inherited
    # queue would wait forever. The parent syncs what it queued; the child starts
    # empty and closes its copies of those descriptors.
    global _syncer
    for fd, _, _ in _syncer._jobs:
        with contextlib.suppress(OSError):
            os.close(fd)
    _syncer = _Syncer()


os.register_at_fork(after_in_child=_after_fork_in_child)


def make_durable_later(fd: int, record: str, discard: Discard) -> None:
    """Queue the fsync of a just-published entry (``fd`` on its data; closed when done).

    ``discard(error)`` is called, on the worker thread, when an fsync fails.
    """
    _syncer.submit(fd, record, discard)


def pending_syncs() -> int:
    """Entries published by this process and not yet made durable."""
    return _syncer.pending()


def wait_for_syncs(timeout: float | None = None) -> bool:
    """Wait until every queued entry is durable; ``False`` on timeout."""
    return _syncer.wait(timeout)
