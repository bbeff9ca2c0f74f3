"""Errors that must not keep cached device memory alive."""

from __future__ import annotations

import inspect
from types import TracebackType

__all__ = ["drop_frame_locals"]

# A generator's or coroutine's frame may still be suspended (an exception it caught
# and kept); clearing it would finalize the generator under its owner.
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def drop_frame_locals(error: BaseException) -> None:
    """Clear the local variables of the finished frames that ``error``'s traceback
    holds, and those of the errors it chains (``__cause__``, ``__context__``).

    A traceback keeps every frame the error passed through, and each frame keeps
    its locals: an algorithm's graph, a cache entry's borrowed arrays. Whoever
    keeps the error (a caller that logs it later, Dask's record of a failed task,
    an interactive session's last error) would keep that memory reachable after
    its pin is released, and the cache could then not prove its teardown safe.
    Call this before releasing the pin. Frames still running (the caller's own)
    and generator frames are left alone; the traceback's files, lines and function
    names stay, so the error prints as before.
    """
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        tb: TracebackType | None = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if not frame.f_code.co_flags & _SUSPENDABLE:
                try:
                    frame.clear()
                except RuntimeError:  # still executing: its owner drops its own locals
                    pass
            tb = tb.tb_next
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
