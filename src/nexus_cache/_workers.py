"""One small thread pool for host array work that releases the GIL.

NumPy's comparisons, ``nonzero`` and ``take`` release the GIL, so the mask and
gather of a large host query can use more than one core. :func:`run_tasks`
runs a batch of such callables on one process-wide pool (``os.cpu_count()``
threads, at most 8), or inline when asked to (small work, where handing it to
a thread costs more than it saves). Every task of a batch has finished when
it returns, on an exception too, so a caller may release what the tasks read.
Thread-safe; a forked child starts a pool of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["WORKERS", "run_tasks"]

#: threads of the shared pool: the machine's cores, at most 8 (a GPU host's
#: copies into pinned staging keep eight busy; a query's masks want fewer)
WORKERS = max(1, min(os.cpu_count() or 1, 8))

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _shared() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="nexus-array")
        return _pool


def _forget_after_fork() -> None:
    global _lock, _pool
    _lock, _pool = threading.Lock(), None  # the parent's threads do not exist here


os.register_at_fork(after_in_child=_forget_after_fork)


def run_tasks(tasks: Sequence[Callable[[], object]], *, parallel: bool) -> None:
    """Run every task: on the shared pool when ``parallel`` (and there are two or
    more tasks and cores), else one after the other in this thread. Returns once
    all have finished; the first failure (in task order) is raised then."""
    if not parallel or len(tasks) < 2 or WORKERS < 2:
        for task in tasks:
            task()
        return
    pool = _shared()
    futures: list[Future[object]] = []
    try:
        for task in tasks:
            futures.append(pool.submit(task))
        wait(futures)
    except BaseException:  # interrupted: what has not started never will, the rest ends
        for future in futures:
            future.cancel()
        wait(futures)  # nothing a task reads may go before it has finished
        raise
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
