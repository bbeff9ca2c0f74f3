"""Device results under pressure: many held at once, shutdown, Ctrl-C, threads, fork.

On the host backend, with real threads and processes. Each test checks a
guarantee of docs/service.md ("Results in device memory", "Shutdown"): the
ledger's books stay exact while results are held, waited for and released; an
interrupt at any step of ``execute_on_device`` leaves every grant and byte
released or owned by a returned result; a release racing readers never crashes;
a forked child never gives back the parent's grant.
"""

from __future__ import annotations

import _thread
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tests.service._helpers import MIB, make_service, write_year_month_hive

import nexus_cache.service._attempt as attempt_module
import nexus_cache.service._runner as runner_module
import nexus_cache.service._table_filter as table_filter_module
import nexus_cache.service.service as service_module
from nexus_cache.errors import AdmissionError, LifecycleError
from nexus_cache.frames import DeviceFrame
from nexus_cache.service import QueryService, Scan
from nexus_cache.service.admission import Admission
from nexus_cache.service.config import DeviceSettings
from nexus_cache.service.evidence import EvidenceWriter

SCAN_FILTER: list[Any] = [("w", "<", 0.5)]


def _edges(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array(rng.random(n)),
            "kind": pa.array(rng.choice(["follow", "like"], n).tolist(), pa.string()),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    return write_year_month_hive(tmp_path / "edges", lambda n: _edges(600, n), 200)


def _scan(hive: Path, columns: list[str] | None = None) -> Scan:
    return Scan(str(hive), columns=columns or ["src", "w"], filter=SCAN_FILTER)


def _books(service: QueryService) -> tuple[int, int, int, int, int]:
    """Grants (count, bytes), live bytes of the working domain, borrowers of it, and
    device results the service counts as held."""
    snap = service.caches.ledger(0).snapshot()
    return (
        snap.grant_count,
        snap.grant_bytes,
        service._work[0].used_bytes(),
        service._work.borrowers(0),
        len(service._held),
    )


NOTHING = (0, 0, 0, 0, 0)


def _small_device(tmp_path: Path, timeout_s: float) -> QueryService:
    """A device where three 3 MiB grants fit and a fourth does not."""
    return make_service(
        tmp_path,
        devices=(DeviceSettings(0, managed_capacity_bytes=10 * MIB, cache_cap_bytes=MIB),),
        min_grant_bytes=3 * MIB,
        admission_timeout_s=timeout_s,
    )


# -- 1. results held until admission cannot grant the next query ---------------------------


def test_held_results_make_queries_wait_and_a_release_from_another_thread_admits_them(
    hive: Path, tmp_path: Path
) -> None:
    scan = _scan(hive)
    service = _small_device(tmp_path, timeout_s=1.0)
    try:
        want = service.execute(scan).table
        held = [service.execute_on_device(scan) for _ in range(3)]
        grants = [r.diagnostics.attempts[-1].grant_bytes for r in held]
        assert _books(service)[:2] == (3, sum(grants)) == (3, 9 * MIB)
        # nothing more fits: both kinds of query wait, then are refused naming the setting
        for run in (service.execute, service.execute_on_device):
            started = time.monotonic()
            with pytest.raises(AdmissionError, match="NEXUS_SERVICE_ADMISSION_TIMEOUT_S"):
                run(scan)
            assert time.monotonic() - started >= 1.0
            assert _books(service)[:2] == (3, 9 * MIB)  # the refusal booked nothing
        # a result released from another thread while this one waits for admission
        for number, on_device in enumerate((False, True)):
            while len(held) < 3:  # the device full again
                held.append(service.execute_on_device(scan))
            victim = held.pop()

            def release_once_queued(victim: Any = victim) -> None:
                deadline = time.monotonic() + 10
                while not service._admission._queues and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.1)
                victim.release()

            releaser = threading.Thread(target=release_once_queued)
            releaser.start()
            if on_device:
                got: Any = service.execute_on_device(scan, query_id=f"waited-{number}")
                held.append(got)
                table = got.to_arrow()
            else:
                got = service.execute(scan, query_id=f"waited-{number}")
                table = got.table
            releaser.join()
            assert table.equals(want)
            assert [a.outcome for a in got.diagnostics.attempts] == ["ok"]
            assert _books(service)[:2] == (len(held), len(held) * 3 * MIB)
        log = service.admission_log.path.read_text().splitlines()
        for number in (0, 1):
            assert any(
                f"waited-{number}-1\t" in line and "\tadmitted_after_wait\t" in line
                for line in log
            )
        for result in held:
            assert result.to_arrow().equals(want)
            result.release()
        assert _books(service) == NOTHING
    finally:
        shutdown = service.shutdown(timeout=5.0)
    assert all(d.complete for d in shutdown)


