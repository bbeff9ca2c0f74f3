"""The decoded source cache: single flight, retention under capacity, pins carried
through derived results, bypass, and fingerprinted events (host backend)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import pytest

from nexus_cache.device import (
    ArrayBundle,
    CheckoutStatus,
    SourceBypass,
    SourceCheckout,
    SourceClaim,
    SourceFrameKey,
)
from nexus_cache.device.source.events import SourceEventLog
from nexus_cache.errors import (
    AttemptCancelledError,
    ConfigError,
    SourceDecodeError,
    SourceWaitTimeoutError,
)

from ._helpers import KIB, InterruptedCopy, make_caches

ENTRY = 16 * KIB


def key(name: str, **flags: Any) -> SourceFrameKey:
    return SourceFrameKey(("lakehouse", "local", name, "etag-1"), ("a",), (0,), **flags)


class Decoder:
    """Counts decodes; builds a bundle of ``nbytes`` in the attempt's domain."""

    def __init__(self, domain: Any, nbytes: int = ENTRY, delay: float = 0.0) -> None:
        self.domain = domain
        self.nbytes = nbytes
        self.delay = delay
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> ArrayBundle:
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        host = (np.arange(self.nbytes) % 251).astype(np.uint8)
        return ArrayBundle({"a": self.domain.copy_in(host)})


def expected(nbytes: int = ENTRY) -> np.ndarray:
    return (np.arange(nbytes) % 251).astype(np.uint8)


def ledger_pair(caches: Any) -> tuple[int, int]:
    snap = caches.ledger(0).snapshot()
    return snap.cache_evictable_resident_bytes, snap.cache_pinned_in_use_bytes


@pytest.fixture
def caches() -> Any:
    caches = make_caches(cap=64 * KIB, capacity=128 * KIB, total=1024 * KIB)
    yield caches
    caches.shutdown(timeout=1.0)


@pytest.fixture
def attempt(caches: Any) -> Any:
    return caches.backend.create_domain(0)


