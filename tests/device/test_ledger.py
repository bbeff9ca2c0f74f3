"""The capacity equation, refusals with numbers, grants, pins and misuse."""

from __future__ import annotations

import threading
import time

import pytest

from nexus_cache.device import DeviceLedger, ResidencyState
from nexus_cache.errors import (
    AdmissionClosedError,
    ByteCountError,
    CacheCapExceededError,
    ConfigError,
    LifecycleError,
    ManagedCapacityExceededError,
)

S = ResidencyState


def published(ledger: DeviceLedger, nbytes: int, measured: int | None = None):
    entry = ledger.reserve(nbytes)
    entry.publish(nbytes if measured is None else measured)
    return entry


def figures(ledger: DeviceLedger) -> tuple[int, int, int, int, int, int]:
    s = ledger.snapshot()
    return (
        s.grant_bytes,
        s.cache_reserved_bytes,
        s.cache_evictable_resident_bytes,
        s.cache_pinned_in_use_bytes,
        s.cache_retiring_bytes,
        s.cache_quarantined_bytes,
    )


@pytest.mark.parametrize(("capacity", "cap"), [(-1, 0), (10, -1), (10, 11), (1.5, 1), (True, 0)])
def test_bad_construction(capacity: object, cap: object) -> None:
    with pytest.raises(ConfigError):
        DeviceLedger(0, capacity, cap)  # type: ignore[arg-type]


def test_reserve_reconcile_moves_reservation_to_measured_evictable() -> None:
    ledger = DeviceLedger(0, 10_000, 4_000)
    entry = ledger.reserve(1_000, key="k")
    assert entry.state is S.ATTEMPT_OWNED
    assert figures(ledger) == (0, 1_000, 0, 0, 0, 0)
    entry.publish(1_024)
    assert entry.state is S.EVICTABLE
    assert entry.nbytes == 1_024
    assert entry.reserved_bytes == 1_000
    assert figures(ledger) == (0, 0, 1_024, 0, 0, 0)
    shrink = ledger.reserve(2_000)
    shrink.publish(512)
    assert figures(ledger) == (0, 0, 1_536, 0, 0, 0)


def test_cache_charge_must_fit_the_cap_with_numbers_in_message() -> None:
    ledger = DeviceLedger(0, 10_000, 4_000)
    published(ledger, 3_000)
    with pytest.raises(CacheCapExceededError) as info:
        ledger.reserve(1_500, evict=False)
    message = str(info.value)
    for text in ("1500 B", "cache_cap_bytes=4000", "by 500 B", "evictable=3000 B"):
        assert text in message
    assert figures(ledger) == (0, 0, 3_000, 0, 0, 0)
    assert ledger.snapshot().refusals == 1


def test_cache_charge_must_fit_free_managed_capacity() -> None:
    ledger = DeviceLedger(0, 10_000, 8_000)
    grant = ledger.admit_grant("a1", 7_000)
    with pytest.raises(ManagedCapacityExceededError) as info:
        ledger.reserve(3_500)
    message = str(info.value)
    assert "capacity=10000 B" in message
    assert "grants=7000 B" in message
    assert "by 500 B" in message
    ledger.release_grant(grant)
    ledger.reserve(3_500)


def test_grant_over_capacity_and_cache_shrinks_grant_headroom() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 4_000)
    with entry.pin():
        with pytest.raises(ManagedCapacityExceededError, match="pinned=4000 B"):
            ledger.admit_grant("a1", 6_001)
        grant = ledger.admit_grant("a1", 6_000)
    assert ledger.snapshot().free_managed_bytes == 0
    assert grant.nbytes == 6_000
    with pytest.raises(LifecycleError, match="already holds a grant"):
        ledger.admit_grant("a1", 1)


def test_grant_is_immutable_and_released_once() -> None:
    ledger = DeviceLedger(0, 10_000, 0)
    grant = ledger.admit_grant("a", 100)
    with pytest.raises(AttributeError):
        grant.nbytes = 1  # type: ignore[misc]
    ledger.release_grant(grant)
    with pytest.raises(LifecycleError, match="not held"):
        ledger.release_grant(grant)
    other = DeviceLedger(1, 10_000, 0)
    foreign = other.admit_grant("a", 5)
    with pytest.raises(LifecycleError):
        ledger.release_grant(foreign)
    assert figures(ledger) == (0, 0, 0, 0, 0, 0)


