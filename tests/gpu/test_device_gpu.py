"""The CUDA backend against the real device: measured pool bytes, memory that
really returns to the device, and shutdown back to the starting usage.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nexus_cache.device import DeviceProfile, DeviceResidentCaches, ResidencyState

pytestmark = pytest.mark.gpu

MIB = 1 << 20
# cudaMemGetInfo moves in driver pages; allow a little slack for them.
SLACK = 4 * MIB


@pytest.fixture
def cp() -> Iterator[Any]:
    cupy = pytest.importorskip("cupy")
    cupy.get_default_memory_pool().free_all_blocks()
    yield cupy
    cupy.get_default_memory_pool().free_all_blocks()


def _free(cp: Any) -> int:
    with cp.cuda.Device(0):
        cp.cuda.runtime.deviceSynchronize()
        return int(cp.cuda.runtime.memGetInfo()[0])


def _caches(cap: int = 512 * MIB) -> DeviceResidentCaches:
    return DeviceResidentCaches([DeviceProfile(0, cap)], backend="cuda")


def _publish(caches: DeviceResidentCaches, kind: str, key: str, host: np.ndarray) -> Any:
    sub = caches.source_cache(0) if kind == "source" else caches.graph_cache(0)
    entry = sub.reserve(key, host.nbytes)
    device_array = sub.factory.domain.copy_in(host)
    entry.attach({"column": device_array}, [device_array])
    del device_array
    return sub.publish(entry)


def _exercise(cp: Any) -> None:
    """One full cycle, so lazily loaded CUDA modules are in place before baselines."""
    caches = _caches()
    _publish(caches, "source", "warm", np.arange(1000, dtype=np.uint8))
    stream = cp.cuda.Stream(non_blocking=True)
    with caches.source_cache(0).checkout("warm") as pin, stream:
        int(pin.value["column"].sum())
        int(cp.asnumpy(pin.value["column"][:1])[0])
    stream.synchronize()
    assert all(r.complete for r in caches.shutdown())
    cp.get_default_memory_pool().free_all_blocks()


def test_backend_is_cuda_with_real_memory_info(cp: Any) -> None:
    caches = _caches()
    info = caches.backend.mem_info(0)
    total = cp.cuda.runtime.memGetInfo()[1]
    assert info.total_bytes == total
    assert caches.ledger(0).managed_capacity_bytes == int(total * 0.9)
    assert caches.backend.xp is cp
    caches.shutdown()


def test_pool_bytes_match_the_ledger_after_reconcile(cp: Any) -> None:
    caches = _caches()
    host = np.random.default_rng(0).integers(0, 255, 1_000_003, dtype=np.uint8)
    entry = _publish(caches, "source", "k", host)
    domain = caches.factory(0).domain
    counters = domain.counters()
    snap = caches.ledger(0).snapshot()
    assert entry.nbytes == 1_000_448  # CuPy's 512-byte rounding, measured, not assumed
    assert snap.cache_evictable_resident_bytes == entry.nbytes
    assert counters.used_bytes == entry.nbytes
    assert caches.device_cache_reports()[0].drift_bytes == 0
    with caches.source_cache(0).checkout("k") as pin:
        assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes == entry.nbytes
        assert cp.asnumpy(pin.value["column"]).tobytes() == host.tobytes()
    assert all(r.complete for r in caches.shutdown())


def test_allocations_outside_a_scope_do_not_land_in_the_domain(cp: Any) -> None:
    caches = _caches()
    domain = caches.factory(0).domain
    outside: list[Any] = []
    with domain.scope() as scope:
        inside = cp.empty(10_000, dtype=cp.uint8)
        worker = threading.Thread(target=lambda: outside.append(cp.empty(5 * MIB, cp.uint8)))
        worker.start()
        worker.join()
    assert scope.allocated_bytes == 10_240
    assert domain.counters().used_bytes == 10_240
    assert domain.allocation_bytes(inside) == 10_240
    outside.clear()
    del inside
    assert domain.counters().used_bytes == 0
    assert all(r.complete for r in caches.shutdown())


def test_eviction_really_returns_memory_to_the_device(cp: Any) -> None:
    _exercise(cp)
    caches = _caches(cap=512 * MIB)
    size = 256 * MIB
    _publish(caches, "source", "big", np.zeros(size, dtype=np.uint8))
    held = _free(cp)
    freed = caches.ledger(0).reclaim(size)
    assert freed == size
    assert caches.source_cache(0).checkout("big") is None
    after = _free(cp)
    assert after - held >= size - SLACK  # the pool gave the blocks back to the driver
    assert caches.factory(0).counters().held_bytes == 0
    assert all(r.complete for r in caches.shutdown())


def test_grant_admission_evicts_and_device_memory_follows(cp: Any) -> None:
    _exercise(cp)
    total = cp.cuda.runtime.memGetInfo()[1]
    capacity = 1024 * MIB
    caches = DeviceResidentCaches([DeviceProfile(0, 512 * MIB, capacity)], backend="cuda")
    assert capacity < total
    _publish(caches, "source", "old", np.zeros(384 * MIB, dtype=np.uint8))
    before = _free(cp)
    grant = caches.ledger(0).admit_grant("attempt", 768 * MIB)
    assert caches.source_cache(0).stats().evictions == 1
    assert _free(cp) - before >= 384 * MIB - SLACK
    caches.ledger(0).release_grant(grant)
    assert all(r.complete for r in caches.shutdown())


def test_drain_and_shutdown_return_the_device_to_its_starting_usage(cp: Any) -> None:
    _exercise(cp)
    start = _free(cp)
    caches = _caches()
    for i in range(4):
        _publish(caches, "source", f"s{i}", np.full(16 * MIB, i, dtype=np.uint8))
        _publish(caches, "graph", f"g{i}", np.full(8 * MIB + 3, i, dtype=np.uint8))
    stream = cp.cuda.Stream(non_blocking=True)
    pin = caches.graph_cache(0).checkout("g1")
    with stream:
        total = int(pin.value["column"].sum())
    pin.entry.record_stream(stream)
    pin.release()
    assert total == 8 * MIB + 3
    assert start - _free(cp) >= 4 * (16 + 8) * MIB - SLACK
    results = caches.shutdown(timeout=30)
    assert all(r.complete for r in results)
    assert results[0].graph.destroyed == 4
    assert results[0].source.destroyed == 4
    assert pin.entry.state is ResidencyState.DESTROYED
    cp.get_default_memory_pool().free_all_blocks()
    assert abs(_free(cp) - start) <= SLACK
    report = caches.device_cache_reports()[0]
    assert report.ledger.cache_charged_bytes == 0
    assert report.domain.used_bytes == 0
    assert report.domain.held_bytes == 0
