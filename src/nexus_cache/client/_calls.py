"""Flight calls that a Ctrl-C interrupts at once: :func:`interruptible`.

pyarrow's Flight calls block in C++ until the server answers: ``do_get``
returns only once the query has executed (its first message is the result's
schema). Run there, a Ctrl-C waits for the whole query. So a call made from
the main thread (the only one Python raises ``KeyboardInterrupt`` in) runs
in a worker thread while the main thread waits on an event, which a signal
interrupts: ``KeyboardInterrupt`` (or any exception) is raised at once, and
the call is abandoned. A stream that has begun is cancelled (the server stops
sending and drops the result); one that has not is cancelled the moment its
first message arrives, since pyarrow offers no way to cancel a call before
then. ``on_abandon`` runs as the call is abandoned: the client asks the server
there to cancel the query (its ``cancel`` action), so a process that goes on
after the interrupt does not leave it running. The interrupt then waits a
moment (at most ``_SETTLE_S``) for the cancelled call to return: a process
that exits while a worker is still inside gRPC can crash in gRPC's teardown.

The worker is one daemon thread, started by the main thread's first call and
kept for the next ones (starting a thread per call cost a warm query about as
much as a bare Flight round trip); a worker left inside an abandoned call
ends with that call, and the next call starts another, so an abandoned call
never holds up the next. A call made from any other thread runs in that
thread: no signal can interrupt it there, so a worker would add nothing but
the hand-over. A forked child starts a worker of its own. Thread-safe.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Cancellable", "abandoned_calls", "interruptible"]

_T = TypeVar("_T")

# how often the waiting thread wakes (a signal interrupts the wait anyway)
_WAKE_S = 0.25
# how long an interrupt waits for the call it abandoned (and cancelled) to return
_SETTLE_S = 1.0


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def _ignore(_stream: Cancellable) -> None:
    """``watch`` of a call nothing can interrupt."""


class _Call(Generic[_T]):
    """One call run by a worker; ``watch(reader)`` names what ``abandon`` cancels."""

    def __init__(
        self,
        work: Callable[[Callable[[Cancellable], None]], _T],
    ) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stream: Cancellable | None = None
        self._abandoned = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._work: Callable[[Callable[[Cancellable], None]], _T] | None = work

    def run(self) -> None:
        work, self._work = self._work, None  # the worker keeps no reference after
        try:
            assert work is not None
            self._value = work(self.watch)
        except BaseException as exc:  # handed to the waiting thread
            self._error = exc
        finally:
            with self._lock:
                self._done.set()
                abandoned = self._abandoned
            if abandoned:
                _count_abandoned(-1)

    def watch(self, stream: Cancellable) -> None:
        with self._lock:
            self._stream = stream
            abandoned = self._abandoned
        if abandoned:
            stream.cancel()  # the caller left while the server still executed

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the call to return (its value and stream are
        dropped: an interrupt's traceback keeps the call)."""
        if self._done.wait(timeout):
            self._value = self._error = self._stream = None

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            stream = self._stream
            running = not self._done.is_set()
            if running:
                _count_abandoned(1)
        if stream is not None:
            stream.cancel()

    def result(self) -> _T:
        """The call's value once done, or its exception re-raised."""
        while not self._done.wait(_WAKE_S):
            pass
        error, self._error = self._error, None
        if error is not None:
            try:
                raise error
            finally:
                del error
        value: _T = self._value
        self._value = None
        return value


class _Worker:
    """A daemon thread running the calls it is handed, one at a time; :meth:`retire`
    ends it once its current call is done."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="nexus-client-call", daemon=True).start()

    def run(self, call: _Call[Any]) -> None:
        self._calls.put(call)

    def retire(self) -> None:
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call.run()
            del call  # nothing of a finished call is kept while the worker waits


_lock = threading.Lock()
# the worker waiting for the main thread's next call (None: none yet, or in a call)
_idle: _Worker | None = None
# calls abandoned by an interrupt that have not returned yet
_abandoned = 0
_abandoned_lock = threading.Lock()


def _count_abandoned(step: int) -> None:
    global _abandoned
    with _abandoned_lock:
        _abandoned += step


def abandoned_calls() -> int:
    """How many calls an interrupt abandoned are still running in a worker thread
    (inside gRPC: a process that exits now should skip the interpreter's teardown,
    during which gRPC can crash under a live call)."""
    with _abandoned_lock:
        return _abandoned


def _forget_worker() -> None:
    """In a forked child: the parent's worker thread is not there (and its lock may
    have been held by a thread that is not there either)."""
    global _idle, _lock, _abandoned, _abandoned_lock
    _idle, _lock = None, threading.Lock()
    _abandoned, _abandoned_lock = 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker)


def _take_worker() -> _Worker:
    global _idle
    with _lock:
        worker, _idle = _idle, None
    return worker or _Worker()


def _give_back(worker: _Worker) -> None:
    global _idle
    with _lock:
        if _idle is None:
            _idle = worker
            return
    worker.retire()  # another came back first (a call made inside a signal handler)


def interruptible(
    work: Callable[[Callable[[Cancellable], None]], _T],
    on_abandon: Callable[[], None] | None = None,
) -> _T:
    """``work(watch)``'s value, or its exception re-raised.

    ``work`` calls ``watch(reader)`` with the stream it opened, so that an
    interrupted caller cancels it. From the main thread ``work`` runs in the
    worker thread, and an exception raised in the main thread while it waits
    (``KeyboardInterrupt`` from Ctrl-C) abandons the call, runs
    ``on_abandon()`` (which must not raise) and propagates. From any other
    thread ``work`` runs in the calling thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return work(_ignore)
    call = _Call(work)
    worker = _take_worker()
    try:
        worker.run(call)
        value = call.result()
    except BaseException:
        if call.finished:  # the call's own error
            _give_back(worker)
            raise
        # interrupted while the call runs (or before it was handed over)
        worker.retire()  # it ends once the abandoned call returns
        call.abandon()
        if on_abandon is not None:
            on_abandon()
        call.settle(_SETTLE_S)
        raise
    _give_back(worker)
    return value
