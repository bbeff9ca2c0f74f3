"""Many threads, few keys, every leader outcome at random: nobody hangs, no key is
decoded twice at once, and the books close exactly."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import numpy as np

from nexus_cache.device import ArrayBundle, SourceCheckout, SourceClaim, SourceFrameKey
from nexus_cache.errors import SourceDecodeError, SourceWaitTimeoutError

from ._helpers import KIB, make_caches

THREADS = 12
ROUNDS = 60
KEYS = [SourceFrameKey(("stress", i), ("a",)) for i in range(4)]


def test_random_leader_outcomes_from_many_threads_settle_exactly() -> None:
    caches = make_caches(cap=48 * KIB, capacity=96 * KIB, total=4096 * KIB)
    source = caches.source_cache(0)
    attempt = caches.backend.create_domain(0)
    decoding: Counter[SourceFrameKey] = Counter()
    overlap: list[SourceFrameKey] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    outcomes: Counter[str] = Counter()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(ROUNDS):
                if rng.random() < 0.2:  # pressure: evict whatever is unpinned
                    caches.ledger(0).reclaim(48 * KIB)
                    outcomes["reclaim"] += 1
                    continue
                key = rng.choice(KEYS)
                try:
                    result = source.checkout_or_claim(key, domain=attempt, timeout=5.0)
                except SourceDecodeError:
                    outcomes["follower saw error"] += 1
                    continue
                except SourceWaitTimeoutError:  # pragma: no cover - 5 s is ample
                    outcomes["timeout"] += 1
                    continue
                if isinstance(result, SourceCheckout):
                    outcomes[result.status.value] += 1
                    assert int(result.value["a"][0]) == key.source[1]
                    if rng.random() < 0.5:
                        derived = result.derive(result.value.slice(0, 4))
                        result.release()
                        derived.release()
                    else:
                        result.release()
                    continue
                assert isinstance(result, SourceClaim)
                with lock:
                    decoding[key] += 1
                    if decoding[key] > 1:
                        overlap.append(key)
                time.sleep(rng.random() * 0.002)
                with lock:
                    decoding[key] -= 1
                roll = rng.random()
                if roll < 0.15:
                    result.abandon("cancelled")
                    outcomes["abandoned"] += 1
                elif roll < 0.25:
                    result.fail(ValueError("bad page"))
                    outcomes["failed"] += 1
                else:
                    size = rng.choice([4, 8, 16, 64]) * KIB  # 64 KiB never fits the cap
                    value = ArrayBundle(
                        {"a": attempt.copy_in(np.full(size, key.source[1], np.uint8))}
                    )
                    result.publish(value).release()
                    outcomes["published"] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a caller hung"
    assert errors == []
    assert overlap == []  # never two decodes of one key at once
    assert outcomes["timeout"] == 0
    assert outcomes["published"] > 0
    assert outcomes["hit"] + outcomes["follower"] > 0
    assert sum(outcomes.values()) == THREADS * ROUNDS, outcomes
    assert outcomes["abandoned"] + outcomes["failed"] > 0
    assert source.stats().evictions > 0
    assert source.in_flight_keys() == 0
    snap = caches.ledger(0).snapshot()
    stats = source.stats()
    assert snap.cache_pinned_in_use_bytes == 0
    assert snap.cache_reserved_bytes == 0
    assert snap.cache_retiring_bytes == 0
    assert stats.in_flight == 0
    assert snap.cache_evictable_resident_bytes <= 48 * KIB
    assert caches.factory(0).counters().used_bytes == snap.cache_evictable_resident_bytes
    assert stats.decode_errors == outcomes["failed"]
    assert all(r.complete for r in caches.shutdown())
