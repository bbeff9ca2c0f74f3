"""The working domain keeps its free blocks between back-to-back queries and gives
them back once the device has been idle for the service's ``idle_release_s`` (and at
shutdown)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import make_service

from nexus_cache.service import Scan


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": np.arange(50_000), "b": np.arange(50_000.0)}), path)
    return path


def _releases(service: object) -> int:
    return int(service._work[0].counters().releases)  # type: ignore[attr-defined]


def _until(check: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_back_to_back_queries_reuse_the_free_blocks(tmp_path: Path, source: Path) -> None:
    service = make_service(tmp_path / "svc", idle_release_s=60.0)
    try:
        for _ in range(3):
            assert service.execute(Scan(str(source), ["a", "b"])).table.num_rows == 50_000
        # none handed back between them: the next query allocates from the blocks
        assert _releases(service) == 0
        assert service._work.borrowers(0) == 0
    finally:
        service.shutdown()
    assert service._work[0].closed
    assert not service._work.release_pending(0)  # shutdown cancelled the pending release


def test_an_idle_device_gets_the_free_blocks_back(tmp_path: Path, source: Path) -> None:
    service = make_service(tmp_path / "svc", idle_release_s=0.05)
    try:
        service.execute(Scan(str(source), ["a"]))
        assert _until(lambda: _releases(service) == 1)
        assert service._work[0].counters().held_bytes == 0
        # one release per idle spell, not one per timer
        service.execute(Scan(str(source), ["b"]))
        assert _until(lambda: _releases(service) == 2)
        time.sleep(0.2)
        assert _releases(service) == 2
    finally:
        service.shutdown()


def test_a_query_during_the_wait_postpones_the_release(tmp_path: Path, source: Path) -> None:
    # Margins wide enough for a loaded 2-core runner: the borrow starts at once
    # (well inside the idle spell) and lasts past the first timer's deadline.
    idle = 1.0
    service = make_service(tmp_path / "svc", idle_release_s=idle)
    try:
        service.execute(Scan(str(source), ["a"]))
        left = time.monotonic()
        with service._work.borrow(0):  # a query's attempt, as the service lends it
            assert time.monotonic() - left < idle, "the borrow began after the idle spell"
            time.sleep(idle + 0.3)  # the first timer fires now, while the domain is borrowed
            assert _releases(service) == 0
        second = time.monotonic()
        assert _until(lambda: _releases(service) == 1)
        # not before the idle spell that began at the second leave was over
        assert time.monotonic() - second >= idle - 0.1
        assert time.monotonic() - left >= 2 * idle + 0.2
    finally:
        service.shutdown()


def _query_and_wait(service: object, source: str, conn: object) -> None:
    """In a forked child: one query, then whether its free blocks went back."""
    try:
        service.execute(Scan(source, ["a"]))  # type: ignore[attr-defined]
        released = _until(lambda: _releases(service) == 1, timeout=5.0)
        conn.send((released, service._work[0].counters().held_bytes))  # type: ignore[attr-defined]
    except BaseException as exc:
        conn.send(repr(exc))  # type: ignore[attr-defined]


def test_a_forked_child_gets_its_free_blocks_back_once_idle(tmp_path: Path, source: Path) -> None:
    """A release pending at the fork has no thread in the child: the child's own
    query schedules its release all the same."""
    service = make_service(tmp_path / "svc", idle_release_s=0.3)
    try:
        service.execute(Scan(str(source), ["a", "b"]))
        assert service._work.release_pending(0)  # the parent's release is pending
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        child = context.Process(target=_query_and_wait, args=(service, str(source), theirs))
        child.start()
        try:
            assert ours.poll(30), "the child's query hung"
            assert ours.recv() == (True, 0)
            child.join(20)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join()
        assert _until(lambda: _releases(service) == 1)  # the parent's own, as before
    finally:
        service.shutdown()


def test_one_releaser_thread_serves_every_service(tmp_path: Path, source: Path) -> None:
    import threading

    services = [make_service(tmp_path / f"svc{k}", idle_release_s=0.02) for k in range(4)]
    try:
        for _ in range(3):
            for service in services:
                service.execute(Scan(str(source), ["a"]))
            assert _until(lambda: all(_releases(s) >= 1 for s in services))
        names = [t.name for t in threading.enumerate()]
        # no thread per release: one for the process, however many services and spells
        assert names.count("nexus-work-release") == 1, names
        assert not any(n.startswith("Thread-") and "_release" in n for n in names), names
    finally:
        for service in services:
            service.shutdown()


def test_idle_release_zero_hands_the_blocks_back_after_every_query(
    tmp_path: Path, source: Path
) -> None:
    service = make_service(tmp_path / "svc", idle_release_s=0)
    try:
        for k in range(1, 3):
            service.execute(Scan(str(source), ["a"]))
            assert _until(lambda k=k: _releases(service) == k)
            assert service._work[0].counters().held_bytes == 0
    finally:
        service.shutdown()


def test_the_idle_release_defaults_to_five_seconds_and_is_validated(tmp_path: Path) -> None:
    from nexus_cache.errors import ConfigError
    from nexus_cache.service import ServiceConfig

    assert ServiceConfig().idle_release_s == 5.0
    config = ServiceConfig.load(environ={"NEXUS_SERVICE_IDLE_RELEASE_S": "0.25"})
    assert config.idle_release_s == 0.25
    assert ServiceConfig.from_json(config.to_json()).idle_release_s == 0.25
    for bad in (-1, float("nan"), float("inf"), "soon"):
        with pytest.raises(ConfigError, match="idle_release_s"):
            ServiceConfig(idle_release_s=bad)
    service = make_service(tmp_path / "svc")
    try:
        assert service._work._idle_s == 5.0
    finally:
        service.shutdown()


def test_a_later_deadline_does_not_wake_the_releaser_and_an_earlier_one_does() -> None:
    """The releaser sleeps until its soonest deadline: moving a release later (every
    query's leave does) leaves it asleep, a release due sooner wakes it, and each
    runs when due."""
    import threading

    from nexus_cache.service._work import _Releaser

    releaser = _Releaser()
    ran: dict[str, float] = {}
    done = threading.Event()
    waits: list[float | None] = []
    cond = releaser._cond
    real_wait = cond.wait

    def counting(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return real_wait(timeout)

    cond.wait = counting  # type: ignore[method-assign]
    start = time.monotonic()

    def run(name: str) -> Callable[[], None]:
        def mark() -> None:
            ran[name] = time.monotonic() - start
            if len(ran) == 2:
                done.set()

        return mark

    releaser.schedule(("a", 0), start + 2.0, run("a"))
    deadline = time.monotonic() + 5
    while not waits and time.monotonic() < deadline:
        time.sleep(0.005)
    asleep = len(waits)
    for later in (2.1, 2.2, 2.3):  # a query leaving again, each time
        releaser.schedule(("a", 0), start + later, run("a"))
    time.sleep(0.05)
    assert len(waits) == asleep  # not woken: its deadline only moved later
    releaser.schedule(("b", 0), start + 0.5, run("b"))  # due sooner: wakes it
    assert done.wait(5)
    assert 0.5 <= ran["b"] < 2.0
    assert ran["a"] >= 2.3


def test_a_release_due_past_the_longest_wait_keeps_the_releaser_running() -> None:
    """A release due further off than a thread's wait can take (a service's
    ``idle_release_s`` of 1e12) neither ends the releaser thread (an uncaught
    OverflowError) nor holds back a release due sooner."""
    import threading

    from nexus_cache.service._work import _Releaser

    releaser = _Releaser()
    waits: list[float | None] = []
    waiting = threading.Event()
    cond = releaser._cond
    real_wait = cond.wait

    def counting(timeout: float | None = None) -> bool:
        waits.append(timeout)
        waiting.set()
        return real_wait(timeout)

    cond.wait = counting  # type: ignore[method-assign]
    releaser.schedule(("patient", 0), time.monotonic() + 1e12, lambda: None)
    assert waiting.wait(5)
    thread = releaser._thread
    assert thread is not None
    assert all(t is None or t <= threading.TIMEOUT_MAX for t in waits), waits
    ran = threading.Event()
    releaser.schedule(("quick", 0), time.monotonic() + 0.05, ran.set)
    assert ran.wait(5)
    assert releaser._thread is thread
    assert thread.is_alive()
    assert releaser.pending(("patient", 0))
