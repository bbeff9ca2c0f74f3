"""Cooperative stop points in long graph algorithms.

A caller that may want an algorithm to stop early (a query whose client went
away) runs it inside :func:`stop_check`: the iterative algorithms call
:func:`checkpoint` once per iteration, which calls the caller's ``check``;
``check`` raises to stop the algorithm there. The library knows nothing of who
asks or why: ``check`` is a plain callable.

The check travels in a context variable rather than as an algorithm
parameter: parameters are validated per algorithm and name cached results,
and a stop request is neither. It is per thread (and per asyncio task), so an
algorithm running elsewhere at the same time is not affected.

Thread-safe.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

__all__ = ["checkpoint", "stop_check"]

_CHECK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "nexus_cache_graph_stop_check", default=None
)


@contextlib.contextmanager
def stop_check(check: Callable[[], None]) -> Iterator[None]:
    """Call ``check()`` at every :func:`checkpoint` of the algorithms run inside."""
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)


def checkpoint() -> None:
    """A point where an iterative algorithm may be stopped: calls the current
    ``check`` (whatever it raises propagates); nothing outside :func:`stop_check`."""
    check = _CHECK.get()
    if check is not None:
        check()