def test_sixteen_threads_on_one_cold_key_decode_once(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    decode = Decoder(attempt, delay=0.2)
    start = threading.Barrier(16)
    results: list[SourceCheckout] = []
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            results.append(source.get_or_decode(key("t"), decode, domain=attempt, timeout=30))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert decode.calls == 1
    statuses = [r.status for r in results]
    assert statuses.count(CheckoutStatus.LEADER) == 1
    assert set(statuses) <= {CheckoutStatus.LEADER, CheckoutStatus.FOLLOWER, CheckoutStatus.HIT}
    for result in results:
        np.testing.assert_array_equal(result.value["a"], expected())
    stats = source.stats()
    assert stats.waits == statuses.count(CheckoutStatus.FOLLOWER)
    assert stats.publishes == 1
    assert ledger_pair(caches) == (0, ENTRY)  # the followers' copies hold pins
    assert caches.ledger(0).snapshot().cache_pinned_in_use_bytes == ENTRY
    assert sum(r.lease is not None for r in results) == len(results) - 1
    for result in results:
        result.release()
    assert ledger_pair(caches) == (ENTRY, 0)
    assert source.in_flight_keys() == 0


def _wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def test_cancelled_leader_hands_the_lead_to_a_follower(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(key("c"), domain=attempt)
    assert isinstance(claim, SourceClaim)
    decode = Decoder(attempt)
    out: list[SourceCheckout] = []
    follower = threading.Thread(
        target=lambda: out.append(source.get_or_decode(key("c"), decode, domain=attempt))
    )
    follower.start()
    _wait_for(lambda: source.stats().waits == 1)
    with pytest.raises(AttemptCancelledError), claim:
        raise AttemptCancelledError("the query was cancelled")
    follower.join(10)
    assert decode.calls == 1
    (result,) = out
    assert result.status is CheckoutStatus.LEADER
    assert result.diagnostics.leader_attempts == 2
    assert result.diagnostics.retained
    assert source.stats().leader_retries == 1
    kinds = [e.kind for e in source.event_snapshot().events]
    assert kinds == ["leader_handoff", "load", "promotion"]
    result.release()


def test_leader_decode_error_reaches_every_waiter(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    release = threading.Event()
    calls = []

    def failing() -> ArrayBundle:
        calls.append(1)
        release.wait(10)
        raise ValueError("corrupt page in row group 0")

    errors: list[BaseException] = []

    def run() -> None:
        try:
            source.get_or_decode(key("e"), failing, domain=attempt, timeout=30)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    _wait_for(lambda: source.stats().waits == 5)
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1
    assert sum(isinstance(e, ValueError) for e in errors) == 1  # the leader's own
    followers = [e for e in errors if isinstance(e, SourceDecodeError)]
    assert len(followers) == 5
    # each follower's message says why, as the leader's does (not only a fingerprint)
    assert all("ValueError: corrupt page in row group 0" in str(e) for e in followers)
    assert all(isinstance(e.__cause__, ValueError) for e in followers)
    assert source.stats().decode_errors == 1
    assert source.in_flight_keys() == 0
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    # errors are not cached: the next request leads a fresh decode
    retry = source.checkout_or_claim(key("e"), domain=attempt)
    assert isinstance(retry, SourceClaim)
    retry.abandon()


def test_waiter_past_its_deadline_times_out_and_leaves_nothing(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(key("d"), domain=attempt)
    started = time.monotonic()
    with pytest.raises(SourceWaitTimeoutError, match="decode leader"):
        source.checkout_or_claim(key("d"), domain=attempt, timeout=0.05)
    assert time.monotonic() - started < 5
    assert source.stats().wait_timeouts == 1
    # the timed-out waiter is gone: abandoning hands off to nobody and clears the flight
    claim.abandon("cancelled")
    assert source.in_flight_keys() == 0
    assert [e.kind for e in source.event_snapshot().events] == []
    assert source.stats().leader_retries == 0
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0


def test_a_waiter_with_a_timeout_beyond_what_threads_wait_gets_the_frame(
    caches: Any, attempt: Any
) -> None:
    # 1e30 s is a finite timeout, accepted; the wait raised OverflowError
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(key("h"), domain=attempt)
    box: dict[str, Any] = {}

    def follow() -> None:
        try:
            box["result"] = source.checkout_or_claim(key("h"), domain=attempt, timeout=1e30)
        except BaseException as exc:
            box["error"] = exc

    waiter = threading.Thread(target=follow)
    waiter.start()
    deadline = time.monotonic() + 10
    while source.stats().waits < 1 and "error" not in box:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    claim.publish(Decoder(attempt)()).release()
    waiter.join(10)
    assert not waiter.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.status is CheckoutStatus.FOLLOWER
    assert np.array_equal(np.asarray(result.value["a"]), expected())
    result.release()
    assert ledger_pair(caches) == (ENTRY, 0)


class _Stopped(Exception):
    pass


def test_a_waiter_whose_stop_check_raises_leaves_at_once_and_the_leader_goes_on(
    caches: Any, attempt: Any
) -> None:
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(key("s"), domain=attempt)
    stop_now = threading.Event()
    calls = [0]

    def stop() -> None:
        calls[0] += 1
        if stop_now.is_set():
            raise _Stopped("cancelled")

    box: dict[str, Any] = {}

    def follow() -> None:
        try:
            source.checkout_or_claim(key("s"), domain=attempt, timeout=60.0, stop=stop)
        except BaseException as exc:
            box["error"] = exc
        box["at"] = time.monotonic()

    waiter = threading.Thread(target=follow)
    waiter.start()
    deadline = time.monotonic() + 10
    while calls[0] < 2:  # it is waiting, and looks at its check while it waits
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stopped_at = time.monotonic()
    stop_now.set()
    waiter.join(10)
    assert isinstance(box["error"], _Stopped)
    assert box["at"] - stopped_at < 1.0  # not the 60 s timeout
    assert source.stats().wait_timeouts == 0
    # the leader goes on alone and publishes; a later caller hits
    checkout = claim.publish(Decoder(attempt)())
    assert np.array_equal(np.asarray(checkout.value["a"]), expected())
    checkout.release()
    again = source.checkout_or_claim(key("s"), domain=attempt, stop=stop)
    assert isinstance(again, SourceCheckout)
    assert again.status is CheckoutStatus.HIT
    again.release()
    assert source.in_flight_keys() == 0


def test_entry_that_does_not_fit_is_not_retained_and_the_result_is_right(
    caches: Any, attempt: Any
) -> None:
    source = caches.source_cache(0)
    big = Decoder(attempt, nbytes=80 * KIB)  # cap is 64 KiB
    with source.get_or_decode(key("big"), big, domain=attempt) as result:
        np.testing.assert_array_equal(result.value["a"], expected(80 * KIB))
        assert result.diagnostics.retained is False
        assert "CacheCapExceededError" in result.diagnostics.detail
    assert source.stats().skipped_retentions == 1
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0
    assert source.event_snapshot().events[-1].kind == "promotion_skipped"
    # not retained, so the next request decodes again
    assert isinstance(source.checkout_or_claim(key("big"), domain=attempt), SourceClaim)


def test_allocation_failure_in_the_cache_domain_skips_retention() -> None:
    caches = make_caches(cap=128 * KIB, capacity=200 * KIB, total=256 * KIB)
    attempt = caches.backend.create_domain(0)
    ballast = attempt.empty(150 * KIB, np.uint8)  # the device is nearly full
    source = caches.source_cache(0)
    with source.get_or_decode(key("oom"), Decoder(attempt, 64 * KIB), domain=attempt) as result:
        assert result.diagnostics.retained is False
        assert "copying into the cache domain failed (CapacityError)" in result.diagnostics.detail
        np.testing.assert_array_equal(result.value["a"], expected(64 * KIB))
    snap = caches.ledger(0).snapshot()
    assert snap.cache_charged_bytes == 0
    assert source.stats().abandoned == 1
    del ballast
    assert all(r.complete for r in caches.shutdown())


def _fill(source: Any, attempt: Any, name: str) -> None:
    source.get_or_decode(key(name), Decoder(attempt), domain=attempt).release()


def test_lru_eviction_order_and_pinned_entries_survive(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    for i in range(4):  # 4 x 16 KiB fill the 64 KiB cap
        _fill(source, attempt, f"k{i}")
        assert ledger_pair(caches) == ((i + 1) * ENTRY, 0)
    hit = source.checkout_or_claim(key("k0"), domain=attempt)  # k0 becomes most recent
    assert isinstance(hit, SourceCheckout)
    assert hit.status is CheckoutStatus.HIT
    assert ledger_pair(caches) == (3 * ENTRY, ENTRY)
    hit.release()
    assert ledger_pair(caches) == (4 * ENTRY, 0)
    _fill(source, attempt, "k4")  # evicts k1, the least recently used
    assert ledger_pair(caches) == (4 * ENTRY, 0)
    evicted = [e for e in source.event_snapshot().events if e.kind == "eviction"]
    assert [e.fingerprint for e in evicted] == [key("k1").fingerprint]
    # pin everything: a new key cannot evict, so it is not retained
    pins = [source.checkout_or_claim(key(k), domain=attempt) for k in ("k0", "k2", "k3", "k4")]
    assert all(isinstance(p, SourceCheckout) for p in pins)
    assert ledger_pair(caches) == (0, 4 * ENTRY)
    with source.get_or_decode(key("k5"), Decoder(attempt), domain=attempt) as result:
        assert result.diagnostics.retained is False
    assert ledger_pair(caches) == (0, 4 * ENTRY)
    assert source.stats().evictions == 1
    for pin in pins:
        pin.release()
    assert ledger_pair(caches) == (4 * ENTRY, 0)


def test_pin_lives_until_the_last_derived_result_is_released(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    _fill(source, attempt, "p")
    hit = source.checkout_or_claim(key("p"), domain=attempt)
    assert isinstance(hit, SourceCheckout)
    sliced = hit.derive(hit.value.slice(0, 10))
    projected = sliced.derive(sliced.value.project(["a"]))
    assert hit.lease is not None
    assert hit.lease.holders == 3
    assert ledger_pair(caches) == (0, ENTRY)
    hit.release()
    assert ledger_pair(caches) == (0, ENTRY)
    sliced.release()
    assert ledger_pair(caches) == (0, ENTRY)
    np.testing.assert_array_equal(projected.value["a"], expected()[:10])
    projected.release()
    assert ledger_pair(caches) == (ENTRY, 0)
    with pytest.raises(Exception, match="already released"):
        projected.release()
    assert ledger_pair(caches) == (ENTRY, 0)


@pytest.mark.parametrize("reason", list(SourceBypass))
def test_bypass_never_touches_the_cache(caches: Any, attempt: Any, reason: SourceBypass) -> None:
    source = caches.source_cache(0)
    flags = {reason.value: True}
    _fill(source, attempt, "b")  # the same identity is resident, and still not used
    before = (source.stats(), caches.ledger(0).snapshot(), caches.factory(0).counters())
    events_before = source.event_snapshot().events
    decode = Decoder(attempt)
    with source.get_or_decode(key("b", **flags), decode, domain=attempt) as result:
        assert result.status is CheckoutStatus.BYPASS
        assert result.diagnostics.bypass == reason.value
        assert result.diagnostics.detail == reason.explanation
        assert result.diagnostics.retained is False
    assert decode.calls == 1
    after = (source.stats(), caches.ledger(0).snapshot(), caches.factory(0).counters())
    assert after == before
    assert source.event_snapshot().events == events_before


def test_events_are_fingerprinted_and_bounded(caches: Any, attempt: Any) -> None:
    secret = SourceFrameKey(("s3", "bucket", "private/path.parquet", "token=hunter2"), ("a",))
    source = caches.source_cache(0)
    source.get_or_decode(secret, Decoder(attempt), domain=attempt).release()
    (snapshot,) = caches.device_cache_source_event_snapshots()
    text = json.dumps(snapshot.to_dict())
    assert "private/path" not in text
    assert "hunter2" not in text
    assert "private/path" not in repr(secret)
    assert [e.fingerprint for e in snapshot.events] == [secret.fingerprint] * 2
    assert (snapshot.misses, snapshot.hits, snapshot.skipped_retentions) == (1, 0, 0)
    log = SourceEventLog(limit=4)
    for i in range(10):
        log.record("load", f"{i:016x}")
    events, dropped = log.snapshot()
    assert [e.sequence for e in events] == [7, 8, 9, 10]
    assert dropped == 6


def test_key_identity_equality_and_validation() -> None:
    base = SourceFrameKey(("id",), ("a", "b"), (0, 1), 1024, {"x": 1, "y": "z"})
    assert base == SourceFrameKey(("id",), ("a", "b"), (0, 1), 1024, {"y": "z", "x": 1})
    assert (
        base.fingerprint
        == SourceFrameKey(("id",), ("a", "b"), (0, 1), 1024, [("y", "z"), ("x", 1)]).fingerprint
    )
    for other in (
        SourceFrameKey(("id2",), ("a", "b"), (0, 1), 1024, {"x": 1, "y": "z"}),
        SourceFrameKey(("id",), ("b", "a"), (0, 1), 1024, {"x": 1, "y": "z"}),
        SourceFrameKey(("id",), ("a", "b"), (1,), 1024, {"x": 1, "y": "z"}),
        SourceFrameKey(("id",), ("a", "b"), (0, 1), 2048, {"x": 1, "y": "z"}),
        SourceFrameKey(("id",), ("a", "b"), (0, 1), 1024, {"x": 2, "y": "z"}),
    ):
        assert other != base
        assert other.fingerprint != base.fingerprint
    assert SourceFrameKey(("id",), synthetic_count=True) == SourceFrameKey(("id",))
    for bad in (
        dict(source=()),
        dict(source="path"),
        dict(source=(["unhashable"],)),
        dict(source=("id",), columns=(1,)),
        dict(source=("id",), row_groups=(-1,)),
        dict(source=("id",), batch_rows=0),
        dict(source=("id",), decode_options={"x": []}),
    ):
        with pytest.raises(ConfigError):
            SourceFrameKey(**bad)  # type: ignore[arg-type]


def test_closed_cache_decodes_uncached(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    source.close()
    with source.get_or_decode(key("z"), Decoder(attempt), domain=attempt) as result:
        assert result.status is CheckoutStatus.UNCACHED
        assert result.diagnostics.retained is False
    assert caches.ledger(0).snapshot().cache_charged_bytes == 0


def _lead_with_one_follower(
    source: Any, name: str, attempt: Any
) -> tuple[SourceClaim, threading.Thread, list[SourceCheckout]]:
    """Claim the lead of ``name`` and start one follower waiting for it."""
    claim = source.checkout_or_claim(key(name), domain=attempt)
    assert isinstance(claim, SourceClaim)
    out: list[SourceCheckout] = []

    def follow() -> None:
        out.append(source.get_or_decode(key(name), Decoder(attempt), domain=attempt))

    follower = threading.Thread(target=follow)
    follower.start()
    _wait_for(lambda: source.stats().waits == 1)
    return claim, follower, out


class Uncopyable:
    """A value whose copy into the cache domain fails (e.g. a driver error)."""

    def __init__(self, inner: ArrayBundle, attempt: Any) -> None:
        self.inner = inner
        self.attempt = attempt  # copies into the attempt's own domain still work

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def copy_into(self, domain: Any) -> ArrayBundle:
        if domain is not self.attempt:
            raise RuntimeError("cudaErrorIllegalAddress (injected)")
        return self.inner.copy_into(domain)

    def device_arrays(self) -> tuple[Any, ...]:
        return self.inner.device_arrays()


def test_a_value_that_cannot_be_copied_is_not_retained_and_waiters_still_get_it(
    caches: Any, attempt: Any
) -> None:
    source = caches.source_cache(0)
    claim, follower, out = _lead_with_one_follower(source, "u", attempt)
    value = Uncopyable(Decoder(attempt)(), attempt)
    with claim.publish(value) as mine:
        assert mine.diagnostics.retained is False
        assert "copying into the cache domain failed (RuntimeError)" in mine.diagnostics.detail
    follower.join(10)
    (theirs,) = out
    assert theirs.status is CheckoutStatus.FOLLOWER
    np.testing.assert_array_equal(theirs.value["a"], expected())
    theirs.release()
    snap = caches.ledger(0).snapshot()
    assert snap.cache_charged_bytes == 0
    assert source.stats().abandoned == 1
    assert source.in_flight_keys() == 0


def test_an_interrupt_during_retention_abandons_the_reservation(caches: Any, attempt: Any) -> None:
    source = caches.source_cache(0)
    claim, follower, out = _lead_with_one_follower(source, "i", attempt)
    value = InterruptedCopy(Decoder(attempt)(), attempt)
    with pytest.raises(KeyboardInterrupt):
        claim.publish(value)
    follower.join(10)
    (theirs,) = out  # the waiter was woken and copied the leader's value
    np.testing.assert_array_equal(theirs.value["a"], expected())
    theirs.release()
    stats = source.stats()
    assert stats.in_flight == 0
    assert stats.abandoned == 1
    assert source.in_flight_keys() == 0
    snap = caches.ledger(0).snapshot()
    assert snap.cache_reserved_bytes == 0
    assert snap.cache_charged_bytes == 0
    assert caches.factory(0).counters().used_bytes == 0  # the interrupted copy is freed
    started = time.monotonic()
    (shutdown,) = caches.shutdown(timeout=120.0)
    assert shutdown.complete
    assert time.monotonic() - started < 60  # no wait for a reservation nobody holds


def test_checkout_resident_serves_only_a_resident_entry_and_counts_no_miss(
    caches: Any, attempt: Any
) -> None:
    source = caches.source_cache(0)
    decode = Decoder(attempt)
    assert source.checkout_resident(key("r"), domain=attempt) is None  # absent: no claim
    snap = source.event_snapshot()
    assert (snap.hits, snap.misses) == (0, 0)
    assert source.in_flight_keys() == 0
    with source.get_or_decode(key("r"), decode, domain=attempt):
        pass
    found = source.checkout_resident(key("r"), domain=attempt)
    assert found is not None
    with found:
        assert found.status is CheckoutStatus.HIT
        np.testing.assert_array_equal(found.value["a"], expected())
        assert ledger_pair(caches)[1] > 0  # pinned while checked out
    assert ledger_pair(caches)[1] == 0
    assert decode.calls == 1
    assert source.event_snapshot().hits == 1
    bypass = {next(iter(SourceBypass)).value: True}  # never served from the cache
    assert source.checkout_resident(key("r", **bypass), domain=attempt) is None
