"""Admission through the ledger: bounded wait, refusals that name the numbers, the TSV."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nexus_cache.errors import (
    AdmissionClosedError,
    AdmissionError,
    CapacityError,
    GrantExhaustedError,
)
from nexus_cache.service import ADMISSION_COLUMNS, Scan
from nexus_cache.service.admission import GrantMemory

from ._helpers import MIB, make_lake, make_service


def test_a_grant_larger_than_the_device_is_refused_at_once(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    # 8 MiB simulated device: 7.2 MiB managed; the scan asks for 16 MiB
    with make_service(
        tmp_path,
        total=8 * MIB,
        cache_cap_bytes=MIB,
        min_grant_bytes=16 * MIB,
        admission_timeout_s=120,
    ) as service:
        start = time.monotonic()
        with pytest.raises(AdmissionError) as info:
            service.execute(Scan(lake.facts))
        # no wait: it could never fit (far under the 120 s it may wait, on a loaded host too)
        assert time.monotonic() - start < 60
        lines = service.admission_log.lines
    message = str(info.value)
    assert isinstance(info.value, CapacityError)
    assert f"a grant of {16 * MIB} B" in message
    assert "can never be admitted" in message
    assert f"managed capacity {int(8 * MIB * 0.9)} B" in message
    assert [line["decision"] for line in lines] == ["refused"]


def test_a_grant_waits_a_bounded_time_then_fails_with_the_numbers(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    with make_service(
        tmp_path,
        total=64 * MIB,
        cache_cap_bytes=MIB,
        min_grant_bytes=8 * MIB,
        admission_timeout_s=0.3,
    ) as service:
        ledger = service.caches.ledger(0)
        blocker = ledger.admit_grant("other query", ledger.managed_capacity_bytes - 4 * MIB)
        start = time.monotonic()
        with pytest.raises(AdmissionError) as info:
            service.execute(Scan(lake.facts))
        waited = time.monotonic() - start
        ledger.release_grant(blocker)
        rows = list(service.admission_log.lines)
        tsv = (service.admission_log.path).read_text().splitlines()  # type: ignore[union-attr]
    assert 0.3 <= waited < 30  # bounded by its 0.3 s (generously, for a loaded host)
    message = str(info.value)
    assert f"a grant of {8 * MIB} B" in message
    assert "did not fit within the 0.3" in message
    assert f"grants {ledger.managed_capacity_bytes - 4 * MIB} B (1 attempts)" in message
    assert "NEXUS_SERVICE_ADMISSION_TIMEOUT_S" in message
    assert rows[-1]["decision"] == "refused"
    assert tsv[0].split("\t") == list(ADMISSION_COLUMNS)
    fields = dict(zip(ADMISSION_COLUMNS, tsv[-1].split("\t"), strict=True))
    assert fields["decision"] == "refused"
    assert int(fields["requested_bytes"]) == 8 * MIB
    assert float(fields["waited_s"]) >= 0.3
    assert fields["cache_evictable_resident_bytes"] == "0"
    assert fields["cache_pinned_in_use_bytes"] == "0"


def test_a_waiting_grant_is_admitted_when_capacity_frees(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    with make_service(
        tmp_path,
        total=64 * MIB,
        cache_cap_bytes=MIB,
        min_grant_bytes=8 * MIB,
        admission_timeout_s=10,
    ) as service:
        ledger = service.caches.ledger(0)
        blocker = ledger.admit_grant("other query", ledger.managed_capacity_bytes - 4 * MIB)
        timer = threading.Timer(0.2, ledger.release_grant, args=(blocker,))
        timer.start()
        result = service.execute(Scan(lake.facts))
        timer.join()
        decisions = [line["decision"] for line in service.admission_log.lines]
        assert ledger.snapshot().grant_bytes == 0  # every grant released
    assert result.table.num_rows == 4000
    assert decisions == ["admitted_after_wait"]
    assert service.admission_log.lines[0]["waited_s"] >= 0.15


def test_closed_admission_is_reported(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path) as service:
        service.caches.ledger(0).close_admission("operator maintenance")
        with pytest.raises(AdmissionClosedError, match="operator maintenance"):
            service.execute(Scan(lake.facts))
        assert [line["decision"] for line in service.admission_log.lines] == ["closed"]


def test_concurrent_queries_share_the_device(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    errors: list[BaseException] = []
    with make_service(tmp_path, total=256 * MIB, min_grant_bytes=64 * MIB) as service:
        managed = service.caches.ledger(0).managed_capacity_bytes
        assert managed < 4 * 64 * MIB  # at most 3 of the 8 fit at once

        def run() -> None:
            try:
                service.execute(Scan(lake.facts))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert service.caches.ledger(0).snapshot().grant_bytes == 0
        decisions = [line["decision"] for line in service.admission_log.lines]
    assert not errors
    assert len(decisions) == 8
    assert set(decisions) <= {"admitted", "admitted_after_wait"}


def test_an_exhausted_grant_says_what_it_needed_and_the_retry_asks_twice_that(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path, min_grant_bytes=1, grant_expansion=1e-9) as service:
        result = service.execute(Scan(lake.facts))
        first, second = result.diagnostics.attempts[:2]
        assert first.outcome == "retried"
        assert first.error is not None
        assert first.error.startswith("GrantExhaustedError")
        # the error carries the figure; the retry's grant is built from it
        assert second.grant_bytes == 2 * first.used_bytes
    error = GrantExhaustedError("over its grant", needed_bytes=5 * MIB)
    assert error.needed_bytes == 5 * MIB
    assert GrantExhaustedError("rebuilt from a server's message").needed_bytes == 0


def test_a_query_retried_for_its_grant_asks_for_what_it_needed_the_next_time(
    tmp_path: Path,
) -> None:
    """An estimate that falls short costs one retry, not one on every run: the
    next run of the same query asks for what the last one used, up front (a warm
    scan of dictionary-heavy data was decoded twice per query before)."""
    lake = make_lake(tmp_path)
    with make_service(tmp_path, min_grant_bytes=1, grant_expansion=1e-9) as service:
        first = service.execute(Scan(lake.facts))
        assert [a.outcome for a in first.diagnostics.attempts] == ["retried", "ok"]
        needed = first.diagnostics.attempts[-1].used_bytes
        again = service.execute(Scan(lake.facts))
        assert [a.outcome for a in again.diagnostics.attempts] == ["ok"]
        assert again.diagnostics.attempts[0].grant_bytes >= needed
        assert again.table.equals(first.table)
        # another query (other columns) has its own need: still estimated, still retried
        other = service.execute(Scan(lake.facts, ["order_id"]))
        assert [a.outcome for a in other.diagnostics.attempts] == ["retried", "ok"]


def test_the_grant_memory_is_bounded_and_forgets_the_least_recently_used() -> None:
    memory = GrantMemory(capacity=2)
    a, b, c = ({"type": "scan", "source": name} for name in "abc")
    memory.learn(a, 10)
    memory.learn(b, 20)
    assert memory.floor(a) == 10  # a is now the most recently used
    memory.learn(c, 30)
    assert (memory.floor(a), memory.floor(b), memory.floor(c)) == (10, 0, 30)
    memory.learn(dict(a), 5)  # the latest need replaces the older one (an equal query)
    assert memory.floor(a) == 5
    assert memory.floor({"source": "c", "type": "scan"}) == 30  # keys in any order


def test_an_empty_grant_memory_makes_no_digest_of_the_query() -> None:
    # a warm query's floor costs no JSON and no SHA-256 while nothing was learned:
    # a value JSON cannot write shows whether the query was serialised
    memory = GrantMemory()
    unwritable = {"type": "scan", "source": object()}
    assert memory.floor(unwritable) == 0
    memory.learn({"type": "scan", "source": "a"}, 10)
    with pytest.raises(TypeError):
        memory.floor(unwritable)  # now looked up by its digest
