"""Device frames on a real GPU: Arrow round trips, Parquet decode through the
lakehouse with pinned staging, device copies, reads of cache hits and
source-cache hits, on both kinds of CUDA allocation domain (CuPy pool; RMM
where ``rmm`` imports). Nothing may reach CuPy's default memory pool.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frames._tables import assert_same_table, tables
from nexus_cache.frames import (
    DecodeStats,
    DeviceFrame,
    FrameOwner,
    decode_parquet,
    read_parquet,
    read_to_device,
)
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["cupy", "rmm"])
def make_domain(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], Any]:
    """Builds domains of the kind under test (NEXUS_DEVICE_ALLOCATOR set to it)."""
    pytest.importorskip("cupy")
    if request.param == "rmm":
        pytest.importorskip("rmm")
    monkeypatch.setenv("NEXUS_DEVICE_ALLOCATOR", request.param)
    from nexus_cache.backends.cuda import CudaBackend

    backend = CudaBackend()
    assert backend.allocator == request.param

    def make() -> Any:
        return backend.create_domain(0)

    return make


@contextmanager
def no_default_pool() -> Iterator[list[int]]:
    """Fail any allocation that reaches CuPy's default pool, and check the pool did not grow.

    Domains route their thread's allocations with ``using_allocator``, which
    overrides the global allocator set here; anything outside a domain falls
    through to this guard.
    """
    import cupy

    gc.collect()  # garbage of earlier tests must not be freed inside the window
    pool = cupy.get_default_memory_pool()
    used, total = pool.used_bytes(), pool.total_bytes()
    escaped: list[int] = []

    def guard(size: int) -> Any:
        escaped.append(size)
        return pool.malloc(size)

    cupy.cuda.set_allocator(guard)
    try:
        yield escaped
    finally:
        cupy.cuda.set_allocator(pool.malloc)
    assert escaped == [], f"allocations escaped to CuPy's default pool: {escaped}"
    assert pool.used_bytes() <= used
    assert pool.total_bytes() <= total


def _accounted(domain: Any, frame: DeviceFrame) -> None:
    import cupy

    for array in frame.device_arrays():
        assert isinstance(array, cupy.ndarray)
        assert array.device.id == domain.device_id
        assert domain.allocation_bytes(array) >= array.nbytes
    assert domain.counters().used_bytes >= domain.measured_bytes(frame.device_arrays())


def _write(path: Path, table: pa.Table, row_group_size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    past = time.time() - 60
    os.utime(path, (past, past))  # old enough for the lakehouse to trust its identity
    return path


def _sample(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(50)]
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.1),
            "flag": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.05),
            "ts": pa.array(rng.integers(0, 1 << 40, n)).view(pa.timestamp("ns")),
            "name": pa.array([f"n{i}" * (i % 5) for i in range(n)], mask=rng.random(n) < 0.1),
            "cat": pa.array([words[i % 50] for i in range(n)]).dictionary_encode(),
        }
    )


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables())
def test_round_trip_on_the_device(make_domain: Callable[[], Any], table: pa.Table) -> None:
    domain = make_domain()
    with no_default_pool():
        frame = DeviceFrame.from_arrow(table, domain=domain)
        _accounted(domain, frame)
        assert_same_table(frame.to_arrow(), table)
        n = table.num_rows
        assert_same_table(frame.slice(n // 3, n // 2).to_arrow(), table.slice(n // 3, n // 2))
        frame.release()


def test_decode_through_the_lakehouse_with_small_staging_slots(
    make_domain: Callable[[], Any], tmp_path: Path
) -> None:
    source = _write(tmp_path / "src" / "t.parquet", _sample(200_000), row_group_size=30_000)
    domain = make_domain()
    config = LakehouseCacheConfig(
        root=tmp_path / "root", policy="fill_before_read", max_bytes=1 << 30
    )
    with LakehouseCache(config) as cache, no_default_pool():
        for slot_bytes in (4096, 1 << 20):  # many slot turns, then few
            stats = DecodeStats()
            frame = read_parquet(
                str(source),
                domain=domain,
                lake=cache,
                columns=["cat", "name", "x", "flag", "ts"],
                stats=stats,
                slot_bytes=slot_bytes,
                engine="host",  # the host engine's pieces through the slots
            )
            _accounted(domain, frame)
            expected = pq.read_table(source, columns=["cat", "name", "x", "flag", "ts"])
            assert_same_table(frame.to_arrow(), expected)
            assert stats.transfer.h2d_seconds > 0
            assert stats.transfer.h2d_bytes >= frame.nbytes // 2
            frame.release()
        part = decode_parquet(str(source), domain=domain, row_groups=[5, 0], columns=["id"])
        assert part.to_arrow().column("id").to_pylist()[:2] == [150_000, 150_001]


def test_device_copies_compact_slices_and_carry_the_owner(make_domain: Callable[[], Any]) -> None:
    table = _sample(50_000)
    first, second = make_domain(), make_domain()
    released: list[int] = []
    with no_default_pool():
        frame = DeviceFrame.from_arrow(table, domain=first)
        copy = frame.slice(1000, 5000).copy_into(
            second, owner=FrameOwner(lambda: released.append(1))
        )
        _accounted(second, copy)
        assert_same_table(copy.to_arrow(), table.slice(1000, 5000))
        assert int(copy.column("name").offsets[0]) == 0
        projection = copy.select(["cat", "id"])
        copy.release()
        assert released == []
        assert_same_table(projection.to_arrow(), table.slice(1000, 5000).select(["cat", "id"]))
        projection.release()
        assert released == [1]


@pytest.mark.parametrize("use_kvikio", [False, True])
def test_read_to_device_of_a_cache_hit(
    make_domain: Callable[[], Any], tmp_path: Path, use_kvikio: bool
) -> None:
    import cupy

    if use_kvikio:
        pytest.importorskip("kvikio")
    payload = os.urandom(3 << 20)
    source = tmp_path / "src" / "blob.bin"
    source.parent.mkdir()
    source.write_bytes(payload)
    past = time.time() - 60
    os.utime(source, (past, past))
    domain = make_domain()
    config = LakehouseCacheConfig(
        root=tmp_path / "root", policy="fill_before_read", max_bytes=1 << 30
    )
    with LakehouseCache(config) as cache, cache.open(str(source)) as handle, no_default_pool():
        assert handle.is_local
        array = read_to_device(handle, domain=domain, use_kvikio=use_kvikio)
        assert domain.allocation_bytes(array) >= len(payload)
        assert bytes(cupy.asnumpy(array)) == payload


def test_source_cache_hit_is_a_pinned_device_copy(
    make_domain: Callable[[], Any], tmp_path: Path
) -> None:
    from nexus_cache.device import CheckoutStatus, DeviceProfile, DeviceResidentCaches
    from nexus_cache.frames import read_cached_parquet

    source = _write(tmp_path / "src" / "t.parquet", _sample(100_000), row_group_size=20_000)
    config = LakehouseCacheConfig(
        root=tmp_path / "root", policy="fill_before_read", max_bytes=1 << 30
    )
    attempt = make_domain()
    with (
        LakehouseCache(config) as lake,
        DeviceResidentCaches([DeviceProfile(0, 256 << 20)], backend="cuda") as caches,
        no_default_pool(),
    ):
        sub = caches.source_cache(0)
        stats = DecodeStats()
        frame = read_cached_parquet(
            str(source), domain=attempt, source_cache=sub, lake=lake, stats=stats
        )
        assert stats.source.status is CheckoutStatus.LEADER
        assert stats.source.retained
        frame.release()
        stats = DecodeStats()
        frame = read_cached_parquet(
            str(source), domain=attempt, source_cache=sub, lake=lake, stats=stats
        )
        assert stats.source.status is CheckoutStatus.HIT
        _accounted(attempt, frame)
        assert_same_table(frame.to_arrow(), pq.read_table(source))
        part = frame.slice(10, 10)
        frame.release()
        assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes > 0
        part.release()
        assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes == 0
