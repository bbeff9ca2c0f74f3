"""A warm filtered scan: the source-cache entry is read in place (no copy before the
mask), the result is built in the query's own buffers, every pin is let go."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import make_service
from tests.tables._compare import assert_same_rows

from nexus_cache._workers import WORKERS
from nexus_cache.service import Scan


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """edges/day=D/part-0.parquet: 4 partitions of 4,000 rows, ints, floats, strings."""
    root = tmp_path / "edges"
    rng = np.random.default_rng(7)
    for day in range(4):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        n = 4000
        table = pa.table(
            {
                "src": rng.integers(0, 1000, n),
                "w": rng.random(n),
                "kind": pa.array(rng.choice(["a", "bb", "ccc"], n).tolist()),
                "tag": pa.array(rng.choice(["x", "y"], n).tolist()).dictionary_encode(),
            }
        )
        pq.write_table(table, part / "part-0.parquet", row_group_size=1000)
    past = time.time() - 60  # older than local_min_age_s: identity provable
    for path in root.rglob("*.parquet"):
        os.utime(path, (past, past))
    return root


def _reference(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def _spans(arrays: Any) -> list[tuple[int, int]]:
    return [
        (a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes)
        for a in arrays
    ]


def _buffers(table: pa.Table) -> list[tuple[int, int]]:
    out = []
    for column in table.columns:
        for chunk in column.chunks:
            arrays = [chunk, *([chunk.dictionary] if pa.types.is_dictionary(chunk.type) else [])]
            out += [(b.address, b.address + b.size) for a in arrays for b in a.buffers() if b]
    return out


def _resident_spans(service: Any) -> list[tuple[int, int]]:
    """Address ranges of every buffer the device's source cache holds."""
    cache = service.caches.source_cache(0)
    spans = []
    for view in cache.entries():
        handle = cache.checkout(view.key)
        assert handle is not None
        try:
            spans += _spans(handle.value.device_arrays())
        finally:
            handle.release()
    return spans


COLUMNS = ["src", "w", "kind", "tag", "day"]


@pytest.mark.parametrize(
    "flt",
    [
        [("w", "<", 0.3), ("kind", "!=", "bb")],  # rows masked and gathered
        [("day", "in", [1, 2])],  # partitions only: every row of a kept file
    ],
)
def test_a_warm_filtered_scan_shares_no_buffer_with_the_cache_and_releases_its_pins(
    hive: Path, tmp_path: Path, flt: Any
) -> None:
    with make_service(tmp_path) as service:
        service.execute(Scan(str(hive), COLUMNS, filter=[("w", ">", 0.9)]))  # fills the cache
        warm = service.execute(Scan(str(hive), COLUMNS, filter=flt))
        assert warm.diagnostics.source_cache["status"] == "hit"
        resident = _resident_spans(service)
        assert resident
        for start, stop in _buffers(warm.table):
            assert all(stop <= lo or start >= hi for lo, hi in resident), "shares a buffer"
        cache = service.caches.source_cache(0)
        assert [v.pins for v in cache.entries()] == [0] * 4  # every borrow let go
    # the service (and its cache) gone, the result is whole
    assert_same_rows(warm.table, _reference(hive, flt, COLUMNS))


def test_a_warm_filtered_scan_copies_nothing_before_the_mask(hive: Path, tmp_path: Path) -> None:
    """The attempt's budget counts what it allocates: a filter that keeps no row
    of a cached source allocates next to nothing (it used to copy every entry)."""
    with make_service(tmp_path) as service:
        cold = service.execute(Scan(str(hive), ["src", "w"], filter=[("w", ">", 0.5)]))
        warm = service.execute(Scan(str(hive), ["src", "w"], filter=[("w", ">", 2.0)]))
    assert cold.diagnostics.source_cache["status"] == "miss-led"
    assert warm.diagnostics.source_cache["status"] == "hit"
    assert warm.table.num_rows == 0
    assert warm.table.schema.names == ["src", "w"]
    cached = 4 * 4000 * 8 * 2  # src and w of every file (day is not read)
    assert warm.diagnostics.attempts[-1].used_bytes < cached // 8


@pytest.fixture
def big_hive(tmp_path: Path) -> Path:
    """numbers/day=D/part-0.parquet: 4 partitions of 2**18 rows (2**20 in all: a
    query over every partition is large enough for the worker threads)."""
    root = tmp_path / "numbers"
    rng = np.random.default_rng(11)
    n = 1 << 18
    for day in range(4):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        ts = np.arange(day * n, (day + 1) * n, dtype=np.int64)
        w = rng.random(n)
        table = pa.table(
            {
                "src": rng.integers(0, 1 << 40, n),
                "ts": ts,
                "w": pa.array(w, mask=rng.random(n) < 0.01),  # a few nulls
                "ok": w > 0.25,
            }
        )
        pq.write_table(table, part / "part-0.parquet", row_group_size=1 << 16)
    past = time.time() - 60
    for path in root.rglob("*.parquet"):
        os.utime(path, (past, past))
    return root


NUMERIC = ["src", "ts", "w", "ok", "day"]


