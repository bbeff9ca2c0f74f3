"""Random sequences of grants, reservations, publications, pins, releases,
evictions, faults and teardown against an independent model.

The model keeps its own idea of every entry (state, charge, pins, physical
bytes, injected fault) and of the source LRU order. After every step the
ledger buckets must equal the model's sums by state, nothing may exceed the
cap or the capacity, held pins must still be pinned, only unpinned source
entries may vanish (oldest first), a faulted entry's charge must never be
released, and admission must be closed once any teardown was unsafe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from nexus_cache.backends import round_allocation
from nexus_cache.device import PinHandle, ResidencyState, ResidentEntry
from nexus_cache.errors import (
    AdmissionClosedError,
    CacheCapExceededError,
    CapacityError,
    LifecycleError,
    ManagedCapacityExceededError,
    UnsafeTeardownError,
)

from ._helpers import KIB, FailingStream, make_caches

S = ResidencyState
CAP = 16 * KIB
CAPACITY = 24 * KIB
TOTAL = 1024 * KIB
KEYS = ("a", "b", "c", "d")
SIZES = (512, 1000, 2048, 4096, 6000)
GROWTH = (0.5, 1.0, 1.3)


@dataclass(eq=False)
class Model:
    real: ResidentEntry
    kind: str
    state: ResidencyState
    charge: int
    alloc: int
    pins: list[PinHandle] = field(default_factory=list)
    fault: str | None = None
    registered: bool = False


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.caches = make_caches(cap=CAP, capacity=CAPACITY, total=TOTAL)
        self.ledger = self.caches.ledger(0)
        self.domain = self.caches.factory(0).domain
        self.subs = {"source": self.caches.source_cache(0), "graph": self.caches.graph_cache(0)}
        self.entries: list[Model] = []
        self.lru: list[Model] = []  # registered source entries, least recently used first
        self.grants: list[Any] = []
        self.released: list[PinHandle] = []
        self.leaked: list[Any] = []
        self.grant_ids = 0

    # -- helpers ------------------------------------------------------------------

    def _pick(self, items: list[Any], index: int) -> Any:
        return items[index % len(items)]

    def _live(self, *states: ResidencyState) -> list[Model]:
        return [m for m in self.entries if m.state in states]

    def _sums(self) -> dict[ResidencyState, int]:
        sums = dict.fromkeys(S, 0)
        for m in self.entries:
            sums[m.state] += m.charge
        return sums

    def _observe_evictions(self, allowed: bool, subject: Model | None = None) -> None:
        """Fold evictions into the model, checking each one was legitimate.

        ``subject`` is the entry the call itself acts on; the caller settles it.
        """
        evictable_lru = [m for m in self.lru if m.state is S.EVICTABLE]
        evicted = [m for m in self.entries if m is not subject and m.state is not m.real.state]
        for m in evicted:
            assert allowed, f"{m.real!r} changed state outside an evicting call"
            assert m.kind == "source", "only source entries are evicted"
            assert m.registered, "only published entries are evicted"
            assert m.state is S.EVICTABLE, "only evictable entries are evicted"
            assert not m.pins, "a pinned entry was evicted"
            expected = S.QUARANTINED if m.fault else S.DESTROYED
            assert m.real.state is expected
            m.state = expected
            m.registered = False
        # least recently used first: the evicted set is a prefix of the evictable LRU
        assert set(evicted) == set(evictable_lru[: len(evicted)])
        self.lru = [m for m in self.lru if m.registered]

    def _charged_call(
        self, fn: Any, nbytes: int, kind: str, evict: bool, subject: Model | None = None
    ) -> Any:
        """Run a charging call; check its outcome against the figures around it."""
        before = self.ledger.snapshot()
        cache = before.cache_charged_bytes
        need_before = before.grant_bytes + nbytes + cache - CAPACITY
        if kind == "cache":
            need_before = max(need_before, cache + nbytes - CAP)
        try:
            result = fn()
        except (AdmissionClosedError, UnsafeTeardownError):
            self._observe_evictions(allowed=evict, subject=subject)
            assert not self.ledger.admission_open
            raise
        except CapacityError as exc:
            self._observe_evictions(allowed=evict, subject=subject)
            self._check_refusal(exc, before, need_before, nbytes, kind, evict, subject)
            raise
        self._observe_evictions(allowed=evict, subject=subject)
        return result

    def _check_refusal(
        self,
        exc: CapacityError,
        before: Any,
        need_before: int,
        nbytes: int,
        kind: str,
        evict: bool,
        subject: Model | None,
    ) -> None:
        """A refusal is legitimate only if evicting could not have made room."""
        after = self.ledger.snapshot()
        # a refused publication abandons its reservation after the refusal
        discarded = subject is not None and subject.real.state is S.DESTROYED
        cache_at_refusal = after.cache_charged_bytes + (subject.charge if discarded else 0)
        evictable_source = [m for m in self.lru if m.state is S.EVICTABLE]
        reclaimable = before.cache_evictable_resident_bytes if evict else 0
        assert need_before > reclaimable or not evictable_source, (
            f"refused although evicting could have made room: {exc}"
        )
        assert str(nbytes) in str(exc)
        if isinstance(exc, CacheCapExceededError):
            assert kind == "cache"
            assert cache_at_refusal + nbytes > CAP
        else:
            assert isinstance(exc, ManagedCapacityExceededError)
            assert after.grant_bytes + cache_at_refusal + nbytes > CAPACITY

    # -- rules ----------------------------------------------------------------------

    @rule(size=st.sampled_from((1 * KIB, 4 * KIB, 8 * KIB, 16 * KIB, 30 * KIB)))
    def admit_grant(self, size: int) -> None:
        self.grant_ids += 1
        attempt = self.grant_ids
        try:
            grant = self._charged_call(
                lambda: self.ledger.admit_grant(attempt, size), size, "grant", True
            )
        except (CapacityError, AdmissionClosedError):
            return
        self.grants.append(grant)

    @precondition(lambda self: self.grants)
    @rule(index=st.integers(0, 10**6))
    def release_grant(self, index: int) -> None:
        grant = self._pick(self.grants, index)
        self.grants.remove(grant)
        self.ledger.release_grant(grant)
        with pytest.raises(LifecycleError):
            self.ledger.release_grant(grant)

    @rule(
        kind=st.sampled_from(("source", "graph")),
        key=st.sampled_from(KEYS),
        size=st.sampled_from(SIZES),
        growth=st.sampled_from(GROWTH),
    )
    def reserve(self, kind: str, key: str, size: int, growth: float) -> None:
        sub = self.subs[kind]
        try:
            real = self._charged_call(
                lambda: sub.reserve(key, size), size, "cache", sub.evict_on_reserve
            )
        except (CapacityError, AdmissionClosedError):
            return
        nbytes = max(1, int(size * growth))
        array = self.domain.empty(nbytes, "uint8")
        real.attach({"column": array}, [array])
        del array
        self.entries.append(Model(real, kind, S.ATTEMPT_OWNED, size, round_allocation(nbytes)))

    @precondition(lambda self: self._live(S.ATTEMPT_OWNED))
    @rule(index=st.integers(0, 10**6))
    def publish(self, index: int) -> None:
        m = self._pick(self._live(S.ATTEMPT_OWNED), index)
        sub = self.subs[m.kind]
        growth = m.alloc - m.charge
        existing = sub._entries.get(m.real.key)
        try:
            winner = self._charged_call(
                lambda: sub.publish(m.real),
                growth,
                "cache",
                growth > 0 and sub.evict_on_reserve,
                subject=m,
            )
        except (CapacityError, AdmissionClosedError):
            assert growth > 0
            self._settle_discarded(m)
            return
        except UnsafeTeardownError:  # discarded (duplicate or refused) with a fault injected
            assert m.fault is not None
            assert m.real.state is S.QUARANTINED
            m.state, m.charge = S.QUARANTINED, m.real.nbytes
            return
        m.charge = m.alloc
        if winner is not m.real:  # a concurrent build of the key was published first
            assert winner is existing
            self._settle_discarded(m)
            return
        if existing is not None:  # evicted by this very publication's growth
            assert existing.state in (S.DESTROYED, S.QUARANTINED)
        m.state, m.registered = S.EVICTABLE, True
        if m.kind == "source":
            self.lru.append(m)

    def _settle_discarded(self, m: Model) -> None:
        if m.fault:
            assert m.real.state is S.QUARANTINED
            m.state = S.QUARANTINED
        else:
            assert m.real.state is S.DESTROYED
            m.state = S.DESTROYED

    @precondition(lambda self: self._live(S.ATTEMPT_OWNED))
    @rule(index=st.integers(0, 10**6))
    def abandon(self, index: int) -> None:
        m = self._pick(self._live(S.ATTEMPT_OWNED), index)
        try:
            self.subs[m.kind].abandon(m.real)
        except UnsafeTeardownError:
            assert m.fault is not None
        self._settle_discarded(m)

    @precondition(lambda self: [m for m in self.entries if m.registered])
    @rule(index=st.integers(0, 10**6))
    def checkout(self, index: int) -> None:
        m = self._pick([m for m in self.entries if m.registered], index)
        handle = self.subs[m.kind].checkout(m.real.key)
        assert handle is not None
        assert handle.entry is m.real
        assert handle.value["column"].nbytes > 0
        m.pins.append(handle)
        m.state = S.PINNED
        if m.kind == "source":
            self.lru.remove(m)
            self.lru.append(m)

    @precondition(lambda self: any(m.pins for m in self.entries))
    @rule(index=st.integers(0, 10**6))
    def release(self, index: int) -> None:
        m = self._pick([m for m in self.entries if m.pins], index)
        handle = m.pins.pop()
        handle.release()
        self.released.append(handle)
        if not m.pins:
            m.state = S.EVICTABLE

    @precondition(lambda self: self.released)
    @rule(index=st.integers(0, 10**6))
    def double_release(self, index: int) -> None:
        before = self.ledger.snapshot()
        with pytest.raises(LifecycleError):
            self._pick(self.released, index).release()
        assert self.ledger.snapshot() == before

    @precondition(lambda self: self._live(S.ATTEMPT_OWNED, S.DESTROYED, S.QUARANTINED))
    @rule(index=st.integers(0, 10**6))
    def pin_misuse(self, index: int) -> None:
        m = self._pick(self._live(S.ATTEMPT_OWNED, S.DESTROYED, S.QUARANTINED), index)
        before = self.ledger.snapshot()
        with pytest.raises(LifecycleError):
            m.real.pin()
        with pytest.raises(LifecycleError):
            m.real.destroy()  # owned by a subdomain, or already gone
        assert self.ledger.snapshot() == before

    @precondition(lambda self: self._live(S.ATTEMPT_OWNED, S.EVICTABLE, S.PINNED))
    @rule(index=st.integers(0, 10**6), fault=st.sampled_from(("sync", "leak")))
    def inject_fault(self, index: int, fault: str) -> None:
        m = self._pick(self._live(S.ATTEMPT_OWNED, S.EVICTABLE, S.PINNED), index)
        if m.fault:
            return
        m.fault = fault
        if fault == "sync":
            m.real.record_stream(FailingStream())
        else:  # a holder keeps the array past every release
            self.leaked.append(m.real._payload["column"])

    @rule(size=st.sampled_from((1, 2 * KIB, 8 * KIB)))
    def reclaim(self, size: int) -> None:
        self.ledger.reclaim(size)
        self._observe_evictions(allowed=True)

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def ledger_matches_model(self) -> None:
        snap = self.ledger.snapshot()
        sums = self._sums()
        assert snap.grant_bytes == sum(g.nbytes for g in self.grants)
        assert snap.cache_reserved_bytes == sums[S.ATTEMPT_OWNED]
        assert snap.cache_evictable_resident_bytes == sums[S.EVICTABLE]
        assert snap.cache_pinned_in_use_bytes == sums[S.PINNED]
        assert snap.cache_retiring_bytes == 0
        assert snap.cache_quarantined_bytes == sums[S.QUARANTINED]
        assert snap.cache_charged_bytes <= CAP
        assert snap.grant_bytes + snap.cache_charged_bytes <= CAPACITY
        assert sums[S.DESTROYING] == 0
        quarantined = any(m.state is S.QUARANTINED for m in self.entries)
        assert snap.admission_open == (not quarantined)

    @invariant()
    def entries_match_model(self) -> None:
        for m in self.entries:
            assert m.real.state is m.state, (m.real, m.state)
            assert m.real.pins == len(m.pins)
            if m.pins:
                assert m.real.state is S.PINNED
            if m.fault:
                assert m.real.state is not S.DESTROYED  # charge kept when unsafe

    @invariant()
    def domain_matches_model(self) -> None:
        live = sum(m.alloc for m in self.entries if m.state is not S.DESTROYED)
        counters = self.domain.counters()
        assert counters.used_bytes == live
        info = self.caches.backend.mem_info(0)
        assert info.free_bytes == TOTAL - counters.held_bytes

    def teardown(self) -> None:
        pinned = {id(m) for m in self.entries if m.pins and m.registered}
        first = self.caches.shutdown(timeout=0.0)[0]
        if pinned:
            assert not first.complete
            assert first.graph.still_pinned + first.source.still_pinned == len(pinned)
        for m in self.entries:
            while m.pins:
                m.pins.pop().release()
            if m.real.state is S.ATTEMPT_OWNED:  # builders give their reservations up
                try:
                    self.subs[m.kind].abandon(m.real)
                except UnsafeTeardownError:
                    assert m.fault is not None
        result = self.caches.shutdown(timeout=1.0)[0]
        faulted = [m for m in self.entries if m.fault]
        assert all(m.real.state is S.QUARANTINED for m in faulted)
        snap = self.ledger.snapshot()
        if not faulted:
            assert result.complete
            assert result.domain_released
            assert snap.cache_charged_bytes == 0
            assert self.caches.backend.mem_info(0).free_bytes == TOTAL
        else:
            assert not result.complete
            assert not result.domain_released
            assert snap.cache_quarantined_bytes == sum(m.charge for m in faulted)
            assert snap.unsafe_teardowns == len(faulted)
        self.leaked.clear()


LedgerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerStateMachine = LedgerMachine.TestCase
