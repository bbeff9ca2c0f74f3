"""A bounded map that forgets its least recently used entry first.

The small memories of a process (what a query needed, parsed footers, table
snapshots, which device holds a source) are kept in one: thread-safe, a
lookup counts as a use, and an insert past the capacity drops the oldest.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["BoundedLRU"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """At most ``capacity`` entries, the least recently used forgotten first.

    Example::

        memory: BoundedLRU[str, int] = BoundedLRU(2)
        memory.put("a", 1)
        memory.get("a")  # 1
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a bounded map holds at least 1 entry, not {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Store ``value`` under ``key``; the oldest entries go past the capacity."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its value, or None."""
        with self._lock:
            return self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
