"""One cache domain per device: two simulated host devices stay independent."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.device import ArrayBundle, DeviceProfile, DeviceResidentCaches, SourceFrameKey
from nexus_cache.errors import AdmissionClosedError, ConfigError, UnsafeTeardownError

from ._helpers import KIB, MIB, FailingStream, fill

CAP = 256 * KIB


def two_devices(cap0: int = CAP, cap1: int = CAP) -> DeviceResidentCaches:
    backend = HostBackend(device_total_bytes=4 * MIB, device_count=2)
    profiles = [DeviceProfile(0, cap0, 2 * MIB), DeviceProfile(1, cap1, 2 * MIB)]
    return DeviceResidentCaches(profiles, backend=backend)


def figures(caches: DeviceResidentCaches, device: int) -> tuple[Any, ...]:
    report = caches.device_cache_reports()[device]
    return (
        report.ledger,
        report.device_memory,
        report.domain,
        report.source,
        report.graph,
        caches.gauge_snapshot()["nexus.gpu.cache.evictable.resident"][device],
        caches.gauge_snapshot()["nexus.gpu.cache.pinned.in_use"][device],
    )


def test_two_profiles_install_two_independent_domains() -> None:
    caches = two_devices()
    f0, f1 = caches.factory(0), caches.factory(1)
    assert f0 is not f1
    assert f0.domain is not f1.domain
    assert (f0.domain.device_id, f1.domain.device_id) == (0, 1)
    assert caches.ledger(0) is not caches.ledger(1)
    assert caches.source_cache(0).factory is f0
    assert caches.graph_cache(1).factory is f1
    assert all(r.complete for r in caches.shutdown())


def test_filling_device_1_never_moves_device_0() -> None:
    caches = two_devices()
    fill(caches.source_cache(0), "zero", 32 * KIB)
    before = figures(caches, 0)
    attempt = caches.backend.create_domain(1)
    source = caches.source_cache(1)
    for i in range(12):  # 12 x 32 KiB: fills the 256 KiB cap and evicts on device 1
        key = SourceFrameKey(("dev1", i), ("a",))
        value = ArrayBundle({"a": attempt.copy_in(np.full(32 * KIB, i, np.uint8))})
        with source.checkout_or_claim(key, domain=attempt) as claim:
            claim.publish(value).release()
    grant = caches.ledger(1).admit_grant("attempt-on-1", 1 * MIB)
    assert source.stats().evictions > 0
    assert caches.ledger(1).snapshot().cache_evictable_resident_bytes == CAP
    assert figures(caches, 0) == before  # ledger, memory, domain, stats and gauges
    assert caches.device_cache_source_event_snapshots()[0].events == ()
    caches.ledger(1).release_grant(grant)
    assert figures(caches, 0) == before


def test_unsafe_teardown_on_one_device_keeps_the_other_open() -> None:
    caches = two_devices()
    entry = fill(caches.source_cache(1), "bad", 16 * KIB)
    entry.record_stream(FailingStream())
    with pytest.raises(UnsafeTeardownError):
        _evict_unsafely(caches, 1)
    assert not caches.ledger(1).admission_open
    with pytest.raises(AdmissionClosedError):
        caches.ledger(1).admit_grant("a", 1)
    assert caches.ledger(0).admission_open
    grant = caches.ledger(0).admit_grant("a", 64 * KIB)
    fill(caches.source_cache(0), "fine", 16 * KIB)
    caches.ledger(0).release_grant(grant)
    results = caches.shutdown(timeout=1.0)
    assert results[0].complete
    assert not results[1].complete


def _evict_unsafely(caches: DeviceResidentCaches, device: int) -> None:
    entry = caches.source_cache(device).checkout("bad")
    assert entry is not None
    target = entry.entry
    entry.release()
    assert target.begin_eviction()
    target.teardown()


def test_zero_cap_on_one_device_installs_nothing_there() -> None:
    caches = two_devices(cap0=CAP, cap1=0)
    assert caches.factory(1) is None
    assert caches.source_cache(1) is None
    assert caches.graph_cache(1) is None
    assert caches.factory(0) is not None
    reports = caches.device_cache_reports()
    assert [r.caches_installed for r in reports] == [True, False]
    assert [s.device_id for s in caches.device_cache_source_event_snapshots()] == [0]
    assert caches.backend.mem_info(1).free_bytes == 4 * MIB


def test_queries_on_two_devices_run_concurrently() -> None:
    caches = two_devices()
    errors: list[BaseException] = []
    attempts = {d: caches.backend.create_domain(d) for d in (0, 1)}

    def query(device: int) -> None:
        try:
            attempt = attempts[device]
            source = caches.source_cache(device)
            for i in range(50):
                key = SourceFrameKey(("shared-name", i % 5), ("a",))
                decode = lambda i=i: ArrayBundle(  # noqa: E731
                    {"a": attempt.copy_in(np.full(8 * KIB, i % 5, np.uint8))}
                )
                with source.get_or_decode(key, decode, domain=attempt) as result:
                    assert int(result.value["a"][0]) == i % 5
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=query, args=(d,)) for d in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    for device in (0, 1):  # the same keys on each device: each decoded its own five
        stats = caches.source_cache(device).stats()
        assert stats.publishes == 5
        assert stats.hits == 45
    assert all(r.complete for r in caches.shutdown())
    for attempt in attempts.values():
        attempt.close()
    assert [caches.backend.mem_info(d).free_bytes for d in (0, 1)] == [4 * MIB, 4 * MIB]


def test_a_profile_naming_a_missing_device_fails_clearly() -> None:
    backend = HostBackend(device_total_bytes=4 * MIB, device_count=2)
    with pytest.raises(
        ConfigError, match=r"device_id 2 does not exist on the host backend.*0\.\.1"
    ):
        DeviceResidentCaches([DeviceProfile(0, CAP), DeviceProfile(2, CAP)], backend=backend)
    with pytest.raises(ConfigError, match="more than one DeviceProfile"):
        DeviceResidentCaches([DeviceProfile(1, CAP), DeviceProfile(1, 0)], backend=backend)
