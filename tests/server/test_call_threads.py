"""What a warm query costs in threads: the client's calls and the server's cancel
watch start no thread per query, and still do what they are there for (Ctrl-C
abandons a call at once, a client that went away cancels its query). A real
server process on loopback; new threads are seen through ``threading.settrace``,
which every thread started by ``threading`` installs as it begins."""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from nexus_cache.client import Client
from nexus_cache.client._calls import Cancellable, abandoned_calls, interruptible
from nexus_cache.errors import CacheClosedError
from nexus_cache.server._watch import WATCH_INTERVAL_S, CallWatcher
from nexus_cache.service.datagen import fact_table, write_parquet

from ._helpers import Server, close_all, server_env, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("threads")
    write_parquet(fact_table(1000), root / "facts.parquet")
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    os.utime(root / "facts.parquet", (past, past))
    server = start_server(server_env(root))
    try:
        yield server, root / "facts.parquet"
    finally:
        close_all([server])


class _Started:
    """The names of the threads started (through ``threading``) while in the block."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __enter__(self) -> list[str]:
        def seen(*_: object) -> None:
            self.names.append(threading.current_thread().name)
            sys.settrace(None)  # once per thread: not for each call it makes

        threading.settrace(seen)  # type: ignore[arg-type]
        return self.names

    def __exit__(self, *_: object) -> None:
        threading.settrace(None)  # type: ignore[arg-type]


def test_warm_client_calls_start_no_thread_of_their_own(served: tuple[Server, Path]) -> None:
    server, facts = served
    query = {"type": "count", "source": str(facts)}
    with Client(server.url) as client:
        assert client.execute(query).table.num_rows == 1  # cold, and the worker's start
        rows: list[int] = []

        def from_another_thread() -> None:
            for _ in range(5):
                rows.append(client.execute(query).table.num_rows)
            rows.append(len(client.reports()))

        with _Started() as started:
            for _ in range(10):
                assert client.execute(query).table.num_rows == 1  # the main thread
            assert client.health()["status"] == "ready"
            other = threading.Thread(target=from_another_thread, name="test-caller")
            other.start()
            other.join(60)
        assert rows == [1, 1, 1, 1, 1, 1]
    # the test's own thread only: the main thread's calls reuse one worker, and
    # another thread's calls run in that thread
    assert started == ["test-caller"]


def test_ctrl_c_abandons_a_main_thread_call_and_the_next_call_is_not_held_up() -> None:
    entered, release = threading.Event(), threading.Event()
    abandoned: list[str] = []

    class Stream:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    stream = Stream()

    def stuck(watch: Callable[[Cancellable], None]) -> str:
        entered.set()
        release.wait(60)
        watch(stream)  # its first message arrives after the caller left
        return "late"

    def interrupt() -> None:
        if entered.wait(30):
            _thread.interrupt_main()  # what Ctrl-C raises in the main thread

    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interruptible(stuck, lambda: abandoned.append("cancel sent"))
    assert time.monotonic() - started < 10
    assert abandoned == ["cancel sent"]
    try:
        # the worker is still inside the abandoned call: the next one gets another
        assert interruptible(lambda _watch: "next") == "next"
        assert not release.is_set()
    finally:
        release.set()
    # the abandoned call's stream is cancelled as soon as it is known
    deadline = time.monotonic() + 10
    while not stream.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.cancelled
    # and a call's own error reaches its caller, the worker going on after it
    with pytest.raises(ValueError, match="bad"):
        interruptible(lambda _watch: (_ for _ in ()).throw(ValueError("bad")))
    assert interruptible(lambda _watch: 3) == 3


def test_an_interrupt_waits_a_moment_for_the_call_it_cancelled_to_return() -> None:
    # A CLI exits right after the interrupt: a worker still inside gRPC then can
    # crash the process in gRPC's teardown. The cancel makes the call return
    # soon, and the interrupt waits for that (a moment at most).
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def cancelled_soon(_watch: Callable[[Cancellable], None]) -> None:
        entered.set()
        release.wait(60)  # as a do_get waits for the server's answer
        time.sleep(0.2)  # the call unwinds after the server's cancel
        returned.set()

    def interrupt() -> None:
        if entered.wait(30):
            _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        interruptible(cancelled_soon, release.set)  # on_abandon: the server's cancel
    assert returned.is_set()
    assert abandoned_calls() == 0


def test_a_call_that_outlasts_the_wait_is_counted_until_it_returns() -> None:
    entered, release = threading.Event(), threading.Event()

    def deaf(_watch: Callable[[Cancellable], None]) -> None:
        entered.set()
        release.wait(60)  # a server that answers neither the query nor the cancel

    def interrupt() -> None:
        if entered.wait(30):
            _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    before = abandoned_calls()
    with pytest.raises(KeyboardInterrupt):
        interruptible(deaf)
    assert abandoned_calls() == before + 1  # what the CLI exits on without teardown
    release.set()
    assert _wait(lambda: abandoned_calls() == before)


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class _Flight:
    """A Flight connection whose ``do_action`` blocks until released; it records
    whether it was closed under a running call (which crashes a real one)."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.running = 0
        self.closed = False
        self.closed_while_running = False

    def do_action(self, _action: object, _options: object) -> list[object]:
        self.running += 1
        self.inside.set()
        self.release.wait(60)
        self.running -= 1

        class Result:
            body = pa.py_buffer(b'{"status": "ready"}')

        return [Result()]

    def close(self) -> None:
        self.closed_while_running |= self.running > 0
        self.closed = True


def test_close_under_a_running_call_closes_the_connection_when_the_call_returns() -> None:
    client = Client("grpc://127.0.0.1:1")
    client._flight.close()
    flight = client._flight = _Flight()  # type: ignore[assignment]
    answers: list[object] = []
    caller = threading.Thread(target=lambda: answers.append(client.health()))
    caller.start()
    assert flight.inside.wait(30)
    client.close()
    client.close()  # twice is as once
    assert not flight.closed
    flight.release.set()
    caller.join(30)
    assert answers == [{"status": "ready"}]
    assert flight.closed
    assert not flight.closed_while_running
    with pytest.raises(CacheClosedError, match="closed; make a new Client"):
        client.health()


class _Context:
    """A call's context as the watcher sees it: gRPC's ``is_cancelled()``."""

    def __init__(self) -> None:
        self.gone = threading.Event()

    def is_cancelled(self) -> bool:
        return self.gone.is_set()


def test_the_cancel_watch_keeps_one_thread_across_pauses_and_still_cancels() -> None:
    watcher = CallWatcher()
    first, first_cancel = _Context(), threading.Event()
    with watcher.watching(first, first_cancel):
        pass
    # the server idle for a while, then queries again: no thread starts for them
    time.sleep(4 * WATCH_INTERVAL_S)
    with _Started() as started:
        for _ in range(3):
            context, cancel = _Context(), threading.Event()
            with watcher.watching(context, cancel):
                context.gone.set()  # its client went away while it executes
                assert cancel.wait(10 * WATCH_INTERVAL_S + 5)
            time.sleep(2 * WATCH_INTERVAL_S)
    assert started == []
    assert not first_cancel.is_set()