def test_grant_admission_evicts_evictable_never_pinned() -> None:
    ledger = DeviceLedger(0, 10_000, 8_000)
    old = published(ledger, 3_000)
    hot = published(ledger, 3_000)
    evicted: list[int] = []

    def evictor(nbytes: int) -> int:
        evicted.append(nbytes)
        if old.begin_eviction():
            old.teardown()
            return old.nbytes
        return 0

    ledger.add_evictor(evictor)
    pin = hot.pin()
    grant = ledger.admit_grant("a", 6_000)  # needs 2000 B back
    assert evicted == [2_000]
    assert old.state is S.DESTROYED
    assert hot.state is S.PINNED
    assert figures(ledger) == (6_000, 0, 0, 3_000, 0, 0)
    # nothing evictable is left: a refusal, and the pinned entry survives
    with pytest.raises(ManagedCapacityExceededError, match="reclaimable now=0 B"):
        ledger.admit_grant("b", 1_001)
    assert hot.state is S.PINNED
    pin.release()
    ledger.release_grant(grant)


def test_no_eviction_when_even_all_evictable_would_not_fit() -> None:
    ledger = DeviceLedger(0, 10_000, 8_000)
    published(ledger, 3_000)
    calls: list[int] = []
    ledger.add_evictor(lambda n: calls.append(n) or 0)
    with pytest.raises(ManagedCapacityExceededError):
        ledger.admit_grant("a", 13_001 - 3_000 + 1)
    assert calls == []
    with pytest.raises(CacheCapExceededError, match="exceeds cache_cap_bytes=8000"):
        ledger.reserve(8_001)
    assert calls == []


def test_evictor_that_frees_nothing_ends_in_refusal() -> None:
    ledger = DeviceLedger(0, 1_000, 1_000)
    published(ledger, 800)
    ledger.add_evictor(lambda n: 0)
    with pytest.raises(CacheCapExceededError):
        ledger.reserve(400)
    assert figures(ledger) == (0, 0, 800, 0, 0, 0)


def test_reconcile_growth_must_fit_and_leaves_reservation_on_refusal() -> None:
    ledger = DeviceLedger(0, 10_000, 2_000)
    entry = ledger.reserve(1_500)
    with pytest.raises(CacheCapExceededError):
        entry.publish(2_500)
    assert entry.state is S.ATTEMPT_OWNED
    assert figures(ledger) == (0, 1_500, 0, 0, 0, 0)
    entry.publish(2_000)
    assert figures(ledger) == (0, 0, 2_000, 0, 0, 0)
    with pytest.raises(LifecycleError, match="not attempt_owned"):
        entry.publish(2_000)


def test_pins_move_the_whole_charge_and_back() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    first = entry.pin()
    second = entry.pin()
    assert entry.pins == 2
    assert figures(ledger) == (0, 0, 0, 1_000, 0, 0)
    first.release()
    assert entry.state is S.PINNED
    assert figures(ledger) == (0, 0, 0, 1_000, 0, 0)
    with second:
        pass
    assert entry.state is S.EVICTABLE
    assert figures(ledger) == (0, 0, 1_000, 0, 0, 0)


def test_double_release_raises_and_leaves_ledger_untouched() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    keep = entry.pin()
    handle = entry.pin()
    handle.release()
    before = ledger.snapshot()
    with pytest.raises(LifecycleError, match="already released"):
        handle.release()
    assert ledger.snapshot() == before
    assert entry.pins == 1
    with pytest.raises(LifecycleError, match="released"):
        _ = handle.value
    keep.release()


def test_context_manager_tolerates_release_inside_block() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    with entry.pin() as handle:
        handle.release()
    assert entry.state is S.EVICTABLE
    assert entry.pins == 0