def _mask_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads each object's mask runs on, from now on."""
    import nexus_cache.tables as tables_package

    names: list[str] = []
    real = tables_package.filter_mask

    def spy(*args: Any, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(tables_package, "filter_mask", spy)
    return names


@pytest.mark.skipif(WORKERS < 2, reason="one core: no worker threads")
def test_a_large_warm_filtered_scan_masks_and_gathers_on_the_worker_threads(
    big_hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter over 2**20 cached rows in 4 objects runs its masks on the shared
    worker threads and its result equals pyarrow.dataset's; a small query stays on
    the caller's thread. The result is one chunk per column, outside the cache, and
    the work domain holds nothing afterwards."""
    flt = [("ts", ">=", 1000), ("ts", "<", (1 << 20) - 77), ("w", ">", 0.4), ("ok", "=", True)]
    with make_service(tmp_path) as service:
        service.execute(Scan(str(big_hive), NUMERIC))  # fills the cache, whole objects
        threads = _mask_threads(monkeypatch)
        warm = service.execute(Scan(str(big_hive), NUMERIC, filter=flt))
        assert warm.diagnostics.source_cache["status"] == "hit"
        assert len(threads) == 4
        assert all(n.startswith("nexus-array") for n in threads)
        threads.clear()
        small = service.execute(Scan(str(big_hive), NUMERIC, filter=[("day", "=", 2), *flt]))
        assert small.diagnostics.source_cache["status"] == "hit"
        assert threads
        assert not any(n.startswith("nexus-array") for n in threads)
        resident = _resident_spans(service)
        for start, stop in _buffers(warm.table):
            assert all(stop <= lo or start >= hi for lo, hi in resident), "shares a buffer"
        assert [v.pins for v in service.caches.source_cache(0).entries()] == [0] * 4
        assert service._work[0].used_bytes() == 0
    assert all(c.num_chunks == 1 for c in warm.table.columns)
    assert_same_rows(warm.table, _reference(big_hive, flt, NUMERIC))
    assert_same_rows(small.table, _reference(big_hive, [("day", "=", 2), *flt], NUMERIC))


def test_a_warm_numeric_filtered_scan_allocates_nothing_in_the_work_domain(
    hive: Path, tmp_path: Path
) -> None:
    """Fixed-width output columns are gathered from the cache entries straight into
    the result's own host memory: no frame of kept rows in the work domain, no copy
    of it afterwards."""
    flt = [("w", "<", 0.3), ("src", ">", 100)]
    with make_service(tmp_path) as service:
        service.execute(Scan(str(hive), ["src", "w", "day"]))
        domain = service._work[0]
        before = domain.counters().allocations
        warm = service.execute(Scan(str(hive), ["src", "w", "day"], filter=flt))
        assert warm.diagnostics.source_cache["status"] == "hit"
        assert domain.counters().allocations == before
        assert warm.diagnostics.table["rows_after_filter"] == warm.table.num_rows > 0
    assert_same_rows(warm.table, _reference(hive, flt, ["src", "w", "day"]))


class _Injected(RuntimeError):
    pass


@pytest.mark.skipif(WORKERS < 2, reason="one core: no worker threads")
def test_a_failure_mid_gather_waits_for_every_task_then_releases_every_pin(
    big_hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One gather task fails while another runs: the query fails with that error only
    once every task has ended (the other still sees its entries pinned), then every
    pin and every byte of the work domain is let go, and the next query is whole."""
    from nexus_cache.frames import gather

    real = gather._take_into
    both = threading.Barrier(2, timeout=10)
    failed = threading.Event()
    calls: list[int] = []
    pinned_after_failure: list[bool] = []
    lock = threading.Lock()

    def take_into(values: Any, indices: Any, xp: Any, out: Any) -> None:
        with lock:
            calls.append(1)
            call = len(calls)
        if call == 1:
            both.wait()  # the second task is running too
            failed.set()
            raise _Injected("gather failed")
        if call == 2:
            both.wait()
            assert failed.wait(10)
            # the caller must not release anything while this task still reads
            time.sleep(0.3)
            pins = [v.pins for v in service.caches.source_cache(0).entries()]
            pinned_after_failure.append(bool(pins) and all(p > 0 for p in pins))
        real(values, indices, xp, out)

    flt = [("w", ">", 0.5)]
    with make_service(tmp_path) as service:
        service.execute(Scan(str(big_hive), NUMERIC))
        monkeypatch.setattr(gather, "_take_into", take_into)
        with pytest.raises(_Injected, match="gather failed"):
            service.execute(Scan(str(big_hive), NUMERIC, filter=flt))
        monkeypatch.setattr(gather, "_take_into", real)
        assert pinned_after_failure == [True]
        assert [v.pins for v in service.caches.source_cache(0).entries()] == [0] * 4
        assert service._work[0].used_bytes() == 0
        again = service.execute(Scan(str(big_hive), NUMERIC, filter=flt))
        assert again.diagnostics.source_cache["status"] == "hit"
    assert_same_rows(again.table, _reference(big_hive, flt, NUMERIC))
