"""Many threads pinning, releasing and admitting on one ledger keep it exact."""

from __future__ import annotations

import random
import threading

from nexus_cache.device import DeviceLedger, ResidencyState
from nexus_cache.errors import CapacityError, ManagedCapacityExceededError

from ._helpers import KIB, fill, make_caches

THREADS = 8
ROUNDS = 2_000


def _run(workers: list[threading.Thread]) -> None:
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert not worker.is_alive()


def test_pins_and_releases_from_many_threads_stay_exact() -> None:
    ledger = DeviceLedger(0, 1 << 30, 1 << 20)
    sizes = [512, 1024, 4096, 8192]
    entries = []
    for size in sizes:
        entry = ledger.reserve(size)
        entry.publish(size)
        entries.append(entry)
    total = sum(sizes)
    errors: list[BaseException] = []
    stop = threading.Event()
    start = threading.Barrier(THREADS + 1)

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        try:
            for _ in range(ROUNDS):
                entry = entries[rng.randrange(len(entries))]
                with entry.pin() as handle:
                    if rng.random() < 0.3:
                        inner = entries[rng.randrange(len(entries))].pin()
                        inner.release()
                    assert handle.entry.state is ResidencyState.PINNED
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def watch() -> None:
        start.wait()
        while not stop.is_set():
            snap = ledger.snapshot()
            if snap.cache_evictable_resident_bytes + snap.cache_pinned_in_use_bytes != total:
                errors.append(AssertionError(f"torn snapshot {snap}"))
                return

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    _run(workers)
    stop.set()
    watcher.join()
    assert errors == []
    snap = ledger.snapshot()
    assert snap.cache_pinned_in_use_bytes == 0
    assert snap.cache_evictable_resident_bytes == total
    assert all(e.pins == 0 and e.state is ResidencyState.EVICTABLE for e in entries)


def test_grants_checkouts_and_evictions_race_without_drift() -> None:
    caches = make_caches(cap=64 * KIB, capacity=96 * KIB, total=1 << 22)
    source = caches.source_cache(0)
    ledger = caches.ledger(0)
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        fill(source, key, 4 * KIB)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(300):
                action = rng.random()
                if action < 0.5:
                    handle = source.checkout(rng.choice(keys))
                    if handle is not None:
                        handle.release()
                elif action < 0.8:
                    try:
                        grant = ledger.admit_grant((seed, i), rng.choice([4, 16, 72]) * KIB)
                    except ManagedCapacityExceededError:
                        continue
                    ledger.release_grant(grant)
                else:
                    key = rng.choice(keys)
                    handle = source.checkout(key)
                    if handle is not None:
                        handle.release()
                        continue
                    try:
                        fill(source, key, 4 * KIB)  # refill what eviction took
                    except CapacityError:
                        pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    _run([threading.Thread(target=worker, args=(s,)) for s in range(THREADS)])
    assert errors == []
    snap = ledger.snapshot()
    assert snap.grant_bytes == 0
    assert snap.grant_count == 0
    assert snap.cache_reserved_bytes == 0
    assert snap.cache_retiring_bytes == 0
    assert snap.cache_pinned_in_use_bytes == 0
    domain = caches.factory(0).counters()
    assert domain.used_bytes == snap.cache_evictable_resident_bytes  # no drift
    stats = source.stats()
    assert stats.evictions > 0  # 72 KiB grants beside 32 KiB of cache must evict
    assert snap.cache_evictable_resident_bytes == stats.entries * 4 * KIB
    assert all(r.complete for r in caches.shutdown())
