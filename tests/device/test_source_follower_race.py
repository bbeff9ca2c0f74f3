"""A follower copies the leader's value when the cache did not retain it; the
leader's attempt may release that value as soon as the leader has it back.

The interleaving is forced, not slept for: the follower's copy blocks on an
event after it has taken the leader's value, and the leader's caller releases
its value the moment ``publish`` returns (as the query service releases an
attempt's frames when the attempt ends). A 1 KiB cache cap keeps every value
out of the cache.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.backends.host import HostAllocationDomain
from nexus_cache.device import ArrayBundle, CheckoutStatus, SourceCheckout, SourceFrameKey
from nexus_cache.device.source.claim import DecodeFlight, FlightState
from nexus_cache.errors import LifecycleError, SourceWaitTimeoutError
from nexus_cache.frames import DeviceFrame

from ._helpers import KIB, make_caches

ENTRY = 16 * KIB
KEY = SourceFrameKey(("lakehouse", "local", "race", "etag-1"), ("a",), (0,))


def expected() -> np.ndarray:
    return (np.arange(ENTRY) % 251).astype(np.uint8)


class AttemptValue:
    """An attempt-owned ``DeviceValue``: :meth:`release` drops its arrays, after
    which copying it raises ``LifecycleError``. A copy into ``gated`` announces
    itself on ``copy_started`` and then waits for ``gate``."""

    __slots__ = ("__weakref__", "_bundle", "copy_started", "gate", "gated")

    def __init__(self, domain: Any, gated: Any) -> None:
        self._bundle: ArrayBundle | None = ArrayBundle({"a": domain.copy_in(expected())})
        self.gated = gated
        self.copy_started = threading.Event()
        self.gate = threading.Event()

    @property
    def nbytes(self) -> int:
        return self._live().nbytes

    def copy_into(self, domain: Any) -> ArrayBundle:
        if domain is self.gated:
            self.copy_started.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return self._live().copy_into(domain)

    def device_arrays(self) -> tuple[Any, ...]:
        return self._live().device_arrays()

    def release(self) -> None:
        self._bundle = None

    def _live(self) -> ArrayBundle:
        if self._bundle is None:
            raise LifecycleError("this frame was released")
        return self._bundle


class GatedDomain(HostAllocationDomain):
    """A host domain whose first look at ``host_memory`` (the first thing
    ``DeviceFrame.copy_into`` does) announces itself and waits for ``gate``."""

    def __init__(self, backend: Any, device_id: int) -> None:
        super().__init__(backend, device_id)
        self.copy_started = threading.Event()
        self.gate = threading.Event()
        self._armed = True

    @property
    def host_memory(self) -> bool:
        if self._armed:
            self._armed = False
            self.copy_started.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return super().host_memory


class Race:
    """A cold key with a claimed leader and one follower waiting in ``follower``."""

    def __init__(self, *, gated_follower: bool = False) -> None:
        self.caches = make_caches(cap=1 * KIB, capacity=128 * KIB, total=1024 * KIB)
        self.source = self.caches.source_cache(0)
        backend = self.caches.backend
        self.leader_domain = backend.create_domain(0)
        self.follower_domain: Any = (
            GatedDomain(backend, 0) if gated_follower else backend.create_domain(0)
        )
        self.claim = self.source.checkout_or_claim(KEY, domain=self.leader_domain)
        self.decodes = 0
        self.out: list[SourceCheckout] = []
        self.errors: list[BaseException] = []
        self.leader_retained: list[bool | None] = []
        self.leader_done = threading.Event()
        self.follower = threading.Thread(target=self._follow)
        self.follower.start()
        for _ in range(5000):  # until the follower waits inside the flight
            if self.source.stats().waits:
                break
            assert self.follower.is_alive()
            time.sleep(0.002)
        assert self.source.stats().waits == 1

    def _decode(self) -> ArrayBundle:
        self.decodes += 1
        return ArrayBundle({"a": self.follower_domain.copy_in(expected())})

    def _follow(self) -> None:
        try:
            self.out.append(
                self.source.get_or_decode(KEY, self._decode, domain=self.follower_domain)
            )
        except BaseException as exc:
            self.errors.append(exc)

    def lead(self, box: list[Any]) -> threading.Thread:
        """Publish ``box``'s value in a thread, then release it at once (attempt end)."""

        def run() -> None:
            value = box.pop()
            with self.claim.publish(value) as mine:
                self.leader_retained.append(mine.diagnostics.retained)
            value.release()
            self.leader_done.set()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def settle(self, *threads: threading.Thread) -> None:
        for thread in (self.follower, *threads):
            thread.join(10)
            assert not thread.is_alive()
        assert self.source.in_flight_keys() == 0
        assert self.caches.ledger(0).snapshot().cache_charged_bytes == 0


