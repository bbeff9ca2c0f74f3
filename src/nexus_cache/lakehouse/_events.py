"""Read diagnostics and structured fill events of the lakehouse cache.

Every read reports a :class:`ReadDiagnostics` (cache status, read mode, fill mode).
Fills and the decisions around them emit :class:`CacheEvent` values. Both go to an
:class:`EventLog`: bounded ring buffers (old events fall off), the ``logging``
logger ``nexus_cache.lakehouse``, and an optional callback. Background failures are
therefore never silent, and no amount of traffic grows memory.

Log levels: failed fills at WARNING, other events at INFO, each read's
diagnostics at DEBUG, or at INFO with ``log_reads`` (``NEXUS_LAKEHOUSE_LOG_READS=1``)
as one line: ``lakehouse read <location>: <status> <read mode> fill=<fill mode>``.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode

__all__ = ["CacheEvent", "EventKind", "EventLog", "ReadDiagnostics", "summarize_counts"]

logger = logging.getLogger("nexus_cache.lakehouse")


class EventKind(str, enum.Enum):
    """Kinds of :class:`CacheEvent`.

    Examples
    --------
    >>> from nexus_cache.lakehouse import EventKind
    >>> EventKind("fill_completed") is EventKind.FILL_COMPLETED
    True
    """

    #: an entry was published (``nbytes`` bytes)
    FILL_COMPLETED = "fill_completed"
    #: a fill started and failed; no entry was left (``reason``: enospc, edquot, io,
    #: validation, stale, ...); the read, if any, was served remotely
    FILL_FAILED = "fill_failed"
    #: a fill was not started (``reason``: no_budget, in_progress, too_large, shutdown)
    FILL_SKIPPED = "fill_skipped"
    #: a blocking fill gave up waiting (lock or budget) and the read went remote
    FILL_TIMEOUT = "fill_timeout"
    #: an entry was found damaged (truncated, resized, wrong digest) and removed
    ENTRY_REMOVED = "entry_removed"
    #: an entry could not be trusted (owned by another user, not a regular file);
    #: the read went remote, the entry stays for ``verify``
    ENTRY_REFUSED = "entry_refused"
    #: a planned read was rejected at execution
    STALE_PLAN = "stale_plan"
    #: the cache root could not be created (``reason``: enospc, edquot); every
    #: read of this cache goes remote (reason ``root_unavailable``)
    ROOT_UNAVAILABLE = "root_unavailable"


@dataclasses.dataclass(frozen=True)
class ReadDiagnostics:
    """What one read did; attached to every read handle and logged.

    Parameters
    ----------
    location : str
        The object read, as the caller named it.
    cache_status : CacheStatus
        How the cache answered.
    read_mode : ReadMode
        Where the bytes came from.
    fill_mode : FillMode
        What fill the read triggered.
    key : str or None, optional
        The cache entry's key (None without a proven identity).
    size : int or None, optional
        The object's size in bytes.
    reason : str or None, optional
        Why the read bypassed or was stale.
    time : float, optional
        When the read was planned (``time.time()``).

    Examples
    --------
    >>> from nexus_cache.lakehouse import CacheStatus, FillMode, ReadDiagnostics, ReadMode
    >>> d = ReadDiagnostics("s3://b/k", CacheStatus.HIT, ReadMode.LOCAL, FillMode.NONE, size=10)
    >>> d.describe()
    's3://b/k: hit local fill=none'
    >>> d.to_dict()["cache_status"]
    'hit'
    """

    location: str
    cache_status: CacheStatus
    read_mode: ReadMode
    fill_mode: FillMode
    key: str | None = None
    size: int | None = None
    reason: str | None = None
    #: wall-clock time the read was planned (``time.time()``)
    time: float = dataclasses.field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("cache_status", "read_mode", "fill_mode"):
            out[name] = out[name].value
        return out

    def describe(self) -> str:
        """One human line: location, status, read mode, fill mode, reason."""
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"{self.location}: {self.cache_status.value} {self.read_mode.value} "
            f"fill={self.fill_mode.value}{why}"
        )


@dataclasses.dataclass(frozen=True)
class CacheEvent:
    """A structured fill event (completion, failure, skip, ...).

    Parameters
    ----------
    kind : EventKind
        What happened.
    key, location : str or None
        The entry's key and the object's location.
    fill_mode : FillMode, optional
        The fill's mode.
    nbytes : int, optional
        The bytes filled.
    duration_s : float, optional
        How long the fill took.
    reason, error : str or None, optional
        Why it was skipped or refused, and the error of a failure.
    pid : int, optional
        The process (default: this one).
    time : float, optional
        When it happened (``time.time()``).

    Examples
    --------
    >>> from nexus_cache.lakehouse import CacheEvent, EventKind, FillMode
    >>> event = CacheEvent(EventKind.FILL_COMPLETED, "k1", "s3://b/k", FillMode.BACKGROUND, 498)
    >>> event.to_dict()["kind"], event.nbytes
    ('fill_completed', 498)
    """

    kind: EventKind
    key: str | None
    location: str | None
    fill_mode: FillMode = FillMode.NONE
    nbytes: int = 0
    duration_s: float = 0.0
    reason: str | None = None
    error: str | None = None
    pid: int = dataclasses.field(default_factory=os.getpid)
    time: float = dataclasses.field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["kind"] = self.kind.value
        out["fill_mode"] = self.fill_mode.value
        return out


_Callback = Callable[["CacheEvent | ReadDiagnostics"], None]


class EventLog:
    """Bounded record of events and read diagnostics. Thread-safe.

    ``callback`` receives each event and each read's diagnostics on the thread
    that produced it; an exception it raises is logged and otherwise ignored, so
    a faulty observer cannot fail a read or a fill.

    Every :class:`LakehouseCache` keeps one as ``cache.events``.

    Parameters
    ----------
    capacity : int, optional
        How many events, and how many reads, are kept (the oldest drop out).
    callback : callable or None, optional
        Called with each event and each read's diagnostics.
    log_reads : bool, optional
        Log each read at INFO instead of DEBUG.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache:
    ...     cache.read(source)[:4]
    ...     [d.cache_status.value for d in cache.events.reads()]
    b'PAR1'
    ['miss']
    >>> tmp.cleanup()
    """

    def __init__(
        self, capacity: int = 1024, callback: _Callback | None = None, *, log_reads: bool = False
    ) -> None:
        self._read_level = logging.INFO if log_reads else logging.DEBUG
        self._lock = threading.Lock()
        self._events: collections.deque[CacheEvent] = collections.deque(maxlen=capacity)
        self._reads: collections.deque[ReadDiagnostics] = collections.deque(maxlen=capacity)
        self._counts: collections.Counter[str] = collections.Counter()
        self.callback = callback

    def emit(self, event: CacheEvent) -> None:
        with self._lock:
            self._events.append(event)
            self._counts[event.kind.value] += 1
        level = logging.WARNING if event.kind is EventKind.FILL_FAILED else logging.INFO
        if logger.isEnabledFor(level):
            logger.log(level, "lakehouse %s", event.to_dict())
        self._notify(event)

    def record_read(
        self, diag: ReadDiagnostics | None = None, /, **fields: Any
    ) -> ReadDiagnostics:
        """Record one read's diagnostics: ``diag``, or those made of ``fields``
        (the :class:`ReadDiagnostics` fields); returns them."""
        if diag is None:
            diag = ReadDiagnostics(**fields)
        with self._lock:
            self._reads.append(diag)
            self._counts[f"read.{diag.cache_status.value}"] += 1
            self._counts[f"read_mode.{diag.read_mode.value}"] += 1
            self._counts[f"fill_mode.{diag.fill_mode.value}"] += 1
        if logger.isEnabledFor(self._read_level):
            logger.log(self._read_level, "lakehouse read %s", diag.describe())
        self._notify(diag)
        return diag

    def _after_fork_in_child(self) -> None:
        # What the cache did before a fork is the parent's to report; a child
        # that kept it would count it again in read_stats(). Its lock may have
        # been held.
        self._lock = threading.Lock()
        self._events.clear()
        self._reads.clear()
        self._counts.clear()

    def _notify(self, item: CacheEvent | ReadDiagnostics) -> None:
        callback = self.callback
        if callback is None:
            return
        try:
            callback(item)
        except Exception:
            logger.exception("lakehouse event callback failed on %r", item)

    def events(self, kind: EventKind | str | None = None) -> list[CacheEvent]:
        """The retained events, oldest first, optionally of one kind."""
        with self._lock:
            items = list(self._events)
        if kind is None:
            return items
        kind = EventKind(kind)
        return [e for e in items if e.kind is kind]

    def reads(self) -> list[ReadDiagnostics]:
        """The retained read diagnostics, oldest first."""
        with self._lock:
            return list(self._reads)

    def counts(self) -> dict[str, int]:
        """Totals since creation (not bounded by the ring): events by kind, reads by field."""
        with self._lock:
            return dict(self._counts)


def summarize_counts(counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """Group :meth:`EventLog.counts` into ``reads``, ``read_modes``, ``fill_modes``, ``events``.

    Every known status, mode and event kind is present (zero when none), so a
    reader of the summary never needs to guess a missing key.
    """
    reads = {s.value: counts.get(f"read.{s.value}", 0) for s in CacheStatus}
    reads["total"] = sum(reads.values())
    return {
        "reads": reads,
        "read_modes": {m.value: counts.get(f"read_mode.{m.value}", 0) for m in ReadMode},
        "fill_modes": {m.value: counts.get(f"fill_mode.{m.value}", 0) for m in FillMode},
        "events": {k.value: counts.get(k.value, 0) for k in EventKind},
    }