# -- 2. shutdown while results are held ----------------------------------------------------


def test_results_released_after_an_incomplete_shutdown_free_everything_once(
    hive: Path, tmp_path: Path
) -> None:
    scan = _scan(hive, ["src", "w", "kind"])
    service = make_service(tmp_path)
    want = service.execute(scan).table
    results = [service.execute_on_device(scan, query_id=f"held-{i}") for i in range(3)]
    part = results[0].frame.slice(1, 5)  # a derived frame keeps the grant too
    started = time.monotonic()
    (first,) = service.shutdown(timeout=0.2)
    assert time.monotonic() - started >= 0.2  # it waited before it reported
    assert not first.complete
    assert "3 device result(s) still held" in str(first.problem)
    with pytest.raises(LifecycleError, match="shut down"):
        service.execute_on_device(scan)
    with pytest.raises(LifecycleError, match="shut down"):
        service.execute(scan)
    for result in results:
        assert result.to_arrow().equals(want)  # readable until released
    # released from many threads at once, twice each: no error, no double free
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def release(result: Any) -> None:
        barrier.wait()
        try:
            result.release()
        except BaseException as exc:  # pragma: no cover - the failure being tested
            errors.append(exc)

    threads = [threading.Thread(target=release, args=(r,)) for r in results * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _books(service)[:2] == (1, results[0].diagnostics.attempts[-1].grant_bytes)
    assert part.to_arrow().equals(want.slice(1, 5))
    (second,) = service.shutdown(timeout=0.2)
    assert not second.complete
    assert "1 device result(s) still held (queries held-0)" in str(second.problem)
    part.release()
    assert _books(service) == NOTHING
    (third,) = service.shutdown(timeout=5.0)
    assert third.complete
    assert service._work[0].closed
    for result in results:
        result.release()  # after a complete shutdown: still a no-op
    assert service.shutdown() == [third]


# -- 3. Ctrl-C at each step of execute_on_device -----------------------------------------


def _after(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, then a Ctrl-C as it returns."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    return interrupted


def _instead(real: Callable[..., Any]) -> Callable[..., Any]:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    return interrupted


# (where, attribute, how): every Python step between admission and the return
STEPS: dict[str, tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "decode": (attempt_module, "decode_table_object", _after),
    "gather": (table_filter_module, "gather_table", _after),
    "sealing": (EvidenceWriter, "seal", _after),
    "booking": (DeviceFrame, "with_owner", _after),
    "noting the source's device": (Admission, "remember", _instead),
    "diagnostics": (runner_module, "Diagnostics", _instead),
    "deferring the fingerprint": (runner_module, "defer_device_fingerprint", _instead),
    "wrapping the result": (runner_module, "DeviceQueryResult", _instead),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_ctrl_c_at_any_step_gives_every_byte_back_while_the_exception_lives(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Checked while the interrupt is still referenced (a notebook keeps it in
    ``sys.last_traceback``): nothing waits for a collection to be given back."""
    where, name, how = STEPS[step]
    evidence = None if step == "deferring the fingerprint" else tmp_path / "evidence"
    service = make_service(tmp_path, evidence_dir=evidence)
    try:
        monkeypatch.setattr(where, name, how(getattr(where, name)))
        with pytest.raises(KeyboardInterrupt) as caught:
            service.execute_on_device(_scan(hive), query_id="interrupted")
        assert caught.value.__context__ is None  # the interrupt, not a cleanup error
        assert _books(service) == NOTHING
        monkeypatch.undo()
        with service.execute_on_device(_scan(hive)) as result:  # the service lives on
            assert _books(service)[0] == 1
            assert result.frame.num_rows > 0
        del caught
        gc.collect()
        assert _books(service) == NOTHING
    finally:
        monkeypatch.undo()
        started = time.monotonic()
        shutdown = service.shutdown(timeout=10.0)
    assert all(d.complete for d in shutdown)
    assert time.monotonic() - started < 5  # no held result was waited for


def test_a_ctrl_c_while_waiting_for_admission_behind_held_results_leaves_them_intact(
    hive: Path, tmp_path: Path
) -> None:
    scan = _scan(hive)
    service = _small_device(tmp_path, timeout_s=60.0)
    try:
        held = [service.execute_on_device(scan) for _ in range(3)]
        before = _books(service)
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            service.execute_on_device(scan)
        timer.join()
        assert time.monotonic() - started < 30
        assert _books(service) == before  # the held results only
        assert service._admission._queues == {}  # it left the queue
        for result in held:
            result.release()
        assert _books(service) == NOTHING
        with service.execute_on_device(scan):
            assert _books(service)[0] == 1
    finally:
        shutdown = service.shutdown(timeout=5.0)
    assert all(d.complete for d in shutdown)


# -- 4. release racing readers ----------------------------------------------------------


@pytest.mark.parametrize("columns", [["src", "w"], ["src", "w", "kind"]])
def test_a_release_racing_readers_gives_correct_rows_or_lifecycle_error(
    hive: Path, tmp_path: Path, columns: list[str]
) -> None:
    scan = _scan(hive, columns)
    with make_service(tmp_path, evidence_dir=None) as service:
        want = service.execute(scan).table
        outcomes = {"rows": 0, "released": 0}
        errors: list[BaseException] = []
        for trial in range(12):
            result = service.execute_on_device(scan)
            barrier = threading.Barrier(7)

            def read(result: Any = result, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                for _ in range(4):
                    try:
                        table = result.to_arrow()
                        total = float(result.frame.column("w").data.sum())
                    except LifecycleError:
                        outcomes["released"] += 1
                        continue
                    except BaseException as exc:  # pragma: no cover - the failure tested
                        errors.append(exc)
                        continue
                    if not table.equals(want) or not np.isclose(
                        total, pa.compute.sum(want["w"]).as_py()
                    ):
                        errors.append(AssertionError("wrong rows"))  # pragma: no cover
                    outcomes["rows"] += 1

            def release(
                result: Any = result,
                barrier: threading.Barrier = barrier,
                delay: float = 0.0004 * trial,
            ) -> None:
                barrier.wait()
                time.sleep(delay)
                try:
                    result.release()
                except BaseException as exc:  # pragma: no cover - the failure tested
                    errors.append(exc)

            threads = [threading.Thread(target=read) for _ in range(3)]
            threads += [threading.Thread(target=release) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert result.released
        assert errors == []
        assert outcomes["released"] > 0  # some reads did race the release
        assert _books(service) == NOTHING


# -- 5. a forked child of a process holding a result --------------------------------------


def _child_releases(result: Any, conn: Any) -> None:
    result.release()
    conn.send(result.released)


def test_a_forked_child_releasing_the_parents_result_gives_nothing_back(
    hive: Path, tmp_path: Path
) -> None:
    """Even while another thread of the parent was inside the service at the fork
    (its lock copied held into the child), the child's release returns at once and
    the parent's grant, memory and rows are untouched."""
    scan = _scan(hive)
    with make_service(tmp_path) as service:
        result = service.execute_on_device(scan, query_id="parents")
        want = result.to_arrow()
        before = _books(service)
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        child = context.Process(target=_child_releases, args=(result, theirs))
        with service._lock:  # a parent thread inside the service at the fork
            child.start()
        try:
            assert ours.poll(20), "the child's release hung"
            assert ours.recv() is True
            child.join(20)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join()
        assert _books(service) == before
        assert result.to_arrow().equals(want)
        result.release()
        assert _books(service) == NOTHING


_FORK_EXIT = """
import json, os, sys, threading, time
from pathlib import Path
from tests.service._helpers import make_service
from nexus_cache.service import Scan

root, hive = Path(sys.argv[1]), sys.argv[2]
service = make_service(root)
result = service.execute_on_device(Scan(hive, columns=["src", "w"], filter=[("w", "<", 0.5)]))
rows = result.to_arrow().num_rows
inside, leave = threading.Event(), threading.Event()
def busy():  # another thread of the parent inside the service at the fork
    with service._lock:
        inside.set()
        leave.wait()
thread = threading.Thread(target=busy)
thread.start()
inside.wait()
pid = os.fork()
if pid == 0:
    assert result.frame.column("src").data.size == rows  # its copy reads
    sys.exit(0)  # a normal exit: finalizers run
deadline = time.monotonic() + 20
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if done[0] == 0:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = "hung"
else:
    status = os.waitstatus_to_exitcode(done[1])
leave.set()
thread.join()
snap = service.caches.ledger(0).snapshot()
report = {"child": status, "grants": snap.grant_count, "rows": result.to_arrow().num_rows}
result.release()
report["after"] = service.caches.ledger(0).snapshot().grant_count
report["complete"] = all(d.complete for d in service.shutdown(timeout=5))
print(json.dumps(report))
"""


def test_a_forked_child_that_exits_normally_neither_warns_nor_releases(
    hive: Path, tmp_path: Path
) -> None:
    """Its exit runs the result's finalizers in the child: they must not report the
    parent's held result as forgotten, nor touch the parent's service state (a lock
    copied held would hang the child's exit)."""
    repo = Path(__file__).resolve().parents[2]
    src = Path(service_module.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(repo)])}
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always::ResourceWarning",
            "-c",
            textwrap.dedent(_FORK_EXIT),
            str(tmp_path / "service"),
            str(hive),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "dropped without release" not in done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rows"] > 0  # the parent's result was read after the child's exit
    assert report == {
        "child": 0,
        "grants": 1,
        "rows": report["rows"],
        "after": 0,
        "complete": True,
    }


def test_a_result_returned_by_a_query_running_at_shutdown_is_reported_by_the_next_one(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not waited for (it was running, not held, when shutdown began), but once it
    is held a later shutdown() waits for it and reports it; after its release the
    shutdown completes and closes the working domain."""
    decoding, resume = threading.Event(), threading.Event()
    real = attempt_module.decode_table_object

    def slow_decode(*args: Any, **kwargs: Any) -> Any:
        frame = real(*args, **kwargs)
        decoding.set()
        resume.wait(10)
        return frame

    monkeypatch.setattr(attempt_module, "decode_table_object", slow_decode)
    service = make_service(tmp_path)
    got: dict[str, Any] = {}

    def query() -> None:
        got["result"] = service.execute_on_device(_scan(hive), query_id="late")

    runner = threading.Thread(target=query)
    runner.start()
    assert decoding.wait(10)
    service.shutdown(timeout=0.2)
    resume.set()
    runner.join(20)
    result = got["result"]
    assert result.frame.num_rows > 0
    (held,) = service.shutdown(timeout=0.2)
    assert not held.complete
    assert "1 device result(s) still held (queries late)" in str(held.problem)
    assert not service._work[0].closed
    result.release()
    assert _books(service) == NOTHING
    (done,) = service.shutdown(timeout=5.0)
    assert done.complete
    assert service._work[0].closed
