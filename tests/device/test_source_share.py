"""A host decode published with ``share=True`` becomes the source cache's entry with
no copy: the entry's buffers are read-only twins of the decode's memory, booked by
the cache's domain, and each side lives on its own (the decode released, the entry
reads the same values; the entry torn down, the decode's arrays still hold theirs).
Without ``share`` (the default: a publisher that may write its value again) the
entry is a copy."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.device import SourceClaim, SourceFrameKey
from nexus_cache.frames import DeviceFrame

from ._helpers import KIB, make_caches

ROWS = 1000


def _table() -> pa.Table:
    return pa.table(
        {
            "a": pa.array(np.arange(ROWS, dtype=np.int64)),
            "b": pa.array([None if i % 3 == 0 else i / 2 for i in range(ROWS)], pa.float64()),
            "s": pa.array([f"v{i}" for i in range(ROWS)]),
        }
    )


def _key() -> SourceFrameKey:
    return SourceFrameKey(("lakehouse", "local", "t", "etag-1"), ("a", "b", "s"), (0,))


@pytest.fixture
def caches() -> Any:
    caches = make_caches(cap=256 * KIB, capacity=512 * KIB, total=4096 * KIB)
    yield caches
    caches.shutdown(timeout=1.0)  # raises if an entry's memory was not provably idle


def _buffers(frame: DeviceFrame) -> list[np.ndarray]:
    return [b for c in frame.columns for b in (c.validity, c.data, c.offsets) if b is not None]


@pytest.mark.parametrize("share", [True, False])
def test_a_published_host_decode_is_shared_only_when_the_publisher_says_so(
    caches: Any, share: bool
) -> None:
    attempt = caches.backend.create_domain(0)
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(_key(), domain=attempt, timeout=5)
    assert isinstance(claim, SourceClaim)
    decoded = DeviceFrame.from_arrow(_table(), domain=attempt)
    cache_domain = source._factory.domain
    claim.publish(decoded, share=share)
    hit = source.checkout_resident(_key(), domain=attempt, borrow=True)
    assert hit is not None
    entry = hit.value
    pairs = list(zip(_buffers(entry), _buffers(decoded), strict=True))
    assert len(pairs) == 5  # a: data; b: validity, data; s: data, offsets
    assert [np.shares_memory(e, d) for e, d in pairs] == [share] * len(pairs)
    assert [e.flags.writeable for e, _ in pairs] == [not share] * len(pairs)
    assert cache_domain.counters().used_bytes > 0  # the cache's domain books the entry
    assert entry.to_arrow().equals(_table())
    hit.release()
    # the decode goes; the entry's values stay
    decoded.release()
    del decoded, pairs, entry
    gc.collect()
    assert attempt.counters().used_bytes == 0
    again = source.checkout_resident(_key(), domain=attempt)
    assert again is not None
    assert again.value.to_arrow().equals(_table())
    again.value.release()
    again.release()
    gc.collect()
    assert attempt.counters().used_bytes == 0
    attempt.close()


def test_a_shared_entry_torn_down_leaves_the_decode_its_values(caches: Any) -> None:
    attempt = caches.backend.create_domain(0)
    source = caches.source_cache(0)
    claim = source.checkout_or_claim(_key(), domain=attempt, timeout=5)
    assert isinstance(claim, SourceClaim)
    decoded = DeviceFrame.from_arrow(_table(), domain=attempt)
    kept = decoded.column("a").data  # as a result handed the decode's buffer would
    claim.publish(decoded, share=True)
    cache_domain = source._factory.domain
    assert cache_domain.counters().used_bytes > 0
    caches.shutdown(timeout=1.0)  # the entry torn down, its memory proven unreferenced
    assert cache_domain.counters().used_bytes == 0
    junk = [np.frombuffer(pa.allocate_buffer(ROWS * 8), np.uint8) for _ in range(32)]
    for block in junk:
        block.fill(0xAB)
    assert kept.tolist() == list(range(ROWS))
    assert decoded.to_arrow().equals(_table())
    decoded.release()
    del kept, decoded
    gc.collect()
    assert attempt.counters().used_bytes == 0
    attempt.close()
