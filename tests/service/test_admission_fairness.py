"""What a parked graph does to big estimates, and the order waiting grants go in."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from nexus_cache.cli.main import main
from nexus_cache.device import DeviceLedger, plan_graph_run, run_graph
from nexus_cache.errors import GrantTooLargeError
from nexus_cache.service import GraphQuery, Scan
from nexus_cache.service.admission import Admission
from nexus_cache.service.evidence import AdmissionLog
from server._helpers import wait_until

from ._helpers import MIB, make_lake, make_service


def _queued(admission: Admission, ledger: DeviceLedger) -> int:
    """How many requests wait in ``admission``'s queue on ``ledger`` (read from its
    internals: the one way to see that a waiting thread has arrived)."""
    with admission._released:
        return len(admission._queues.get(ledger, ()))


def _park_a_graph(service: object, edges: str) -> int:
    """Run a small graph query so that its graph stays parked; returns its bytes."""
    result = service.execute(GraphQuery(Scan(edges), "src", "dst", "pagerank"))  # type: ignore[attr-defined]
    assert result.diagnostics.graph_cache["status"] == "miss"
    graph = service.caches.graph_cache(0)  # type: ignore[attr-defined]
    parked = graph.resident_bytes()
    assert parked > 0
    return int(parked)


def test_a_parked_graph_does_not_block_a_large_estimate(tmp_path: Path) -> None:
    lake = make_lake(tmp_path, scale=6)
    # the scan's estimate (1000 x its Parquet bytes) is far above the 28.8 MiB
    # the device manages; it needs a few hundred KiB
    with make_service(
        tmp_path,
        total=32 * MIB,
        cache_cap_bytes=8 * MIB,
        grant_expansion=1000,
        admission_timeout_s=120,
    ) as service:
        parked = _park_a_graph(service, lake.edges)
        ledger = service.caches.ledger(0)
        started = time.monotonic()
        result = service.execute(Scan(lake.facts))
        waited = time.monotonic() - started
        (attempt,) = result.diagnostics.attempts
    assert result.table.num_rows == 4000
    assert waited < 60  # admitted at once, not after the 120 s wait (generous: a loaded host)
    assert attempt.grant_bytes == ledger.managed_capacity_bytes - parked


def test_a_grant_over_what_can_ever_be_freed_fails_at_once(tmp_path: Path) -> None:
    lake = make_lake(tmp_path, scale=6)
    managed = int(32 * MIB * 0.9)
    # min_grant_bytes fits the managed capacity, but not beside a parked graph
    with make_service(
        tmp_path,
        total=32 * MIB,
        cache_cap_bytes=8 * MIB,
        min_grant_bytes=managed - 1024,
        admission_timeout_s=120,
    ) as service:
        edges = pa.table({"src": [1, 2, 3], "dst": [2, 3, 1]})
        plan = plan_graph_run("pagerank", source=("a proven identity",))
        assert run_graph(service.caches.graph_cache(0), plan, edges).status.value == "miss"
        assert service.caches.graph_cache(0).resident_bytes() > 1024
        started = time.monotonic()
        with pytest.raises(GrantTooLargeError) as info:
            service.execute(Scan(lake.facts))
        waited = time.monotonic() - started
        assert service.caches.ledger(0).snapshot().grant_count == 0
    message = str(info.value)
    assert waited < 60  # not the 120 s admission wait (generous: a loaded host)
    assert f"a grant of {managed - 1024} B" in message
    assert "can never be admitted" in message
    assert "parked graphs" in message


def test_the_command_line_exits_2_for_a_grant_that_can_never_be_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = make_lake(tmp_path)
    config = tmp_path / "service.toml"
    config.write_text('backend = "host"\nmin_grant_bytes = "64MiB"\n')
    monkeypatch.setenv("NEXUS_SERVICE_CONFIG", str(config))
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", str(32 * MIB))
    assert main(["scan", lake.facts]) == 2
    err = capsys.readouterr().err
    assert "can never be admitted" in err
    assert err.count("\n") == 1


def test_a_large_waiter_is_admitted_while_small_grants_keep_arriving(tmp_path: Path) -> None:
    """Three threads admit, hold and release small grants without pause; a grant
    that needs the whole device must still get its turn."""
    ledger = DeviceLedger(0, 90 * MIB, 0)
    admission = Admission(AdmissionLog(None), timeout_s=120.0)
    stop = threading.Event()
    small_runs = [0, 0, 0]

    def small(index: int) -> None:
        number = 0
        while not stop.is_set():
            number += 1
            grant = admission.admit(
                admission.request(f"small-{index}", number, 40 * MIB), ledger=ledger
            )
            time.sleep(0.002)  # a short query
            admission.release(grant, ledger=ledger)
            small_runs[index] += 1

    threads = [threading.Thread(target=small, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: min(small_runs) > 0, timeout=60)  # the small ones run
        started = time.monotonic()
        large = admission.admit(admission.request("large", 1, 80 * MIB), ledger=ledger)
        waited = time.monotonic() - started
        before = sum(small_runs)
        admission.release(large, ledger=ledger)
        # and the small ones go on afterwards
        went_on = wait_until(lambda: sum(small_runs) > before, timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    # its turn came while they kept arriving: far under the 120 s it may wait
    # (a starved request raises AdmissionError then)
    assert waited < 60
    assert went_on
    assert ledger.snapshot().grant_count == 0


def test_grants_are_admitted_in_arrival_order(tmp_path: Path) -> None:
    ledger = DeviceLedger(0, 100 * MIB, 0)
    admission = Admission(AdmissionLog(None), timeout_s=120.0)
    blocker = admission.admit(admission.request("blocker", 1, 100 * MIB), ledger=ledger)

    def wait_for(name: str, nbytes: int) -> None:
        grant = admission.admit(admission.request(name, 1, nbytes), ledger=ledger)
        time.sleep(0.05)
        admission.release(grant, ledger=ledger)

    threads = []
    arrivals = (("first-large", 90 * MIB), ("second-small", MIB), ("third", MIB))
    for arrived, (name, nbytes) in enumerate(arrivals, start=1):
        thread = threading.Thread(target=wait_for, args=(name, nbytes))
        thread.start()
        threads.append(thread)
        # arrive one after the other: each is in the queue before the next starts
        # (a fixed sleep cannot promise that on a loaded host)
        assert wait_until(lambda n=arrived: _queued(admission, ledger) == n, timeout=60)
    admission.release(blocker, ledger=ledger)
    for thread in threads:
        thread.join(60)
    # the log line is written before the next request in line may go
    admitted = [
        line["query_id"]
        for line in admission.log.lines
        if str(line["decision"]).startswith("admitted") and line["query_id"] != "blocker"
    ]
    assert admitted == ["first-large", "second-small", "third"]  # no overtaking
