"""DeviceResidentCaches: installation, subdomains on a shared domain, reports, shutdown."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.device import (
    MANAGED_CAPACITY_FRACTION,
    DeviceProfile,
    DeviceResidentCaches,
    ResidencyState,
)
from nexus_cache.device.graph import GraphCacheSubdomain
from nexus_cache.device.source.cache import SourceCacheSubdomain
from nexus_cache.errors import (
    AdmissionClosedError,
    CacheCapExceededError,
    ConfigError,
    LifecycleError,
    ManagedCapacityExceededError,
)

from ._helpers import KIB, MIB, FailingStream, fill, make_caches

S = ResidencyState


def test_profile_validation() -> None:
    with pytest.raises(ConfigError, match="cache_cap_bytes=-1"):
        DeviceProfile(0, -1)
    with pytest.raises(ConfigError, match="device_id"):
        DeviceProfile(-1, 0)
    with pytest.raises(ConfigError, match="managed_capacity_bytes=0"):
        DeviceProfile(0, 0, 0)
    with pytest.raises(ConfigError, match="lower the cap"):
        DeviceProfile(0, 11, 10)
    profile = DeviceProfile(0, 10)
    assert profile.resolve_managed_capacity(1000) == int(1000 * MANAGED_CAPACITY_FRACTION)
    with pytest.raises(ConfigError, match="lower the cap"):
        DeviceProfile(0, 901).resolve_managed_capacity(1000)
    with pytest.raises(ConfigError, match="exceeds the 1000 B"):
        DeviceProfile(0, 10, 1001).resolve_managed_capacity(1000)


def test_default_managed_capacity_is_documented_fraction() -> None:
    caches = DeviceResidentCaches([DeviceProfile(0, 0)], backend=HostBackend(1_000_000))
    assert caches.ledger(0).managed_capacity_bytes == 900_000
    assert MANAGED_CAPACITY_FRACTION == 0.9


def test_bad_profiles_rejected() -> None:
    backend = HostBackend(MIB, device_count=2)
    with pytest.raises(ConfigError, match="at least one"):
        DeviceResidentCaches([], backend=backend)
    with pytest.raises(ConfigError, match="more than one"):
        DeviceResidentCaches([DeviceProfile(0, 0), DeviceProfile(0, 1)], backend=backend)
    with pytest.raises(ConfigError, match=r"accepted: 0\.\.1"):
        DeviceResidentCaches([DeviceProfile(2, 0)], backend=backend)
    with pytest.raises(ConfigError, match="DeviceProfile objects"):
        DeviceResidentCaches([(0, 1)], backend=backend)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="accepted: a DeviceBackend"):
        DeviceResidentCaches([DeviceProfile(0, 0)], backend=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="backend name='gpu'"):
        DeviceResidentCaches([DeviceProfile(0, 0)], backend="gpu")


def test_zero_cap_creates_no_domain_nor_subdomains() -> None:
    backend = HostBackend(MIB, device_count=2)
    created: list[int] = []
    original = backend.create_domain

    def counting(device_id: int, **kwargs: object):
        created.append(device_id)
        return original(device_id, **kwargs)

    backend.create_domain = counting  # type: ignore[method-assign]
    caches = DeviceResidentCaches([DeviceProfile(0, 0), DeviceProfile(1, 64 * KIB)], backend)
    assert created == [1]
    assert caches.factory(0) is None
    assert caches.source_cache(0) is None
    assert caches.graph_cache(0) is None
    assert isinstance(caches.source_cache(1), SourceCacheSubdomain)
    assert isinstance(caches.graph_cache(1), GraphCacheSubdomain)
    assert caches.source_cache(1).factory is caches.graph_cache(1).factory  # one shared domain
    grant = caches.ledger(0).admit_grant("a", 1000)  # the ledger still governs grants
    caches.ledger(0).release_grant(grant)
    reports = {r.device_id: r for r in caches.device_cache_reports()}
    assert not reports[0].caches_installed
    assert reports[0].to_dict()["domain_used_bytes"] is None
    assert reports[1].caches_installed
    with pytest.raises(ConfigError, match="profiled devices"):
        caches.ledger(5)
    results = caches.shutdown()
    assert all(r.complete for r in results)


def test_source_and_graph_share_one_domain_and_reports_pair_ledger_with_domain() -> None:
    caches = make_caches(cap=64 * KIB)
    source, graph = caches.source_cache(0), caches.graph_cache(0)
    fill(source, "s1", 3000)  # 3072 B measured
    fill(graph, "g1", 5000)  # 5120 B measured
    report = caches.device_cache_reports()[0]
    row = report.to_dict()
    assert row["cache_evictable_resident_bytes"] == 3072 + 5120
    assert row["cache_pinned_in_use_bytes"] == 0
    assert row["domain_used_bytes"] == 3072 + 5120
    assert row["drift_bytes"] == 0
    assert row["source_publishes"] == 1
    assert row["graph_publishes"] == 1
    with source.checkout("s1") as pin:
        assert int(pin.value["column"][0]) == 7
        snap = caches.gauge_snapshot()
        assert snap["nexus.gpu.cache.pinned.in_use"] == {0: 3072}
        assert snap["nexus.gpu.cache.evictable.resident"] == {0: 5120}
    assert source.checkout("missing") is None
    stats = source.stats()
    assert (stats.hits, stats.misses) == (1, 1)


def test_reconcile_to_measured_bytes() -> None:
    caches = make_caches()
    source = caches.source_cache(0)
    entry = fill(source, "k", 1000, reserve=4000, publish=False)
    assert caches.ledger(0).snapshot().cache_reserved_bytes == 4000
    assert entry.measured_bytes() == 1024
    source.publish(entry)
    snap = caches.ledger(0).snapshot()
    assert (snap.cache_reserved_bytes, snap.cache_evictable_resident_bytes) == (0, 1024)


def test_source_reservation_evicts_lru_unpinned_entries() -> None:
    caches = make_caches(cap=16 * KIB)
    source = caches.source_cache(0)
    for key in ("a", "b", "c", "d"):
        fill(source, key, 4 * KIB)
    pin_a = source.checkout("a")  # pinned: never evicted; also most recently used
    with source.checkout("b"):
        pass  # b is now more recent than c and d
    fill(source, "e", 8 * KIB)  # needs 8 KiB: evicts c then d (LRU), never a
    assert source.checkout("c") is None
    assert source.checkout("d") is None
    assert pin_a.entry.state is S.PINNED
    for key in ("b", "e"):
        handle = source.checkout(key)
        assert handle is not None
        handle.release()
    stats = source.stats()
    assert stats.evictions == 2
    assert stats.evicted_bytes == 8 * KIB
    assert caches.factory(0).counters().used_bytes == 16 * KIB
    pin_a.release()


def test_grant_admission_evicts_source_but_never_graph_or_pinned() -> None:
    caches = make_caches(cap=32 * KIB, capacity=48 * KIB)
    source, graph = caches.source_cache(0), caches.graph_cache(0)
    fill(graph, "g", 8 * KIB)
    fill(source, "s-old", 8 * KIB)
    fill(source, "s-hot", 8 * KIB)
    pin = source.checkout("s-hot")
    ledger = caches.ledger(0)
    grant = ledger.admit_grant("attempt-1", 32 * KIB)  # 32 + 24 > 48: evict 8 KiB
    assert source.checkout("s-old") is None
    assert pin.entry.state is S.PINNED
    with pytest.raises(ManagedCapacityExceededError):
        ledger.admit_grant("attempt-2", 1)  # only the graph (not evictable by LRU) is left
    assert graph.stats().entries == 1
    pin.release()
    ledger.release_grant(grant)


def test_graph_reservation_evicts_unpinned_source_frames_only() -> None:
    caches = make_caches(cap=16 * KIB)
    source, graph = caches.source_cache(0), caches.graph_cache(0)
    fill(source, "s", 12 * KIB)
    pin = source.checkout("s")
    with pytest.raises(CacheCapExceededError):  # a pinned frame is never evicted
        graph.reserve("g", 8 * KIB)
    assert source.stats().entries == 1
    pin.release()
    graph.abandon(graph.reserve("g", 8 * KIB))  # the unpinned frame makes room
    assert source.stats().entries == 0
    assert source.stats().evictions == 1


def test_duplicate_publication_keeps_the_first_and_frees_the_second() -> None:
    caches = make_caches()
    graph = caches.graph_cache(0)
    first = fill(graph, "g", 2000, publish=False)
    second = fill(graph, "g", 2000, publish=False)
    assert graph.publish(first) is first
    assert graph.publish(second) is first
    assert second.state is S.DESTROYED
    assert caches.factory(0).counters().used_bytes == 2048
    assert caches.ledger(0).snapshot().cache_charged_bytes == 2048
    assert graph.stats().duplicates == 1


def test_abandon_and_capacity_failure_on_publish() -> None:
    caches = make_caches(cap=8 * KIB)
    source = caches.source_cache(0)
    entry = fill(source, "k", 1000, publish=False)
    source.abandon(entry)
    assert entry.state is S.DESTROYED
    assert caches.factory(0).counters().used_bytes == 0
    big = fill(source, "big", 12 * KIB, reserve=4 * KIB, publish=False)
    with pytest.raises(CacheCapExceededError):
        source.publish(big)
    assert big.state is S.DESTROYED
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    with pytest.raises(LifecycleError, match="not a reservation"):
        source.abandon(big)


def test_no_public_per_key_clear() -> None:
    caches = make_caches()
    entry = fill(caches.source_cache(0), "k", 1000)
    with pytest.raises(LifecycleError, match="no per-key clear"):
        entry.destroy()
    for name in ("clear", "invalidate", "remove", "evict", "delete"):
        assert not hasattr(caches.source_cache(0), name)
        assert not hasattr(caches, name)


def test_leaked_array_makes_teardown_unsafe() -> None:
    caches = make_caches()
    source = caches.source_cache(0)
    fill(source, "k", 1000)
    with source.checkout("k") as pin:
        leaked = pin.value["column"]  # kept past the release: memory not provably free
    result = caches.shutdown(timeout=0.5)[0]
    assert not result.complete
    assert result.source.quarantined == 1
    assert not result.domain_released
    report = caches.device_cache_reports()[0]
    assert report.ledger.cache_quarantined_bytes == 1024
    assert not report.ledger.admission_open
    assert "unsafe teardown" in report.ledger.admission_closed_reason
    assert report.domain.used_bytes == 1024  # the bytes are really still there
    assert report.to_dict()["source_unsafe_teardowns"] == 1
    del leaked


def test_failed_stream_sync_in_eviction_closes_admission() -> None:
    caches = make_caches(cap=8 * KIB)
    source = caches.source_cache(0)
    entry = fill(source, "k", 6 * KIB)
    entry.record_stream(FailingStream())
    with pytest.raises(AdmissionClosedError):
        source.reserve("next", 4 * KIB)  # evicting k fails its teardown
    snap = caches.ledger(0).snapshot()
    assert snap.cache_quarantined_bytes == 6 * KIB
    assert snap.unsafe_teardowns == 1
    assert source.stats().unsafe_teardowns == 1
    with pytest.raises(AdmissionClosedError):
        caches.ledger(0).admit_grant("a", 1)


def test_failure_to_return_blocks_quarantines(monkeypatch: pytest.MonkeyPatch) -> None:
    caches = make_caches()
    graph = caches.graph_cache(0)
    fill(graph, "g", 1000)
    domain = caches.factory(0).domain

    def broken() -> int:
        raise OSError("cudaFree failed (injected)")

    monkeypatch.setattr(domain, "release_unused", broken)
    result = caches.shutdown(timeout=0.1)[0]
    assert not result.complete
    assert result.graph.quarantined == 1
    snap = caches.ledger(0).snapshot()
    assert snap.cache_quarantined_bytes == 1024
    assert "cudaFree failed" in snap.admission_closed_reason


def test_shutdown_drains_graph_before_source_then_releases_domain() -> None:
    caches = make_caches()
    fill(caches.source_cache(0), "s", 1000)
    fill(caches.graph_cache(0), "g", 1000)
    order: list[str] = []
    for sub in (caches.source_cache(0), caches.graph_cache(0)):
        original = sub.drain

        def spy(timeout: float, _orig=original, _kind=sub.kind) -> object:
            order.append(_kind)
            return _orig(timeout)

        sub.drain = spy  # type: ignore[method-assign]
    factory = caches.factory(0)
    released: list[str] = []
    original_release = factory.release
    factory.release = lambda: (released.append("domain"), original_release())[1]  # type: ignore[method-assign]
    results = caches.shutdown()
    assert order == ["graph", "source"]
    assert released == ["domain"]
    assert results[0].complete
    assert results[0].domain_released
    assert caches.backend.mem_info(0).free_bytes == MIB  # all memory back on the device
    assert caches.shutdown() is results  # idempotent
    assert order == ["graph", "source"]
    with pytest.raises(LifecycleError, match="closed"):
        caches.source_cache(0).reserve("x", 1)
    with pytest.raises(AdmissionClosedError):
        caches.ledger(0).admit_grant("a", 1)


def test_shutdown_with_pin_held_is_incomplete_then_retry_completes() -> None:
    caches = make_caches()
    fill(caches.source_cache(0), "s", 1000)
    pin = caches.source_cache(0).checkout("s")
    first = caches.shutdown(timeout=0.05)[0]
    assert not first.complete
    assert first.source.still_pinned == 1
    assert not caches.factory(0).released
    assert caches.source_cache(0).checkout("s") is None  # closed: no new pins
    pin.release()
    second = caches.shutdown(timeout=1.0)[0]
    assert second.complete
    assert second.domain_released
    assert caches.device_cache_reports()[0].ledger.cache_charged_bytes == 0


def test_shutdown_waits_for_pins_released_by_other_threads() -> None:
    caches = make_caches()
    fill(caches.source_cache(0), "s", 1000)
    pin = caches.source_cache(0).checkout("s")
    timer = threading.Timer(0.05, pin.release)
    timer.start()
    result = caches.shutdown(timeout=5.0)[0]
    timer.join()
    assert result.complete


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", None, True])
def test_shutdown_timeout_is_checked_before_anything_is_shut(bad: object) -> None:
    # inf raised OverflowError, "10" and None TypeError: after admission had closed
    caches = make_caches()
    with pytest.raises(ConfigError, match=r"shutdown timeout=.* finite number of seconds >= 0"):
        caches.shutdown(bad)  # type: ignore[arg-type]
    assert caches.ledger(0).snapshot().admission_open
    fill(caches.source_cache(0), "s", 1000)
    assert caches.shutdown(timeout=1.0)[0].complete


def test_shutdown_with_a_timeout_beyond_what_threads_wait_still_waits_for_pins() -> None:
    # 1e30 is a finite number of seconds; the drain's wait raised OverflowError
    caches = make_caches()
    fill(caches.source_cache(0), "s", 1000)
    pin = caches.source_cache(0).checkout("s")
    timer = threading.Timer(0.05, pin.release)
    timer.start()
    result = caches.shutdown(timeout=1e30)[0]
    timer.join()
    assert result.complete
    assert caches.device_cache_reports()[0].ledger.cache_charged_bytes == 0


def test_publication_after_close_is_discarded() -> None:
    caches = make_caches()
    source = caches.source_cache(0)
    entry = fill(source, "k", 1000, publish=False)
    source.close()
    with pytest.raises(LifecycleError, match="closed"):
        source.publish(entry)
    assert entry.state is S.DESTROYED
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0


def test_attach_refuses_foreign_arrays_and_wrong_state() -> None:
    caches = make_caches()
    source = caches.source_cache(0)
    entry = source.reserve("k", 1000)
    with pytest.raises(LifecycleError, match="not allocated in the cache domain"):
        entry.attach(None, [np.zeros(10)])
    source.abandon(entry)
    with pytest.raises(LifecycleError, match="not attempt_owned"):
        entry.attach(None)
