"""Device frames in the decoded source cache (host backend): a frame is a
``DeviceValue``; ``read_cached_parquet`` decodes once per key, hits copy into
the caller's domain, and the pin lives until the last derived frame goes."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.device import CheckoutStatus, DeviceProfile, DeviceResidentCaches, DeviceValue
from nexus_cache.frames import DecodeStats, DeviceFrame, read_cached_parquet
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

from ._tables import assert_same_table

MIB = 1 << 20


@pytest.fixture
def setup(tmp_path: Path):
    n = 20_000
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "s": pa.array([f"row-{i}" for i in range(n)], mask=np.arange(n) % 9 == 0),
            "cat": pa.array([f"c{i % 7}" for i in range(n)]).dictionary_encode(),
        }
    )
    source = tmp_path / "src" / "t.parquet"
    source.parent.mkdir()
    pq.write_table(table, source, row_group_size=5000)
    past = time.time() - 60
    os.utime(source, (past, past))
    backend = HostBackend(device_total_bytes=64 * MIB)
    caches = DeviceResidentCaches([DeviceProfile(0, 8 * MIB, 32 * MIB)], backend=backend)
    lake = LakehouseCache(
        LakehouseCacheConfig(root=tmp_path / "root", policy="fill_before_read", max_bytes=MIB << 6)
    )
    yield str(source), caches, lake, backend
    lake.close()
    caches.shutdown()


def _pinned(caches: DeviceResidentCaches) -> tuple[int, int]:
    snap = caches.ledger(0).snapshot()
    return snap.cache_pinned_in_use_bytes, snap.cache_evictable_resident_bytes


def test_a_frame_is_a_device_value() -> None:
    domain = HostBackend(device_total_bytes=MIB).create_domain(0)
    frame = DeviceFrame.from_arrow(pa.table({"a": [1, 2]}), domain=domain)
    assert isinstance(frame, DeviceValue)
    other = HostBackend(device_total_bytes=MIB).create_domain(0)
    copy = frame.copy_into(other)
    assert all(other.allocation_bytes(a) for a in copy.device_arrays())


def test_decode_once_then_hits_carry_the_pin_through_derived_frames(setup) -> None:
    source, caches, lake, backend = setup
    sub = caches.source_cache(0)
    attempt = backend.create_domain(0)
    cols = ["cat", "s"]

    first = DecodeStats()
    frame = read_cached_parquet(
        source, domain=attempt, source_cache=sub, lake=lake, columns=cols, stats=first
    )
    assert first.source.status is CheckoutStatus.LEADER
    assert first.source.retained
    pinned, evictable = _pinned(caches)
    assert pinned == 0
    assert evictable > 0  # retained, unpinned
    frame.release()

    hit = DecodeStats()
    frame = read_cached_parquet(
        source, domain=attempt, source_cache=sub, lake=lake, columns=cols, stats=hit
    )
    assert hit.source.status is CheckoutStatus.HIT
    assert hit.row_groups == 0  # nothing decoded
    assert frame.domain is attempt
    assert_same_table(frame.to_arrow(), pq.read_table(source, columns=cols))
    assert _pinned(caches) == (evictable, 0)

    part = frame.slice(100, 50).select(["s"])
    frame.release()
    assert _pinned(caches) == (evictable, 0)  # the slice still holds the pin
    assert part.to_arrow().column("s").to_pylist()[0] == "row-100"
    part.release()
    assert _pinned(caches) == (0, evictable)


def test_concurrent_cold_callers_decode_once(setup) -> None:
    source, caches, lake, backend = setup
    sub = caches.source_cache(0)
    barrier = threading.Barrier(8)
    statuses: list[CheckoutStatus] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            domain = backend.create_domain(0)
            stats = DecodeStats()
            barrier.wait()
            frame = read_cached_parquet(
                source, domain=domain, source_cache=sub, lake=lake, columns=["id"], stats=stats
            )
            assert frame.to_arrow().column("id").to_pylist()[-1] == 19_999
            statuses.append(stats.source.status)
            frame.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert statuses.count(CheckoutStatus.LEADER) == 1
    assert len(statuses) == 8


def test_empty_chunks_and_unvouched_sources_never_touch_the_cache(setup, tmp_path: Path) -> None:
    source, caches, lake, backend = setup
    sub = caches.source_cache(0)
    attempt = backend.create_domain(0)
    before = sub.stats()

    stats = DecodeStats()
    frame = read_cached_parquet(
        source, domain=attempt, source_cache=sub, lake=lake, row_groups=[], stats=stats
    )
    assert frame.num_rows == 0
    assert stats.source.status is CheckoutStatus.BYPASS

    fresh = tmp_path / "fresh.parquet"  # just written: the lakehouse does not vouch for it
    pq.write_table(pa.table({"a": [1, 2, 3]}), fresh)
    stats = DecodeStats()
    frame = read_cached_parquet(
        str(fresh), domain=attempt, source_cache=sub, lake=lake, stats=stats
    )
    assert frame.to_arrow().column("a").to_pylist() == [1, 2, 3]
    assert stats.source is None
    assert sub.stats() == before
    frame.release()
    gc.collect()


@pytest.mark.parametrize("first", [[], None])
def test_no_columns_and_all_columns_are_different_reads(setup, first) -> None:
    """``columns=[]`` (no column) and ``columns=None`` (all) both keyed as ``()``:
    whichever came first was served to the other, a frame of no columns for
    "all" or every column for "none"."""
    source, caches, lake, backend = setup
    sub = caches.source_cache(0)
    attempt = backend.create_domain(0)
    expected = {None: pq.read_table(source).column_names, (): []}
    for columns in (first, [] if first is None else None):
        stats = DecodeStats()
        frame = read_cached_parquet(
            source, domain=attempt, source_cache=sub, lake=lake, columns=columns, stats=stats
        )
        assert frame.num_rows == 20_000
        assert frame.column_names == expected[None if columns is None else ()]
        if columns == []:  # nothing to cache
            assert stats.source.status is CheckoutStatus.BYPASS
        frame.release()
    gc.collect()
