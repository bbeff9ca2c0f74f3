"""``QueryService.execute_on_device``: a scan's result that stays in device memory.

On the host backend the result's columns are NumPy arrays of the service's
working domain. Each test checks one guarantee of docs/service.md ("Results in
device memory"): the rows equal ``execute``'s and pyarrow.dataset's, the grant
stays booked until release, the result shares no buffer with a cache entry,
failures and cancellation leave nothing booked, a forgotten result is released
with a ResourceWarning, shutdown waits for results and then reports them, and
the fingerprint equals ``execute``'s.
"""

from __future__ import annotations

import copy
import gc
import json
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_lake, make_service, write_year_month_hive
from tests.tables._compare import assert_same_rows

import nexus_cache.service._attempt as attempt_module
from nexus_cache.errors import ConfigError, LifecycleError, QueryCancelledError
from nexus_cache.service import (
    Count,
    DeviceQueryResult,
    GraphQuery,
    QueryService,
    Scan,
    table_fingerprint,
)


def _edges(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "dst": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array([None if i % 7 == 0 else float(v) for i, v in enumerate(rng.random(n))]),
            "ok": pa.array(rng.random(n) < 0.5),
            "kind": pa.array(rng.choice(["follow", "like", "block"], n).tolist(), pa.string()),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """edges/year=Y/month=M/part-0.parquet: two int partition levels, 6 objects."""
    return write_year_month_hive(tmp_path / "edges", lambda n: _edges(300, n), 100)


def _dataset(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def _booked(service: QueryService) -> tuple[int, int, int]:
    """Grants in the ledger (count, bytes) and live bytes of the working domain."""
    snap = service.caches.ledger(0).snapshot()
    return snap.grant_count, snap.grant_bytes, service._work[0].used_bytes()


FILTERS: list[Any] = [
    [("year", "=", 2025), ("w", "<", 0.5)],
    [("month", "in", [1, 3]), ("src", ">=", 10), ("ok", "=", True)],
    [[("w", ">=", 0.9)], [("dst", "<", 4), ("year", "!=", 2024)]],
    [("src", ">", 1000)],  # keeps no row
]


@pytest.mark.parametrize("flt", FILTERS)
@pytest.mark.parametrize(
    "columns",
    [["src", "dst", "w", "ok", "year"], ["src", "kind", "month"]],  # one-pass gather; strings
)
def test_hive_device_results_equal_execute_and_pyarrow_dataset(
    hive: Path, tmp_path: Path, flt: Any, columns: list[str]
) -> None:
    scan = Scan(str(hive), columns=columns, filter=flt)
    want = _dataset(hive, flt, columns)
    with make_service(tmp_path) as service:
        host = service.execute(scan)
        with service.execute_on_device(scan) as result:
            assert isinstance(result, DeviceQueryResult)
            frame = result.frame
            assert frame.domain is service._work[0]  # the attempt's working domain
            assert all(isinstance(c.data, np.ndarray) for c in frame.columns)
            got = result.to_arrow()
            assert result.diagnostics.rows == frame.num_rows == want.num_rows
            status = result.diagnostics.source_cache["status"]
            assert status == ("hit" if want.num_rows else "none")  # after execute
            assert result.diagnostics.table["rows_after_filter"] == want.num_rows
    assert got.equals(host.table)
    assert_same_rows(got, want)


def test_delta_device_results_equal_execute_and_pyarrow_dataset(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "delta"
    for part in range(3):
        batch = _edges(200, part).append_column("day", pa.array([part] * 200, pa.int32()))
        deltalake.write_deltalake(str(table), batch, mode="append", partition_by=["day"])
    age_files(table)
    reference = deltalake.DeltaTable(str(table)).to_pyarrow_dataset()
    with make_service(tmp_path) as service:
        for flt in ([("day", "in", [0, 2]), ("w", ">", 0.3)], [("src", "<", 20)]):
            columns = ["src", "dst", "w", "day"]
            scan = Scan(str(table), columns=columns, filter=flt)
            want = reference.to_table(columns=columns, filter=pq.filters_to_expression(flt))
            with service.execute_on_device(scan) as result:
                assert result.diagnostics.table["kind"] == "delta"
                got = result.to_arrow()
            assert got.equals(service.execute(scan).table)
            assert_same_rows(got, want)


def test_plain_scans_of_one_object_and_of_a_directory_equal_execute(tmp_path: Path) -> None:
    """Not a table read: one object's frame copied, several objects gathered whole,
    string columns combined as Arrow first."""
    lake = make_lake(tmp_path)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(3):
        pq.write_table(_edges(100, i), parts / f"p{i}.parquet")
    age_files(parts)
    with make_service(tmp_path) as service:
        for scan in (
            Scan(lake.facts),
            Scan(str(parts), columns=["src", "w", "ok"]),
            Scan(str(parts)),
        ):
            want = service.execute(scan).table
            with service.execute_on_device(scan) as result:
                assert result.to_arrow().equals(want)
        assert _booked(service) == (0, 0, 0)


def test_the_grant_stays_booked_until_the_result_and_its_derived_frames_are_released(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path) as service:
        result = service.execute_on_device(scan)
        grant = result.diagnostics.attempts[-1].grant_bytes
        count, nbytes, live = _booked(service)
        assert (count, nbytes) == (1, grant)  # admission and the ledger see it
        assert live >= result.frame.nbytes > 0
        part = result.frame.select(["w"]).slice(0, 10)  # derived: shares the buffers
        result.release()
        result.release()  # idempotent
        assert result.released
        assert _booked(service)[:2] == (1, grant)  # the derived frame still needs it
        assert part.to_arrow().num_rows == 10
        part.release()
        del part
        assert _booked(service) == (0, 0, 0)
        with pytest.raises(LifecycleError, match="released"):
            result.frame  # noqa: B018


def test_the_result_shares_no_buffer_with_the_cache_entry(hive: Path, tmp_path: Path) -> None:
    """Borrowed hits (a filter that keeps every row included) and copied hits: once
    every entry is evicted, the cache domain holds nothing and the result is intact."""
    columns = ["src", "dst", "w", "ok", "kind", "year"]
    numbers = ["src", "dst", "w", "ok", "year"]
    with make_service(tmp_path) as service:
        service.execute(Scan(str(hive), columns=columns))  # fills the source cache
        service.execute(Scan(str(hive), columns=numbers))
        service.execute(Scan(str(hive / "year=2024" / "month=1" / "part-0.parquet")))
        every_row = [("year", ">=", 2000)]
        scans = [
            Scan(str(hive), columns=numbers, filter=[("w", "<", 0.5)]),  # gathered
            Scan(str(hive), columns=numbers, filter=every_row),
            Scan(str(hive), columns=columns, filter=[("w", "<", 0.5)]),  # strings: per object
            Scan(str(hive), columns=columns, filter=every_row),
            # one object, every row: its entry's frame is the only source
            Scan(str(hive), columns=columns, filter=[("year", "=", 2024), ("month", "=", 1)]),
            Scan(str(hive / "year=2024" / "month=1" / "part-0.parquet")),  # a plain scan
        ]
        wants = [service.execute(s).table for s in scans]  # every entry resident
        results = [service.execute_on_device(s) for s in scans]
        assert [r.diagnostics.source_cache["status"] for r in results] == ["hit"] * 6
        ledger = service.caches.ledger(0)
        assert ledger.snapshot().cache_evictable_resident_bytes > 0
        ledger.reclaim(1 << 40)  # evict every entry
        gc.collect()
        report = service.device_cache_reports()[0]
        assert report.ledger.cache_charged_bytes == 0
        assert report.domain is not None
        assert report.domain.used_bytes == 0  # no result keeps an entry's buffer alive
        for result, want in zip(results, wants, strict=True):
            assert result.to_arrow().equals(want)
            result.release()
        assert _booked(service) == (0, 0, 0)


def test_a_failure_after_the_result_was_built_releases_it_and_the_grant(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the attempt's evidence is sealed (the result is built, its
    fingerprint being computed): the frame, its share of the domain and the grant
    go back before the interrupt propagates."""

    def interrupted(table: pa.Table) -> str:
        raise KeyboardInterrupt

    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    service = make_service(tmp_path)
    try:
        monkeypatch.setattr("nexus_cache.service._runner.table_fingerprint", interrupted)
        with pytest.raises(KeyboardInterrupt):
            service.execute_on_device(scan)
        gc.collect()
        assert _booked(service) == (0, 0, 0)
        assert service._work.borrowers(0) == 0
    finally:
        shutdown = service.shutdown(timeout=5.0)
    assert all(d.complete for d in shutdown)


def test_a_query_cancelled_mid_decode_leaves_nothing_booked(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancel = threading.Event()
    real = attempt_module.decode_table_object

    def decode_then_cancel(*args: Any, **kwargs: Any) -> Any:
        frame = real(*args, **kwargs)
        cancel.set()  # the caller goes away after the first object
        return frame

    monkeypatch.setattr(attempt_module, "decode_table_object", decode_then_cancel)
    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path) as service:
        with pytest.raises(QueryCancelledError, match="was cancelled while"):
            service.execute_on_device(scan, cancel=cancel, query_id="cancel-me")
        gc.collect()
        assert _booked(service) == (0, 0, 0)
        log = service.admission_log.path.read_text()
        assert "cancel-me-1\t" in log
        assert "\tcancelled\t" in log


def test_an_exhausted_grant_is_retried_and_only_the_last_result_stays_booked(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "dst", "w"], filter=[("w", ">=", 0.0)])
    small = {"grant_expansion": 0.01, "min_grant_bytes": 4096, "max_attempts": 8}
    with make_service(tmp_path, **small) as service:
        with service.execute_on_device(scan) as result:
            outcomes = [a.outcome for a in result.diagnostics.attempts]
            assert outcomes[0] == "retried"
            assert outcomes[-1] == "ok"
            assert _booked(service)[:2] == (1, result.diagnostics.attempts[-1].grant_bytes)
            got = result.to_arrow()
        assert got.equals(service.execute(scan).table)
        assert _booked(service) == (0, 0, 0)


def test_a_forgotten_result_is_released_by_its_finalizer_with_a_resource_warning(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path) as service:
        result = service.execute_on_device(scan, query_id="forgotten")
        assert _booked(service)[0] == 1
        with pytest.warns(ResourceWarning, match="query forgotten was dropped without release"):
            del result  # its last reference: collected at once
        assert _booked(service) == (0, 0, 0)


def test_shutdown_waits_for_a_result_released_within_its_timeout(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    service = make_service(tmp_path)
    result = service.execute_on_device(scan)
    releaser = threading.Timer(0.2, result.release)
    releaser.start()
    started = time.monotonic()
    shutdown = service.shutdown(timeout=30.0)
    releaser.join()
    assert time.monotonic() - started < 20  # it did not wait out its timeout
    assert all(d.complete for d in shutdown)
    assert service._work[0].closed


def test_shutdown_reports_an_unreleased_result_and_keeps_its_memory(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w"], filter=[("w", "<", 0.5)])
    service = make_service(tmp_path)
    result = service.execute_on_device(scan, query_id="kept")
    want = service.execute(scan).table
    shutdown = service.shutdown(timeout=0.1)
    (device,) = shutdown
    assert not device.complete
    assert device.problem is not None
    assert "1 device result(s) still held (queries kept)" in device.problem
    assert "result.release()" in device.problem
    assert not service._work[0].closed  # no memory freed under a live result
    assert _booked(service)[:2] == (1, result.diagnostics.attempts[-1].grant_bytes)
    assert result.to_arrow().equals(want)  # still readable
    with pytest.raises(LifecycleError, match="shut down"):
        service.execute_on_device(scan)
    result.release()
    assert _booked(service) == (0, 0, 0)
    again = service.shutdown(timeout=5.0)
    assert all(d.complete for d in again)
    assert service._work[0].closed
    assert service.shutdown() is again


def test_the_fingerprint_with_evidence_is_recorded_before_the_call_returns(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w", "year"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path) as service:
        want = service.execute(scan).diagnostics.result_fingerprint
        result = service.execute_on_device(scan, query_id="recorded")
        result.release()
        assert result.diagnostics.result_fingerprint == want  # read after release: kept
    (doc,) = [
        json.loads(p.read_text()) for p in (tmp_path / "evidence").glob("attempt-recorded-*")
    ]
    assert doc["result"]["fingerprint"] == want
    assert doc["outcome"] == "ok"


def test_the_deferred_fingerprint_equals_executes_and_raises_after_release(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src", "w", "year"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path, evidence_dir=None) as service:
        want = service.execute(scan).diagnostics.result_fingerprint
        with service.execute_on_device(scan) as read:
            assert read.diagnostics.result_fingerprint == want
        assert read.diagnostics.result_fingerprint == want  # kept once read
        unread = service.execute_on_device(scan)
        unread.release()
        with pytest.raises(LifecycleError, match=r"before release\(\), or set evidence_dir"):
            unread.diagnostics.result_fingerprint  # noqa: B018
        assert unread.diagnostics.to_dict(fingerprint=False)["result_fingerprint"] is None


@pytest.mark.parametrize("kind", ["count", "graph"])
def test_other_query_kinds_are_refused_naming_what_is_supported(tmp_path: Path, kind: str) -> None:
    lake = make_lake(tmp_path)
    query = (
        Count(lake.edges)
        if kind == "count"
        else GraphQuery(Scan(lake.edges), "src", "dst", "pagerank")
    )
    with make_service(tmp_path) as service:
        with pytest.raises(ConfigError, match=f"Scan queries only, not a {kind} query"):
            service.execute_on_device(query)
        assert _booked(service) == (0, 0, 0)


@pytest.mark.parametrize("evidence", [True, False], ids=["evidence", "deferred"])
@pytest.mark.parametrize("flt", [[("n", ">", 100)], [("n", "=", 1)]], ids=["empty", "one-row"])
def test_the_fingerprint_of_a_dictionary_result_is_the_one_of_its_table_and_executes(
    tmp_path: Path, evidence: bool, flt: Any
) -> None:
    """From a warm source cache, an empty device result keeps a dictionary column's
    dictionary where its host copy and execute's table do not: the fingerprint is of
    the values, so every path gives the same."""
    data = tmp_path / "data"
    data.mkdir()
    codes = pa.array(["x", "y", "x", None, "y"]).dictionary_encode()
    pq.write_table(pa.table({"d": codes, "n": [1, None, 3, 4, None]}), data / "a.parquet")
    age_files(data)
    scan = Scan(str(data / "a.parquet"), columns=["d", "n"], filter=flt)
    overrides = {} if evidence else {"evidence_dir": None}
    with make_service(tmp_path, **overrides) as service:
        service.execute(Scan(scan.source, columns=["d"], filter=[("n", "=", 3)]))  # warm
        with service.execute_on_device(scan) as result:
            table = result.to_arrow()
            digest = result.diagnostics.result_fingerprint
        executed = service.execute(scan)
    assert table.equals(executed.table)
    assert digest == table_fingerprint(table) == executed.diagnostics.result_fingerprint


def test_diagnostics_whose_fingerprint_was_released_unread_still_print_and_copy(
    hive: Path, tmp_path: Path
) -> None:
    from nexus_cache.backends import HostBackend
    from nexus_cache.cluster.client import ClusterDiagnostics
    from nexus_cache.frames import DeviceFrame
    from nexus_cache.service.result import defer_device_fingerprint

    scan = Scan(str(hive), columns=["src"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path, evidence_dir=None) as service:
        result = service.execute_on_device(scan)
        result.release()
    domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
    frame = DeviceFrame.from_arrow(pa.table({"x": [1, 2]}), domain=domain)
    cluster = ClusterDiagnostics("q", {}, 0, (), {}, {}, {}, {}, 2, "", worker="tcp://w:1")
    defer_device_fingerprint(cluster, frame)
    frame.release()
    for diagnostics in (result.diagnostics, cluster):
        shown = repr(diagnostics)
        assert shown.startswith(f"{type(diagnostics).__name__}(query_id=")
        assert "result_fingerprint=<released before it was read>" in shown
        assert str(diagnostics) == shown
        for copied in (copy.copy(diagnostics), copy.deepcopy(diagnostics)):
            assert type(copied) is type(diagnostics)
            assert copied.rows == diagnostics.rows
            assert copied.to_dict(fingerprint=False) == diagnostics.to_dict(fingerprint=False)
            with pytest.raises(LifecycleError, match="released before its result_fingerprint"):
                copied.result_fingerprint  # noqa: B018
    assert "worker='tcp://w:1'" in repr(cluster)


def test_a_copy_of_unread_diagnostics_reads_the_same_fingerprint(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path, evidence_dir=None) as service:
        want = service.execute(scan).diagnostics.result_fingerprint
        with service.execute_on_device(scan) as result:
            shallow, deep = copy.copy(result.diagnostics), copy.deepcopy(result.diagnostics)
            assert shallow.result_fingerprint == want
        assert deep.result_fingerprint == want  # computed once, shared by the copies
        assert result.diagnostics.result_fingerprint == want


def test_a_result_refuses_pickle_and_copy_naming_what_to_pickle(
    hive: Path, tmp_path: Path
) -> None:
    scan = Scan(str(hive), columns=["src"], filter=[("w", "<", 0.5)])
    with make_service(tmp_path) as service:
        with service.execute_on_device(scan) as result:
            for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=r"pickle result.to_arrow\(\) and result.diag"):
                    attempt(result)
            want = result.to_arrow()
            # its diagnostics and its host copy do pickle
            assert pickle.loads(pickle.dumps(result.diagnostics)) == result.diagnostics
            assert pickle.loads(pickle.dumps(want)).equals(want)
        assert _booked(service) == (0, 0, 0)