def test_pin_refused_unless_resident() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    owned = ledger.reserve(100)
    with pytest.raises(LifecycleError, match="only evictable or pinned"):
        owned.pin()
    entry = published(ledger, 100)
    entry.destroy()
    with pytest.raises(LifecycleError, match="being destroyed"):
        entry.pin()
    other = DeviceLedger(1, 10_000, 5_000)
    with pytest.raises(LifecycleError, match="another ledger"):
        other.pin(published(ledger, 100))
    with pytest.raises(LifecycleError, match="another ledger"):
        other.reconcile(owned, 100)
    assert figures(other) == (0, 0, 0, 0, 0, 0)


def test_destroy_refuses_while_pinned_and_blocks_new_pins() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    handle = entry.pin()
    with pytest.raises(LifecycleError, match="1 pin"):
        entry.destroy(timeout=0.0)
    assert entry.pins_blocked
    with pytest.raises(LifecycleError, match="being destroyed"):
        entry.pin()
    assert figures(ledger) == (0, 0, 0, 1_000, 0, 0)
    handle.release()
    entry.destroy()
    assert entry.state is S.DESTROYED
    assert figures(ledger) == (0, 0, 0, 0, 0, 0)
    with pytest.raises(LifecycleError, match="already being destroyed"):
        entry.destroy()


def test_destroy_waits_for_the_last_release() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    handle = entry.pin()
    releaser = threading.Timer(0.05, handle.release)
    started = time.monotonic()  # before the timer starts: a busy machine may pause us
    releaser.start()
    entry.destroy(timeout=5.0)
    assert time.monotonic() - started >= 0.04
    assert entry.state is S.DESTROYED
    releaser.join()


def test_unsafe_teardown_keeps_charge_and_closes_admission() -> None:
    from ._helpers import FailingStream

    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = published(ledger, 1_000)
    stream = FailingStream()
    entry.record_stream(stream)
    from nexus_cache.errors import UnsafeTeardownError

    with pytest.raises(UnsafeTeardownError, match="stay charged"):
        entry.destroy()
    assert stream.calls == 1
    assert entry.state is S.QUARANTINED
    assert "cudaErrorLaunchFailure" in (entry.failure or "")
    snap = ledger.snapshot()
    assert snap.cache_quarantined_bytes == 1_000
    assert snap.cache_charged_bytes == 1_000
    assert not snap.admission_open
    assert "unsafe teardown" in (snap.admission_closed_reason or "")
    assert snap.unsafe_teardowns == 1
    with pytest.raises(AdmissionClosedError, match="closed"):
        ledger.admit_grant("a", 1)
    with pytest.raises(AdmissionClosedError):
        ledger.reserve(1)
    with pytest.raises(LifecycleError):
        entry.destroy()
    assert ledger.snapshot().cache_quarantined_bytes == 1_000


def test_abandon_reservation_releases_it() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = ledger.reserve(700)
    entry.destroy()
    assert entry.state is S.DESTROYED
    assert figures(ledger) == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("bad", [-1, 1.0, "5", None, True])
def test_bad_byte_counts(bad: object) -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    # run-time arguments, not settings: ByteCountError (a ValueError), never ConfigError
    with pytest.raises(ByteCountError, match="nbytes"):
        ledger.reserve(bad)  # type: ignore[arg-type]
    with pytest.raises(ByteCountError, match="nbytes"):
        ledger.admit_grant("a", bad)  # type: ignore[arg-type]
    with pytest.raises(ByteCountError, match="nbytes"):
        ledger.reclaim(bad)  # type: ignore[arg-type]
    entry = ledger.reserve(10)
    if bad is not None:  # None means "measure the attached arrays"
        with pytest.raises(ByteCountError, match="measured_bytes"):
            entry.publish(bad)  # type: ignore[arg-type]
    assert figures(ledger) == (0, 10, 0, 0, 0, 0)


def test_close_admission_is_reported() -> None:
    ledger = DeviceLedger(0, 10_000, 5_000)
    ledger.close_admission("maintenance")
    with pytest.raises(AdmissionClosedError, match="maintenance"):
        ledger.admit_grant("a", 1)
    assert ledger.snapshot().admission_closed_reason == "maintenance"
