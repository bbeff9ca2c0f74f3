"""LRU access stamps written beside the read path, not on it.

A hit that must promote its entry (first read since the write, or last
stamped more than the stamp window ago) puts the ``fstat`` result of what
it read under its path in this process's stamp queue and returns; a
background thread writes the queued stamps about :data:`DELAY_S` later, in
one batch, with the time the batch is written (stamps are ordered to the
stamp window, 1 s, anyway, and the read pays no clock call), in the order
the entries were first queued. The queue holds one stamp per path: a read
of an entry whose stamp is still queued replaces it (as reads inside the
stamp window write nothing), so a hot loop over one entry queues one
stamp, not one per read. A new process
that reads fifty kernels at start-up so pays no metadata write per kernel
while it waits for them, and the LRU order on disk is the same, only
written a moment later.

Guarantees:

* A stamp never lands on another file than the one read: it opens the path
  without following links, checks inode and mtime on that fd and stamps
  through the same fd, with the mtime kept (the mtime may carry the entry's
  integrity check).
* A stamp never moves an atime back: one older than the entry's atime is
  dropped.
* Everything queued is written before eviction or a listing in this
  process reads the LRU order (they call :func:`flush`), and at interpreter
  exit. A forked child starts with an empty queue and its own thread (its
  parent writes what it queued). A process killed by SIGKILL loses at most
  the last :data:`DELAY_S` of stamps: those entries look as old as their
  previous stamp to eviction, which may then remove them a little early (a
  recompile), never serve wrong bytes.

Thread-safe: a dict's ``get``, item assignment and ``popitem`` are each
atomic, so readers take no lock (two racing readers of one path leave one
stamp either way). Fork-safe and shutdown-safe (where no thread can start,
the stamp is written on the reading thread).
"""

from __future__ import annotations

import atexit
import os
import threading
import time

from nexus_cache.program._integrity import READ_FLAGS

__all__ = ["DELAY_S", "QUEUE", "flush", "stamp_now"]

# About the stamp window (1 s): stamps are ordered to a second anyway.
DELAY_S = 1.0
_time_ns = time.time_ns

# By path: the fstat of the version read (its inode and mtime are checked
# again before the stamp lands; nothing else of it is used).
Stamp = os.stat_result


def stamp_now(path: str, ino: int, mtime_ns: int, atime_ns: int) -> int | None:
    """Stamp the entry at ``path`` with ``atime_ns`` if it is still inode ``ino``
    with mtime ``mtime_ns``; its ctime afterwards, or ``None`` when it is gone,
    changed, or already stamped later."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None  # removed or replaced by something we must not open
    try:
        st = os.fstat(fd)
        if st.st_ino != ino or st.st_mtime_ns != mtime_ns or st.st_atime_ns >= atime_ns:
            return None
        os.utime(fd, ns=(atime_ns, mtime_ns))
        return os.fstat(fd).st_ctime_ns
    except OSError:
        return None  # a stamp is bookkeeping: a failed one costs LRU precision only
    finally:
        os.close(fd)


class _Queue:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # The dict is cleared in place, never replaced: readers hold its bound
        # methods (see QUEUE below).
        pending: dict[str, Stamp] | None = getattr(self, "pending", None)
        if pending is None:
            self.pending: dict[str, Stamp] = {}
        else:
            pending.clear()
        self.scheduled = False
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.stop = False
        self.start_lock = threading.Lock()  # one thread, however many readers race here

    def schedule(self) -> None:
        """Have the queued stamps written (call after queueing while ``scheduled`` is false)."""
        if self.stop:
            self.flush()  # queued by an exit hook after ours ran: stamp here
        else:
            self.scheduled = True
            if self.thread is None:
                with self.start_lock:
                    started = self.thread is not None or self._start()
                if not started:
                    self.scheduled = False
                    self.flush()  # no thread at interpreter shutdown: stamp here
                    return
            self.wake.set()

    def _start(self) -> bool:
        thread = threading.Thread(target=self._run, name="nexus-cache-stamps", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            return False
        self.thread = thread
        return True

    def _run(self) -> None:
        wake = self.wake
        while True:
            wake.wait()
            if self.stop:
                return
            # Gather the batch: a start-up burst of reads becomes one pass,
            # written after the burst rather than competing with it.
            time.sleep(DELAY_S)
            wake.clear()
            # Reset before draining: a stamp queued from here on either is
            # drained below or schedules the next pass.
            self.scheduled = False
            self.flush()

    def flush(self) -> None:
        """Write every queued stamp now, on the calling thread."""
        pending = self.pending
        now = _time_ns()
        older = 0
        while True:
            try:
                path, st = pending.popitem()
            except KeyError:
                return
            # popitem takes the latest queued first: each one after it is
            # stamped a nanosecond earlier, so the batch keeps its read order.
            stamp_now(path, st.st_ino, st.st_mtime_ns, now - older)
            older += 1


_queue = _Queue()


# One queue per process; a forked child resets it in place. A reader queues
# a stamp (QUEUE.pending[path] = its fstat result; a later read of the path
# replaces it, so the version stamped is the last one read) and then calls
# QUEUE.schedule() while QUEUE.scheduled is false.
QUEUE = _queue
flush = _queue.flush


def _in_child() -> None:
    _queue.reset()  # the parent's thread does not exist here; its stamps are its own


def _at_exit() -> None:
    # From here on a queued stamp is written at once (schedule() sees stop):
    # the thread dies with the interpreter, whatever it was waiting for.
    _queue.stop = True
    _queue.scheduled = False
    _queue.flush()
    _queue.wake.set()


os.register_at_fork(after_in_child=_in_child)
atexit.register(_at_exit)
