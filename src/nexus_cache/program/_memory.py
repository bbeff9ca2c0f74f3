"""In-process LRU program cache."""

from __future__ import annotations

import threading
from collections import OrderedDict

from nexus_cache.program._caps import validate_cap
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    value_to_store,
)

__all__ = ["InMemoryProgramCache"]


class InMemoryProgramCache(ProgramCacheResource):
    """A least-recently-used mapping held in this process's memory.

    Thread-safe: one lock serialises every operation (each is O(1) and
    short, so threads sharing one cache wait microseconds). Not shared
    between processes and not persistent. Values are stored as immutable
    ``bytes`` copies, so mutating the buffer you passed in, or the bytes you
    got back, never changes the cached entry.

    ``max_size_bytes`` caps the sum of entry sizes and ``max_entries`` the
    number of entries; on a store the least recently used entries are evicted
    until both hold. An entry larger than ``max_size_bytes`` on its own is not
    stored (an older entry under the same key is dropped, since it was
    superseded), evicts nothing else, and is counted in ``stats().oversize``.
    """

    def __init__(
        self, max_size_bytes: int | str | None = None, max_entries: int | None = None
    ) -> None:
        self._max_bytes = validate_cap("max_size_bytes", max_size_bytes)
        self._max_entries = validate_cap("max_entries", max_entries)
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counts = OpCounters()

    @property
    def max_size_bytes(self) -> int | None:
        return self._max_bytes

    @property
    def max_entries(self) -> int | None:
        return self._max_entries

    def __getitem__(self, key: bytes | str) -> bytes:
        k = as_key_bytes(key)
        with self._lock:
            try:
                value = self._data[k]
            except KeyError:
                self._counts.miss()
                raise KeyError(key) from None
            self._data.move_to_end(k)
            self._counts.hit()
            return value

    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        k = as_key_bytes(key)
        v = value_to_store(value)  # outside the lock: may read a file
        size = len(v)
        cap = self._max_bytes
        with self._lock:
            old = self._data.pop(k, None)
            if old is not None:
                self._bytes -= len(old)
            if cap is not None and size > cap:
                oversize = True
            else:
                oversize = False
                self._data[k] = v
                self._bytes += size
                self._counts.stored()
                self._evict_locked()
        if oversize:
            self._counts.skipped_oversize(self, size, cap or 0)

    def _evict_locked(self) -> None:
        data = self._data
        max_bytes, max_entries = self._max_bytes, self._max_entries
        while data and (
            (max_bytes is not None and self._bytes > max_bytes)
            or (max_entries is not None and len(data) > max_entries)
        ):
            _, old = data.popitem(last=False)
            self._bytes -= len(old)
            self._counts.evicted(1)

    def __delitem__(self, key: bytes | str) -> None:
        k = as_key_bytes(key)
        with self._lock:
            try:
                old = self._data.pop(k)
            except KeyError:
                raise KeyError(key) from None
            self._bytes -= len(old)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return self._counts.snapshot(len(self._data), self._bytes)

    def __repr__(self) -> str:
        return (
            f"InMemoryProgramCache(max_size_bytes={self._max_bytes}, "
            f"max_entries={self._max_entries})"
        )