def test_follower_copies_under_the_flight_keepalive_not_after_the_leader_released() -> None:
    race = Race()
    value = AttemptValue(race.leader_domain, gated=race.follower_domain)
    alive = weakref.ref(value)
    leader = race.lead([value])
    del value
    assert alive().copy_started.wait(10)  # the follower holds the leader's value, mid-copy
    # before the fix the leader's publish returned here and its attempt released the value
    published_mid_copy = race.leader_done.wait(0.2)
    alive().gate.set()
    race.settle(leader)
    assert race.errors == []
    assert not published_mid_copy, "publish returned while a follower was copying its value"
    (theirs,) = race.out
    assert theirs.status is CheckoutStatus.FOLLOWER
    assert theirs.diagnostics.retained is False
    assert race.leader_retained == [False]
    assert race.decodes == 0  # exactly one decode: the leader's
    gc.collect()
    assert alive() is None  # the flight let go of the leader's value
    np.testing.assert_array_equal(theirs.value["a"], expected())  # an independent copy
    theirs.release()


def test_device_frame_follower_survives_the_leader_releasing_its_frame() -> None:
    race = Race(gated_follower=True)
    gated = race.follower_domain
    table = pa.table({"a": pa.array(expected()), "s": pa.array([str(i) for i in range(ENTRY)])})
    frame = DeviceFrame.from_arrow(table, domain=race.leader_domain)
    leader = race.lead([frame])
    assert gated.copy_started.wait(10)
    published_mid_copy = race.leader_done.wait(0.2)
    gated.gate.set()
    race.settle(leader)
    assert race.errors == []
    assert not published_mid_copy
    assert frame.released  # the leader's attempt did release it
    (theirs,) = race.out
    assert theirs.status is CheckoutStatus.FOLLOWER
    assert theirs.value.domain is gated
    assert theirs.value.to_arrow().equals(table)
    theirs.release()


def test_value_released_behind_the_flight_makes_the_follower_decode_itself() -> None:
    race = Race()
    value = AttemptValue(race.leader_domain, gated=race.follower_domain)
    leader = race.lead([value])
    assert value.copy_started.wait(10)
    # the attempt is torn down by another thread while the leader is still publishing
    value.release()
    value.gate.set()
    race.settle(leader)
    assert race.errors == []  # never an error for a successful leader
    (theirs,) = race.out
    assert theirs.status is CheckoutStatus.LEADER  # it led a fresh flight and decoded
    assert race.decodes == 1
    np.testing.assert_array_equal(theirs.value["a"], expected())
    assert race.leader_retained == [False]
    kinds = [e.kind for e in race.source.event_snapshot().events]
    assert "leader_handoff" in kinds
    theirs.release()


def test_a_follower_that_timed_out_does_not_hold_the_leader() -> None:
    caches = make_caches(cap=1 * KIB, capacity=128 * KIB, total=1024 * KIB)
    source = caches.source_cache(0)
    attempt = caches.backend.create_domain(0)
    claim = source.checkout_or_claim(KEY, domain=attempt)
    with pytest.raises(SourceWaitTimeoutError):
        source.checkout_or_claim(KEY, domain=attempt, timeout=0.01)
    value = AttemptValue(attempt, gated=None)
    done: list[bool | None] = []
    leader = threading.Thread(
        target=lambda: done.append(claim.publish(value).diagnostics.retained)
    )
    leader.start()
    leader.join(10)
    assert not leader.is_alive(), "publish waited for a follower that had timed out"
    assert done == [False]
    value.release()
    assert source.in_flight_keys() == 0


def test_flight_drops_the_value_after_the_last_copier_and_refuses_extra_copies() -> None:
    lock = threading.Lock()
    flight = DecodeFlight("f", lock)
    states: list[Any] = []

    def wait() -> None:
        with lock:
            states.append(flight.await_outcome(time.monotonic() + 10))

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    for _ in range(5000):  # until both wait inside the flight
        with lock:
            if flight.waiters == 2:
                break
        time.sleep(0.002)
    value = object()
    with lock:
        assert flight.waiters == 2
        flight.finish(value)
        assert (flight.copiers, flight.value) == (2, value)
    for waiter in waiters:
        waiter.join(10)
    with lock:
        assert states == [FlightState.PUBLISHED] * 2
        flight.copied()
        assert flight.value is value  # one copier left: still held
        flight.copied()
        assert (flight.copiers, flight.value) == (0, None)
        flight.await_copies()  # returns at once
        with pytest.raises(LifecycleError, match="no copier left"):
            flight.copied()


def test_publish_with_nobody_waiting_holds_nothing() -> None:
    lock = threading.Lock()
    flight = DecodeFlight("g", lock)
    with lock:  # as the subdomain calls it
        flight.finish(object())
        assert (flight.copiers, flight.value) == (0, None)
        flight.await_copies()  # returns at once
