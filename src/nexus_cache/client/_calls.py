"""Flight calls that a Ctrl-C interrupts at once: :func:`interruptible`.

pyarrow's Flight calls block in C++ until the server answers: ``do_get``
returns only once the query has executed (its first message is the result's
schema). Run there, a Ctrl-C waits for the whole query. Here the call runs in
a daemon thread and the calling thread waits on an event, which a signal
interrupts: ``KeyboardInterrupt`` (or any exception) is raised at once, and
the call is abandoned. A stream that has begun is cancelled (the server stops
sending and drops the result); one that has not is cancelled the moment its
first message arrives, since pyarrow offers no way to cancel a call before
then. ``on_abandon`` runs as the call is abandoned: the client asks the server
there to cancel the query (its ``cancel`` action), so a process that goes on
after the interrupt does not leave it running. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Cancellable", "interruptible"]

_T = TypeVar("_T")

# how often the waiting thread wakes (a signal interrupts the wait anyway)
_WAKE_S = 0.25


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Call(Generic[_T]):
    """One call in its own thread; ``watch(reader)`` names what ``abandon`` cancels."""

    def __init__(
        self,
        work: Callable[[Callable[[Cancellable], None]], _T],
        on_abandon: Callable[[], None] | None,
    ) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stream: Cancellable | None = None
        self._abandoned = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._work = work
        self._on_abandon = on_abandon

    def run(self) -> None:
        try:
            self._value = self._work(self.watch)
        except BaseException as exc:  # handed to the waiting thread
            self._error = exc
        finally:
            self._done.set()

    def watch(self, stream: Cancellable) -> None:
        with self._lock:
            self._stream = stream
            abandoned = self._abandoned
        if abandoned:
            stream.cancel()  # the caller left while the server still executed

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def result(self) -> _T:
        try:
            while not self._done.wait(_WAKE_S):
                pass
        except BaseException:
            self.abandon()
            if self._on_abandon is not None:
                self._on_abandon()
            raise
        error, self._error = self._error, None
        if error is not None:
            try:
                raise error
            finally:
                del error
        value: _T = self._value
        return value


def interruptible(
    work: Callable[[Callable[[Cancellable], None]], _T],
    on_abandon: Callable[[], None] | None = None,
) -> _T:
    """``work(watch)`` run in a daemon thread; its value, or its exception re-raised.

    ``work`` calls ``watch(reader)`` with the stream it opened, so that an
    interrupted caller cancels it. An exception raised in the caller's
    thread while it waits (``KeyboardInterrupt`` from Ctrl-C) abandons the
    call, runs ``on_abandon()`` (which must not raise) and propagates.
    """
    call = _Call(work, on_abandon)
    threading.Thread(target=call.run, name="nexus-client-call", daemon=True).start()
    return call.result()
