"""The CUDA backend against the real device, on both domain kinds (a CuPy pool
and, where rmm-cu13 is installed, an RMM pool under limiting and statistics
adaptors): the domain contract, measured pool bytes, memory that really
returns to the device, shutdown back to the starting usage, and the source
cache's single flight, capacity and pins.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nexus_cache.device import DeviceProfile, DeviceResidentCaches, ResidencyState

pytestmark = pytest.mark.gpu


def _load_device_tests_module(name: str) -> Any:
    # tests/gpu is not a package: load the shared device-test modules by path.
    path = Path(__file__).resolve().parents[1] / "device" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"nexus_device_tests{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONTRACT = _load_device_tests_module("_domain_contract").CONTRACT
InterruptedCopy = _load_device_tests_module("_helpers").InterruptedCopy

MIB = 1 << 20
# cudaMemGetInfo moves in driver pages; allow a little slack for them.
SLACK = 4 * MIB


@pytest.fixture(params=["cupy", "rmm"])
def cp(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """CuPy, with NEXUS_DEVICE_ALLOCATOR set to the domain kind under test."""
    cupy = pytest.importorskip("cupy")
    if request.param == "rmm":
        pytest.importorskip("rmm")
    monkeypatch.setenv("NEXUS_DEVICE_ALLOCATOR", request.param)
    cupy.get_default_memory_pool().free_all_blocks()
    yield cupy
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("check", CONTRACT, ids=lambda c: c.__name__)
def test_cuda_domain_contract(cp: Any, check: Any) -> None:
    from nexus_cache.backends.cuda import CudaBackend

    check(CudaBackend())


def test_domain_kind_follows_the_setting(cp: Any) -> None:
    import os

    from nexus_cache.backends.cuda import CudaBackend

    backend = CudaBackend()
    assert backend.allocator == os.environ["NEXUS_DEVICE_ALLOCATOR"]
    caches = _caches(cap=64 * MIB)
    domain = caches.factory(0).domain
    assert domain.limit_bytes == 64 * MIB
    assert domain.enforces_limit == (backend.allocator == "rmm")
    caches.shutdown()


def test_the_cuda_backend_and_its_domains_answer_as_device_memory(cp: Any) -> None:
    from nexus_cache.backends.cuda import CudaBackend
    from nexus_cache.backends.kinds import CUDA
    from nexus_cache.frames import open_transfer

    backend = CudaBackend()
    assert backend.kind is CUDA
    assert backend.name == "cuda"
    last = backend.device_count() - 1
    with backend.device_scope(last):
        assert cp.cuda.Device().id == last
    domain = backend.create_domain(0)
    assert domain.kind is CUDA
    assert domain.host_memory is False
    transfer = open_transfer(domain)  # device memory: the pinned staging path
    try:
        assert transfer.host_memory is False
        dst = domain.empty(8, np.uint8)
        transfer.to_device(np.arange(8, dtype=np.uint8), dst)
        transfer.finish()
        assert dst.get().tolist() == list(range(8))
    finally:
        transfer.close()
    del dst
    domain.close()


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


# -- the source cache on the device -------------------------------------------------------


def _key(name: str, **flags: Any) -> Any:
    from nexus_cache.device import SourceFrameKey

    return SourceFrameKey(("lakehouse", "local", name, "etag"), ("a", "b"), (0,), **flags)


def _decoder(domain: Any, nbytes: int, calls: list[int]) -> Any:
    from nexus_cache.device import ArrayBundle

    def decode() -> Any:
        calls.append(1)
        host = np.arange(nbytes, dtype=np.uint8)
        return ArrayBundle({"a": domain.copy_in(host), "b": domain.copy_in(host[::-1].copy())})

    return decode


def test_source_cache_single_flight_and_pins_on_the_device(cp: Any) -> None:
    from nexus_cache.device import CheckoutStatus

    caches = _caches(cap=256 * MIB)
    source = caches.source_cache(0)
    attempt = caches.backend.create_domain(0)
    calls: list[int] = []
    decode = _decoder(attempt, 8 * MIB, calls)
    start = threading.Barrier(16)
    results: list[Any] = []

    def run() -> None:
        start.wait()
        results.append(source.get_or_decode(_key("t"), decode, domain=attempt, timeout=60))

    threads = [threading.Thread(target=run) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(calls) == 1
    assert len(results) == 16
    assert [r.status for r in results].count(CheckoutStatus.LEADER) == 1
    expected = np.arange(8 * MIB, dtype=np.uint8)
    for result in results:
        assert cp.asnumpy(result.value["a"]).tobytes() == expected.tobytes()
        # every follower's copy lives in the caller's domain, not the cache's
        assert attempt.allocation_bytes(result.value["a"]) == 8 * MIB
    entry_bytes = 2 * 8 * MIB
    snap = caches.ledger(0).snapshot()
    assert snap.cache_pinned_in_use_bytes == entry_bytes
    report = caches.device_cache_reports()[0]
    assert report.domain.used_bytes == entry_bytes  # the measured allocation, no drift
    assert report.drift_bytes == 0
    hit = results[1] if results[0].status is CheckoutStatus.LEADER else results[0]
    derived = hit.derive(hit.value.slice(0, 10))
    for result in results:
        result.release()
    assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes == entry_bytes
    derived.release()
    snap = caches.ledger(0).snapshot()
    assert (snap.cache_evictable_resident_bytes, snap.cache_pinned_in_use_bytes) == (
        entry_bytes,
        0,
    )
    results.clear()
    assert all(r.complete for r in caches.shutdown(timeout=30))


def test_source_cache_skips_what_does_not_fit_and_bypass_touches_nothing(cp: Any) -> None:
    from nexus_cache.device import CheckoutStatus

    caches = _caches(cap=16 * MIB)
    source = caches.source_cache(0)
    attempt = caches.backend.create_domain(0)
    calls: list[int] = []
    with source.get_or_decode(
        _key("big"), _decoder(attempt, 12 * MIB, calls), domain=attempt
    ) as result:
        assert result.diagnostics.retained is False
        assert cp.asnumpy(result.value["a"][:3]).tolist() == [0, 1, 2]
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    assert caches.factory(0).counters().used_bytes == 0
    before = caches.factory(0).counters()
    with source.get_or_decode(
        _key("b", synthetic_count=True), _decoder(attempt, MIB, calls), domain=attempt
    ) as result:
        assert result.status is CheckoutStatus.BYPASS
    assert caches.factory(0).counters() == before
    assert source.stats().skipped_retentions == 1
    assert all(r.complete for r in caches.shutdown(timeout=30))


def test_an_interrupt_during_retention_abandons_the_reservation(cp: Any) -> None:
    caches = _caches(cap=64 * MIB)
    source = caches.source_cache(0)
    attempt = caches.backend.create_domain(0)
    calls: list[int] = []
    value = _decoder(attempt, 4 * MIB, calls)()
    claim = source.checkout_or_claim(_key("interrupted"), domain=attempt)
    with pytest.raises(KeyboardInterrupt):
        claim.publish(InterruptedCopy(value, attempt))
    stats = source.stats()
    assert (stats.in_flight, stats.abandoned, stats.entries) == (0, 1, 0)
    assert source.in_flight_keys() == 0
    snap = caches.ledger(0).snapshot()
    assert (snap.cache_reserved_bytes, snap.cache_charged_bytes) == (0, 0)
    assert caches.factory(0).counters().used_bytes == 0  # the interrupted copy is freed
    assert cp.asnumpy(value["a"][:3]).tolist() == [0, 1, 2]  # the leader keeps its value
    del value
    started = time.monotonic()
    (shutdown,) = caches.shutdown(timeout=120.0)
    assert shutdown.complete
    assert time.monotonic() - started < 60  # no wait for an abandoned reservation


# -- one domain per device -------------------------------------------------------------------


def test_a_profile_naming_a_missing_device_fails_clearly(cp: Any) -> None:
    from nexus_cache.errors import ConfigError

    count = cp.cuda.runtime.getDeviceCount()
    with pytest.raises(ConfigError, match=rf"device_id {count} does not exist on the cuda"):
        DeviceResidentCaches([DeviceProfile(0, MIB), DeviceProfile(count, MIB)], backend="cuda")


def test_two_devices_have_independent_domains_and_figures(cp: Any) -> None:
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    caches = DeviceResidentCaches(
        [DeviceProfile(0, 256 * MIB), DeviceProfile(1, 256 * MIB)], backend="cuda"
    )
    before = caches.device_cache_reports()[0]
    attempt = caches.backend.create_domain(1)
    calls: list[int] = []
    for i in range(4):
        with caches.source_cache(1).get_or_decode(
            _key(f"d1-{i}"), _decoder(attempt, 16 * MIB, calls), domain=attempt
        ) as result:
            assert result.value["a"].device.id == 1
    after = caches.device_cache_reports()
    assert after[0].ledger == before.ledger
    assert after[0].domain == before.domain
    assert after[1].ledger.cache_evictable_resident_bytes == 4 * 32 * MIB
    assert after[1].domain.used_bytes == 4 * 32 * MIB
    assert caches.factory(1).domain.device_id == 1
    assert all(r.complete for r in caches.shutdown(timeout=30))
