"""Bounded, fingerprinted load and promotion events of a source cache.

Events name a key only by its fingerprint (never the source identity, which
may hold paths or credentials) and an error only by its class name.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "SOURCE_EVENT_KINDS",
    "SOURCE_EVENT_LIMIT",
    "SourceCacheEvent",
    "SourceEventLog",
    "SourceEventSnapshot",
]

#: Events kept per device; older ones are dropped (and counted).
SOURCE_EVENT_LIMIT = 256

#: ``load``: a leader decoded a frame; ``promotion``: it was copied into the
#: cache and published; ``promotion_skipped``: it was not retained (capacity
#: pressure, allocation failure); ``load_failed``: the leader's decode failed
#: for every waiter; ``leader_handoff``: a leader gave up for its own reason
#: with followers waiting; ``eviction``: an entry was evicted (LRU).
SOURCE_EVENT_KINDS = (
    "load",
    "promotion",
    "promotion_skipped",
    "load_failed",
    "leader_handoff",
    "eviction",
)


@dataclass(frozen=True)
class SourceCacheEvent:
    """One load or promotion event. ``at`` is wall-clock time (``time.time()``)."""

    sequence: int
    at: float
    kind: str
    fingerprint: str
    nbytes: int = 0
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SourceEventSnapshot:
    """The recent events of one device's source cache with its activity counters."""

    device_id: int
    events: tuple[SourceCacheEvent, ...]
    dropped_events: int
    hits: int
    misses: int
    waits: int
    leader_retries: int
    skipped_retentions: int
    evictions: int

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["events"] = [event.to_dict() for event in self.events]
        return row


class SourceEventLog:
    """A ring of the last ``limit`` events. Thread-safe."""

    def __init__(self, limit: int = SOURCE_EVENT_LIMIT) -> None:
        self._events: deque[SourceCacheEvent] = deque(maxlen=limit)
        self._sequence = itertools.count(1)
        self._dropped = 0
        self._lock = threading.Lock()

    def record(
        self,
        kind: str,
        fingerprint: str,
        *,
        nbytes: int = 0,
        seconds: float = 0.0,
        detail: str = "",
    ) -> None:
        if kind not in SOURCE_EVENT_KINDS:
            raise ValueError(f"unknown source event kind {kind!r}")
        with self._lock:
            if len(self._events) == self._events.maxlen:
                self._dropped += 1
            self._events.append(
                SourceCacheEvent(
                    next(self._sequence), time.time(), kind, fingerprint, nbytes, seconds, detail
                )
            )

    def snapshot(self) -> tuple[tuple[SourceCacheEvent, ...], int]:
        """``(events oldest first, events dropped so far)``."""
        with self._lock:
            return tuple(self._events), self._dropped
