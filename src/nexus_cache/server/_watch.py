"""The watch on running queries' calls: a call whose client cancels or goes away
has its query's cancel event set, within :data:`WATCH_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["WATCH_INTERVAL_S", "CallWatcher"]

#: how often a running query's call is looked at for a client that went away
WATCH_INTERVAL_S = 0.05


class CallWatcher:
    """Sets a call's cancel event when its client cancels or goes away: one thread
    looks at every watched call every :data:`WATCH_INTERVAL_S`.

    One thread for all calls, started with the first and kept for the server's
    life: while no call is watched it sleeps until one is (no look every
    interval, and no thread started by a query that comes after a pause), so a
    query pays two lock acquisitions for its watch, and a wake-up of the
    thread only when it follows a pause. A call's context is only looked at
    under the lock, and :meth:`watching` takes it off under the lock before the
    handler returns: never after gRPC has freed the call. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._calls: dict[object, tuple[Any, threading.Event]] = {}
        self._thread: threading.Thread | None = None
        # the thread sleeps until a call is watched (rather than for an interval)
        self._asleep = False

    @contextlib.contextmanager
    def watching(self, context: Any, cancel: threading.Event) -> Iterator[None]:
        """Watch ``context`` for as long as the block runs."""
        key = object()
        with self._lock:
            self._calls[key] = (context, cancel)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="nexus-cancel-watch", daemon=True
                )
                self._thread.start()
            elif self._asleep:
                self._asleep = False
                self._wake.notify()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[key]

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._calls:
                    self._wake.wait(WATCH_INTERVAL_S)
                else:
                    self._asleep = True
                    while self._asleep:
                        self._wake.wait()
                for context, cancel in self._calls.values():
                    if not cancel.is_set() and context.is_cancelled():
                        cancel.set()
