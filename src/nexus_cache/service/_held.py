"""The device results a query service has handed out and not yet had back.

A result of :meth:`~nexus_cache.service.QueryService.execute_on_device` keeps
its attempt's grant and its share of the working domain until it is released.
:class:`HeldResults` books each one under its *settlement* (what gives them
back, exactly once), lets :meth:`~nexus_cache.service.QueryService.shutdown`
wait for them, and marks a device's shutdown record incomplete while one of
its results is still held. Thread-safe; a settlement does nothing in a
process forked from the one that made it (the parent owns the grant and the
memory, and the child's copy of the service, its locks too, is not used).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable

from nexus_cache.device import DeviceShutdown

__all__ = ["HeldResults", "marked"]


class HeldResults:
    """Device results handed out and not yet settled, by device and query id."""

    def __init__(self) -> None:
        self._held: dict[Callable[[], None], tuple[int, str]] = {}
        self._changed = threading.Condition()

    def __len__(self) -> int:
        with self._changed:
            return len(self._held)

    def book(
        self, give_back: Callable[[], None], device_id: int, query_id: str
    ) -> Callable[[], None]:
        """Hold a result of ``query_id`` on ``device_id`` until the returned settlement
        runs: it calls ``give_back`` once (later calls, and calls in a forked child,
        do nothing), then ends the hold."""
        pid = os.getpid()
        lock = threading.Lock()
        pending = [True]

        def settle() -> None:
            if os.getpid() != pid:
                return
            with lock:
                if not pending:
                    return
                pending.clear()
            try:
                give_back()
            finally:
                with self._changed:
                    self._held.pop(settle, None)
                    self._changed.notify_all()

        with self._changed:
            self._held[settle] = (device_id, query_id)
        return settle

    def wait(self, timeout: float) -> list[tuple[int, str]]:
        """Wait up to ``timeout`` seconds for every result to be settled; returns the
        ``(device_id, query_id)`` of those still held."""
        with self._changed:
            self._changed.wait_for(lambda: not self._held, max(0.0, timeout))
            return list(self._held.values())


def marked(shutdown: DeviceShutdown, held: list[tuple[int, str]]) -> DeviceShutdown:
    """``shutdown`` marked incomplete where device results of its device are unreleased."""
    ids = [q for d, q in held if d == shutdown.device_id]
    if not ids:
        return shutdown
    problem = (
        f"{len(ids)} device result(s) still held (queries {', '.join(sorted(ids)[:5])}): "
        "their grant and memory stay booked and the working domain is kept; release them "
        "(result.release()) and call shutdown() again"
    )
    if shutdown.problem is not None:
        problem = f"{shutdown.problem}; {problem}"
    return dataclasses.replace(shutdown, problem=problem)
