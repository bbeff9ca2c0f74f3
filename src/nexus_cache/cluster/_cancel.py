"""A query's cancel event across the cluster: a ``distributed.Event`` by name.

The client sets the cluster-wide event when its caller's ``threading.Event``
is set (or the caller is interrupted); on the worker, :func:`worker_cancel`
gives the query a local ``threading.Event`` that a watcher thread sets once
the cluster-wide one is set, since the service looks at a local event only.

A query cancelled on its worker is an outcome, not a task failure: the task
returns a :class:`CancelledOnWorker` (the client raises
``QueryCancelledError`` from it), so Dask logs no ``Compute Failed``
traceback for a cancel the caller asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["CANCEL_POLL_S", "CancelledOnWorker", "cancel_name", "worker_cancel"]

_log = logging.getLogger("nexus_cache.cluster")

#: how often a worker looks at a running query's cluster-wide cancel event
CANCEL_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class CancelledOnWorker:
    """What a query task returns when its worker cancelled the query: the
    ``QueryCancelledError`` message, for the client to raise again."""

    message: str


def cancel_name(task_key: str) -> str:
    """The cluster-wide cancel event's name for the task ``task_key``."""
    return f"{task_key}-cancel"


@contextlib.contextmanager
def worker_cancel(name: str) -> Iterator[threading.Event]:
    """A local event set within :data:`CANCEL_POLL_S` of the cluster-wide event
    ``name`` being set, for as long as the block runs (inside a task).

    The watcher ends with the block. When the scheduler cannot be asked (it is
    gone), the query runs on uncancelled rather than failing. Thread-safe.
    """
    from distributed import Event, get_client

    # the worker's client, resolved here in the task's thread: the watcher's
    # own thread is no task, so Dask would not find the worker from there
    shared: Any = Event(name, client=get_client())
    local = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(CANCEL_POLL_S):
            try:
                if shared.is_set():
                    local.set()
                    return
            except Exception as exc:  # the scheduler went away: nobody can cancel now
                _log.warning("cancel event %s cannot be read (%s); the query runs on", name, exc)
                return

    watcher = threading.Thread(target=watch, name="nexus-cluster-cancel", daemon=True)
    watcher.start()
    try:
        yield local
    finally:
        done.set()
        watcher.join()
