"""On the host, a cold table read whose every kept row the statistics prove hands its
own decoded fixed-width output columns to the result: the working domain disowns
them (off its books, never in its free blocks), nothing is copied. A warm read of
the cache's entry copies, as does a boolean column (bits in Arrow, bytes in a frame). Results equal
``pyarrow.dataset``'s and outlive the service.

Each data file holds 8 row groups of 100 rows with ``ts`` rising (``day=0``:
0..799, ``day=1``: 1000..1799): ``WINDOW`` keeps day=0's groups 2 and 3 wholly."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.backends import HostBackend, round_allocation
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.service import Scan
from nexus_cache.service._table_filter import scan_table
from nexus_cache.service._table_scan import (
    choose_row_groups,
    decode_table_object,
    needs_no_mask,
    plan_table,
)

ROWS, GROUP = 800, 100
WINDOW = [("ts", ">=", 200), ("ts", "<", 400)]
KEPT = 200  # rows of day=0's groups 2 and 3
#: fixed-width output columns (one with nulls) and a boolean one
COLUMNS = ["src", "n", "ok"]


def _rows(day: int) -> pa.Table:
    rng = np.random.default_rng(day)
    ts = np.arange(1000 * day, 1000 * day + ROWS)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 1 << 40, ROWS), pa.int64()),
            "ts": pa.array(ts, pa.int64()),
            "n": pa.array([None if t % 7 == 0 else float(t) for t in ts], pa.float64()),
            "ok": pa.array(ts % 3 == 0),
            "s": pa.array([f"v{t}" for t in ts]),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    for day in (0, 1):
        (root / f"day={day}").mkdir(parents=True)
        pq.write_table(_rows(day), root / f"day={day}" / "p.parquet", row_group_size=GROUP)
    age_files(root)
    return root


def _dataset(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


def _work(service: Any) -> Any:
    return service._work[0]


def _cache_domain(service: Any) -> Any:
    return service.caches.source_cache(0)._factory.domain


#: the bytes the working domain booked for the handed columns (src, n) of one
#: query: not in its free blocks afterwards
HANDED = 2 * round_allocation(KEPT * 8)


def test_a_cold_proven_read_hands_its_columns_over_and_the_result_outlives_all(
    hive: Path, tmp_path: Path
) -> None:
    want = _dataset(hive, WINDOW, COLUMNS)
    service = make_service(tmp_path / "svc", idle_release_s=60.0)
    try:
        work = _work(service)
        before = work.counters()
        first = service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        after = work.counters()
        assert first.diagnostics.source_cache["status"] == "miss-led"
        assert [e["mask_skipped"] for e in first.diagnostics.table["entries"]] == [True, True]
        assert_same_rows(first.table, want)
        assert after.used_bytes == 0  # the books balance
        booked = after.allocated_bytes - before.allocated_bytes
        kept = after.held_bytes - before.held_bytes
        assert booked - kept == HANDED  # src and n left the books, not to the free blocks
        # queries that allocate and free: the first result is not memory they reuse
        for flt in ([("ts", ">=", 0)], [("ts", "<", 300)], [("day", "=", 1)]):
            for columns in (["src", "n"], ["ts", "src", "s"]):
                other = service.execute(Scan(str(hive), columns, filter=flt))
                assert_same_rows(other.table, _dataset(hive, flt, columns))
        assert work.counters().used_bytes == 0
        assert_same_rows(first.table, want)
    finally:
        service.shutdown()
    del service
    gc.collect()
    junk = [np.frombuffer(pa.allocate_buffer(KEPT * 8), np.uint8) for _ in range(64)]
    for block in junk:
        block.fill(0xAB)
    assert_same_rows(first.table, want)
    assert first.table.column("src").to_pylist() == want.column("src").to_pylist()


def _entry_roots(service: Any) -> list[np.ndarray]:
    """The arrays the source cache's domain books (its entries' allocations)."""
    domain = _cache_domain(service)
    with domain._lock:
        return [r for r in (ref() for ref, _size, _fin in domain._live.values()) if r is not None]


def test_a_cold_read_shares_its_decode_with_the_entry_and_each_lives_on_its_own(
    hive: Path, tmp_path: Path
) -> None:
    want = _dataset(hive, WINDOW, COLUMNS)
    with make_service(tmp_path / "svc", idle_release_s=60.0) as service:
        first = service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        assert first.diagnostics.source_cache["status"] == "miss-led"
        # the entry holds no copy: its arrays are read-only views of the decode the
        # result was handed
        roots = _entry_roots(service)
        for chunk in first.table.column("src").chunks:
            data = np.frombuffer(chunk.buffers()[1], np.uint8)
            (shared,) = [r for r in roots if np.shares_memory(r, data)]
            assert not shared.flags.writeable
            # nor can the result's reader write into the entry through it
            assert not chunk.buffers()[1].is_mutable
            assert not data.flags.writeable
        del roots, shared, data
        # the result gone, the entry still answers: a warm read and another filter
        del first
        gc.collect()
        warm = service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        assert warm.diagnostics.source_cache["status"] == "hit"
        assert_same_rows(warm.table, want)
        narrower = [("ts", ">=", 250), ("ts", "<", 300)]
        other = service.execute(Scan(str(hive), COLUMNS, filter=narrower))
        assert_same_rows(other.table, _dataset(hive, narrower, COLUMNS))
        assert _work(service).counters().used_bytes == 0


def test_a_warm_read_copies_and_never_takes_the_cache_entry(hive: Path, tmp_path: Path) -> None:
    want = _dataset(hive, WINDOW, COLUMNS)
    with make_service(tmp_path / "svc", idle_release_s=60.0) as service:
        service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        cached = _cache_domain(service).used_bytes()
        assert cached > 0
        work = _work(service)
        before = work.counters()
        warm = service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        after = work.counters()
        assert warm.diagnostics.source_cache["status"] == "hit"
        assert_same_rows(warm.table, want)
        # the entry's buffers stay the cache's; nothing of the working domain is handed
        assert _cache_domain(service).used_bytes() == cached
        assert after.used_bytes == 0
        assert after.allocated_bytes - before.allocated_bytes == (
            after.held_bytes - before.held_bytes
        )
        del warm
        gc.collect()
        again = service.execute(Scan(str(hive), COLUMNS, filter=WINDOW))
        assert_same_rows(again.table, want)
        assert _cache_domain(service).used_bytes() == cached


def test_a_failure_after_the_hand_over_leaves_the_books_balanced(
    hive: Path, tmp_path: Path
) -> None:
    """The grant fits the decode, not the result: the attempt fails charging the result
    table, after its columns were handed over; the retry answers."""
    columns = ["src", "n"]
    decoded = KEPT * 8 * 3  # src, ts, n
    with make_service(
        tmp_path / "svc",
        idle_release_s=60.0,
        grant_expansion=1e-9,
        min_grant_bytes=decoded + KEPT * 8,  # not the result's 2 columns on top
    ) as service:
        work = _work(service)
        before = work.counters()
        result = service.execute(Scan(str(hive), columns, filter=WINDOW))
        after = work.counters()
        attempts = result.diagnostics.attempts
        assert [a.outcome for a in attempts] == ["retried", "ok"]
        assert "the result table" in (attempts[0].error or "")
        assert after.used_bytes == 0
        # the first attempt handed src and n over, then failed; the retry read the
        # entry the first one left in the cache (a hit: copied, nothing handed)
        assert result.diagnostics.source_cache["status"] == "hit"
        booked = after.allocated_bytes - before.allocated_bytes
        assert booked - (after.held_bytes - before.held_bytes) == HANDED
        assert service.caches.ledger(0).snapshot().grant_bytes == 0
    assert_same_rows(result.table, _dataset(hive, WINDOW, columns))


def test_scan_table_hands_over_only_its_own_unmasked_fixed_width_columns(
    hive: Path, tmp_path: Path
) -> None:
    """The result's fixed-width chunks are the frame's very buffers, off the domain's
    books; booleans, strings and masked frames are copied."""
    domain = HostBackend(device_total_bytes=1 << 28).create_domain(0)
    config = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0.0)
    with LakehouseCache(config) as cache:
        plan = plan_table(cache, Scan(str(hive), COLUMNS, filter=WINDOW))
        read = plan.table
        assert read is not None
        frames, unmasked = [], []
        for p, f in zip(plan.plans, read.files, strict=True):
            choice = choose_row_groups(cache, p, f, read, [])
            frames.append(
                decode_table_object(
                    cache, p, f, read, domain, [], row_groups=choice.groups, footer=choice.footer
                )
            )
            if choice.opened is not None:
                choice.opened.close()
            unmasked.append(needs_no_mask(choice.groups, choice))
    assert unmasked == [True, True]
    want = _dataset(hive, WINDOW, COLUMNS)
    used = domain.used_bytes()
    masked = scan_table(frames, read, domain, own=True)  # masks run: a gather, a copy
    assert masked is not None
    assert domain.used_bytes() == used
    shared = scan_table(frames, read, domain, unmasked=unmasked)  # not its own: a copy
    assert shared is not None
    assert domain.used_bytes() == used
    addresses = {name: frames[0].column(name).data.ctypes.data for name in ("src", "n", "ok")}
    built = scan_table(frames, read, domain, unmasked=unmasked, own=True)
    assert built is not None
    table = built[0]
    assert isinstance(table, pa.Table)
    for got in (masked[0], shared[0], table):
        assert_same_rows(got, want)
    assert domain.used_bytes() == used - HANDED
    for name in ("src", "n"):
        assert table.column(name).chunk(0).buffers()[1].address == addresses[name]
        assert shared[0].column(name).chunk(0).buffers()[1].address != addresses[name]
    assert table.column("ok").chunk(0).buffers()[1].address != addresses["ok"]
    for frame in frames:
        frame.release()
    gc.collect()
    assert domain.used_bytes() == 0
    domain.close()  # nothing live: the handed buffers are the result's
    assert_same_rows(table, want)
