"""Admission: how an attempt is sized, which device it goes to, how it waits.

The whole rule of letting an attempt onto a device lives here:

* **Sizing** (:func:`estimate_grant`, :func:`fit_grant`): a scan asks for its
  Parquet bytes times ``grant_expansion``; a graph query for its decoded
  edges, the uncached build and the result, from the Parquet footers' edge
  count; a count for ``min_grant_bytes``. Never less than ``min_grant_bytes``
  nor than the floor a retry after :class:`GrantExhaustedError` sets (twice
  what the exhausted attempt needed). A query that had to be retried for its
  grant asks, the next time it runs, for what it needed then
  (:class:`GrantMemory`), so a warm query is not retried each time. An
  estimate past what the chosen device can ever free is lowered to that,
  since the query may need far less.
* **Placement** (:meth:`Admission.place`): the device the caller pinned; else
  the device whose caches already hold the query's source (they hit there),
  when its admission is open and it has room; else the device with the most
  free managed bytes (lowest id on ties). The result is a frozen
  :class:`Attempt`.
* **Waiting** (:meth:`Admission.admit`): the ledger decides (the capacity
  equation in ``docs/device.md``); this module adds the order and the bounded
  wait. Grants are admitted **first come, first served per device**: a request
  that arrives while older ones wait queues behind them, so a stream of small
  grants cannot starve a large one that fits the device alone. The oldest
  waiter is tried whenever a grant of this service is released, and at least
  every :data:`POLL_INTERVAL_S` (cache bytes freed by eviction or shutdown are
  not announced), until the attempt's deadline; then :class:`AdmissionError`
  names the request, the managed capacity, the grants, the cache bytes, the
  free capacity and the wait. A request larger than what the device can ever
  free (its ``ceiling``: the managed capacity, less what stays resident) fails
  at once with :class:`GrantTooLargeError`: no wait could make it fit. An
  attempt whose cancel event is set leaves the queue within
  :data:`POLL_INTERVAL_S` with :class:`QueryCancelledError`.
* **The log**: each decision (``admitted``, ``admitted_after_wait``,
  ``refused``, ``closed``, ``cancelled``) appends one line to the admission
  TSV; a grant whose decision cannot be logged (disk full, the log replaced by
  a symlink), or that an interrupt (Ctrl-C) meets before it reaches the
  caller, is released before the error is raised.

Thread-safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._lru import BoundedLRU
from nexus_cache._sizes import format_size
from nexus_cache.device import DeviceLedger, Grant, LedgerSnapshot
from nexus_cache.errors import (
    AdmissionClosedError,
    AdmissionError,
    CapacityError,
    GrantTooLargeError,
    LifecycleError,
    QueryCancelledError,
)
from nexus_cache.graph.memory import build_bytes, result_bytes
from nexus_cache.service._graph_port import graph_options
from nexus_cache.service.evidence import AdmissionLog
from nexus_cache.service.queries import Count, GraphQuery, Query

if TYPE_CHECKING:
    from nexus_cache.device import DeviceResidentCaches
    from nexus_cache.service._lake import SourcePlan

__all__ = [
    "POLL_INTERVAL_S",
    "Admission",
    "Attempt",
    "GrantMemory",
    "check_cancelled",
    "estimate_grant",
    "fit_grant",
]

#: longest pause between two tries of a waiting grant (and between two looks
#: at a waiting attempt's cancel event)
POLL_INTERVAL_S = 0.05
#: sources whose device is remembered (the oldest is forgotten first)
_MAX_HOMES = 4096
# A graph attempt holds the edge table plus the CSR, its transpose or
# symmetrized copy, and the algorithm's vectors: about twice a scan's bytes.
_GRAPH_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of a query as admission sees it: where it goes, what it asks
    for, until when it may wait, and the caller's cancel event."""

    query_id: str
    #: 1 for the first attempt of the query, 2 for its first retry, ...
    number: int
    device_id: int
    #: the grant asked for (the attempt's estimate, fitted to the device)
    grant_bytes: int
    #: ``time.monotonic()`` after which a waiting grant is refused
    deadline: float
    cancel: threading.Event | None = None

    @property
    def attempt_id(self) -> str:
        return f"{self.query_id}-{self.number}"

    def check_cancelled(self, where: str) -> None:
        """Raise :class:`QueryCancelledError` when the cancel event is set."""
        check_cancelled(self.cancel, self.query_id, where)


def check_cancelled(cancel: threading.Event | None, query_id: str, where: str) -> None:
    """Raise :class:`QueryCancelledError` naming the query and ``where`` it stopped
    when ``cancel`` is set."""
    if cancel is not None and cancel.is_set():
        raise QueryCancelledError(
            f"query {query_id} was cancelled {where} (its cancel event was set: the caller, "
            "or its server client, went away); nothing it held was kept"
        )


# -- sizing ------------------------------------------------------------------------------


#: queries whose grant need is remembered (the oldest is forgotten first)
_MAX_NEEDS = 1024


class GrantMemory:
    """What a query needed when its estimated grant fell short, by the digest of
    the query's canonical JSON: its next run asks for that up front (the grant's
    floor), so a query whose data decodes to more than ``grant_expansion`` times
    its Parquet bytes (dictionary-heavy columns) is retried once, not on every
    run. Bounded (the least recently used is forgotten first); thread-safe.
    While it holds nothing, a query's floor is 0 with no digest made.
    """

    def __init__(self, capacity: int = _MAX_NEEDS) -> None:
        self._needs: BoundedLRU[str, int] = BoundedLRU(capacity)

    def floor(self, query: Mapping[str, Any]) -> int:
        """The bytes ``query`` (a query's ``to_dict()``) needed the last time it ran
        short (0: never)."""
        if not len(self._needs):  # nothing learned yet: no digest to make
            return 0
        return self._needs.get(_query_digest(query)) or 0

    def learn(self, query: Mapping[str, Any], needed: int) -> None:
        """Remember that ``query`` (a query's ``to_dict()``) needed ``needed`` bytes."""
        self._needs.put(_query_digest(query), needed)


def _query_digest(query: Mapping[str, Any]) -> str:
    """SHA-256 of a query's canonical JSON (a query's may be large: a long ``in``
    list, so it is remembered by digest)."""
    return hashlib.sha256(json.dumps(query, sort_keys=True).encode()).hexdigest()


def estimate_grant(
    query: Query, source: SourcePlan, *, expansion: float, min_grant: int, floor: int = 0
) -> int:
    """The grant an attempt of ``query`` over ``source`` asks for: its decoded-size
    estimate, at least ``min_grant`` and ``floor``."""
    if isinstance(query, Count) and query.filter is None:
        estimate = min_grant  # footers only
    elif isinstance(query, GraphQuery):
        estimate = _graph_estimate(query, source, expansion)
    else:
        estimate = math.ceil(source.total_bytes * expansion)
    return max(estimate, min_grant, floor)


def fit_grant(estimate: int, attainable: int, *, floor: int, min_grant: int) -> int:
    """``estimate``, lowered to ``attainable`` (what the device can ever free) when
    it is past that and ``attainable`` still covers ``floor`` and ``min_grant``.

    The size is an estimate; past what the device can ever free it would be
    refused outright, though the query may need far less. An attempt that does
    need more ends with :class:`GrantExhaustedError` and a real figure.
    """
    if estimate > attainable >= max(floor, min_grant):
        return attainable
    return estimate


@dataclasses.dataclass(frozen=True)
class _EdgeFacts:
    """What the edge objects' Parquet footers say: rows, columns, the id range."""

    rows: int
    columns: int
    #: max - min + 1 over both id columns (None: no statistics to bound it)
    id_span: int | None


def _graph_estimate(query: GraphQuery, source: SourcePlan, expansion: float) -> int:
    """The decoded edges, the uncached build and the result, from the footers' edge
    count; without footers, a multiple of the Parquet bytes.

    The uncached path charges about 72 B per edge for the build alone, more
    than any multiple of well-compressed ids: a grant sized from the bytes
    ran the whole query, ran out, and ran it again.
    """
    options = graph_options(query)
    weighted = query.weight is not None
    facts = _edge_facts(source, query.src, query.dst)
    if facts is None:
        return math.ceil(source.total_bytes * expansion * _GRAPH_FACTOR) + build_bytes(
            0, options, weighted
        )
    columns = len(query.edges.columns) if query.edges.columns is not None else facts.columns
    # ids and weights decode to at most 8 B a value; other columns: the bytes' share
    decoded = max(math.ceil(source.total_bytes * expansion), facts.rows * 8 * columns)
    vertices = 2 * facts.rows if facts.id_span is None else min(2 * facts.rows, facts.id_span)
    return (
        decoded
        + build_bytes(facts.rows, options, weighted)
        + result_bytes(query.algorithm, facts.rows, vertices)
    )


def _edge_facts(source: SourcePlan, src: str, dst: str) -> _EdgeFacts | None:
    """Rows, columns and id range of the source's objects from their footers; None
    when one cannot be read (the attempt then reports what is wrong with it)."""
    rows, columns = 0, 0
    low: int | None = None
    high: int | None = None
    spanned = True
    for plan in source.plans:
        try:
            meta = _footer(plan.fs, plan.path)
        except (OSError, ValueError, pa.ArrowException):
            return None
        if meta is None:
            return None
        rows += meta.num_rows
        columns = max(columns, meta.num_columns)
        names = [meta.schema.column(j).path for j in range(meta.num_columns)]
        if src not in names or dst not in names:
            spanned = False
            continue
        for group in range(meta.num_row_groups):
            for name in (src, dst):
                stats = meta.row_group(group).column(names.index(name)).statistics
                if stats is None or not stats.has_min_max:
                    spanned = False
                    continue
                lo, hi = stats.min, stats.max
                if not (isinstance(lo, int) and isinstance(hi, int)):
                    spanned = False
                    continue
                low = lo if low is None else min(low, lo)
                high = hi if high is None else max(high, hi)
    span = high - low + 1 if spanned and low is not None and high is not None else None
    return _EdgeFacts(rows, columns, span)


def _footer(fs: Any, path: str) -> pq.FileMetaData | None:
    """The Parquet footer of one object; None for anything but a regular local file
    (a FIFO would block the read)."""
    if fs is None:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return pq.read_metadata(path)
    with fs.open(path, "rb") as handle:
        return pq.ParquetFile(handle).metadata


# -- placement and waiting -----------------------------------------------------------------


class Admission:
    """Places attempts on the service's devices and admits and releases their
    grants, in arrival order per ledger, logging each decision.

    ``caches`` are the devices :meth:`place` chooses among (and whose ledgers
    :meth:`admit` and :meth:`release` use when none is given); ``timeout_s``
    is how long a grant may wait.
    """

    def __init__(
        self,
        log: AdmissionLog,
        timeout_s: float,
        caches: DeviceResidentCaches | None = None,
    ) -> None:
        self._log = log
        self._timeout = timeout_s
        self._caches = caches
        self._released = threading.Condition()
        self._generation = 0
        # per ledger: the tickets of the requests waiting there, oldest first
        self._queues: dict[DeviceLedger, deque[object]] = {}
        # source identity keys -> the device that last ran a query on them: its
        # source and graph caches hold them, so the next query there is a hit
        self._homes: BoundedLRU[tuple[str, ...], int] = BoundedLRU(_MAX_HOMES)

    @property
    def log(self) -> AdmissionLog:
        return self._log

    def request(
        self,
        query_id: str,
        number: int,
        grant_bytes: int,
        *,
        device_id: int = 0,
        cancel: threading.Event | None = None,
    ) -> Attempt:
        """An :class:`Attempt` on ``device_id`` that may wait ``timeout_s`` from now."""
        deadline = time.monotonic() + self._timeout
        return Attempt(query_id, number, device_id, grant_bytes, deadline, cancel)

    def place(
        self,
        query_id: str,
        number: int,
        estimate: int,
        *,
        source_keys: tuple[str, ...] | None,
        device: int | None = None,
        floor: int = 0,
        min_grant: int = 0,
        cancel: threading.Event | None = None,
    ) -> Attempt:
        """The attempt's device (``device`` when given, else by the placement rule in
        the module's docstring) and its grant, ``estimate`` fitted to that device."""
        caches = self._served()
        device_id = device if device is not None else self._choose(estimate, source_keys)
        attainable = caches.grant_ceiling(device_id)
        nbytes = fit_grant(estimate, attainable, floor=floor, min_grant=min_grant)
        return self.request(query_id, number, nbytes, device_id=device_id, cancel=cancel)

    def remember(self, source_keys: tuple[str, ...] | None, device_id: int) -> None:
        """Note that ``device_id``'s caches now hold the source of ``source_keys``."""
        if source_keys is None:
            return
        self._homes.put(source_keys, device_id)

    def _served(self) -> DeviceResidentCaches:
        if self._caches is None:
            raise LifecycleError(
                "this Admission was made without caches: pass ledger= to admit() and "
                "release(), or make it with the service's DeviceResidentCaches"
            )
        return self._caches

    def _choose(self, nbytes: int, keys: tuple[str, ...] | None) -> int:
        caches = self._served()
        ledgers = caches.ledgers()
        if len(ledgers) == 1:  # the one device: nothing to compare
            return ledgers[0].device_id
        if keys is not None:
            home = self._homes.get(keys)
            if home is not None:
                snap = caches.ledger(home).snapshot()
                if snap.admission_open and snap.free_managed_bytes >= nbytes:
                    return home
        best = max(ledgers, key=lambda led: (led.snapshot().free_managed_bytes, -led.device_id))
        return best.device_id

    def _ledger(self, device_id: int, ledger: DeviceLedger | None) -> DeviceLedger:
        return ledger if ledger is not None else self._served().ledger(device_id)

    def admit(self, attempt: Attempt, *, ledger: DeviceLedger | None = None) -> Grant:
        """The attempt's grant, once it fits and every older request on its ledger has
        left the queue; :class:`AdmissionError` once its deadline has passed,
        :class:`QueryCancelledError` (within :data:`POLL_INTERVAL_S`) once its cancel
        event is set.

        ``ledger`` defaults to the ledger of ``attempt.device_id`` among the
        caches; a request larger than the largest grant the device could ever
        admit (the caches' grant ceiling; for a ledger given, its managed
        capacity) raises :class:`GrantTooLargeError` at once, also when the
        ceiling drops while it waits.
        """
        ceiling: Callable[[], int] | None = None
        if ledger is None:
            caches = self._served()
            ledger = caches.ledger(attempt.device_id)

            def ceiling() -> int:
                return caches.grant_ceiling(attempt.device_id)

        request = _Request(ledger, attempt, time.monotonic())
        ticket = object()
        granted: Grant | None = None
        with self._released:
            self._queues.setdefault(ledger, deque()).append(ticket)
        try:
            try:
                while True:
                    self._leave_if_cancelled(request)
                    with self._released:
                        generation = self._generation
                        first = self._queues[ledger][0] is ticket
                    if first:
                        try:
                            granted = ledger.admit_grant(attempt.attempt_id, attempt.grant_bytes)
                        except AdmissionClosedError as exc:
                            self._record(request, "closed", str(exc))
                            raise
                        except CapacityError as exc:
                            self._refuse_if_due(request, ceiling, exc)
                        else:
                            self._admitted(request)
                            return granted
                    else:  # older requests wait here: this one queues behind them
                        self._refuse_if_due(request, ceiling, None)
                    with self._released:
                        if self._generation == generation:
                            left = attempt.deadline - time.monotonic()
                            self._released.wait(max(0.0, min(POLL_INTERVAL_S, left)))
            finally:
                with self._released:
                    queue = self._queues[ledger]
                    queue.remove(ticket)
                    if not queue:
                        del self._queues[ledger]
                    # the next request in line may go now
                    self._generation += 1
                    self._released.notify_all()
        except BaseException:
            # The caller never sees a grant admitted here when anything fails
            # after it (its decision cannot be logged, or a Ctrl-C lands while
            # it is logged or the queue is tidied), so nothing else would
            # release it.
            if granted is not None:
                self.release(granted, ledger=ledger)
            raise

    def _leave_if_cancelled(self, request: _Request) -> None:
        try:
            request.attempt.check_cancelled("while waiting for admission")
        except QueryCancelledError as exc:
            self._record(request, "cancelled", str(exc))
            raise

    def cancelled(self, attempt: Attempt, error: QueryCancelledError) -> None:
        """Log that ``attempt`` stopped for its cancel event while it held its grant
        (call before releasing the grant)."""
        ledger = self._served().ledger(attempt.device_id)
        self._record(_Request(ledger, attempt, time.monotonic()), "cancelled", str(error))

    def _refuse_if_due(
        self,
        request: _Request,
        ceiling: Callable[[], int] | None,
        error: CapacityError | None,
    ) -> None:
        """Raise the refusal when the request can never fit or its wait is over."""
        snap = request.ledger.snapshot()
        limit = snap.managed_capacity_bytes if ceiling is None else ceiling()
        nbytes = request.attempt.grant_bytes
        never = nbytes > limit
        now = time.monotonic()
        if not (never or now >= request.attempt.deadline):
            return
        if never:
            refusal: AdmissionError = GrantTooLargeError(_never(snap, nbytes, limit))
        else:
            refusal = AdmissionError(_refusal(snap, nbytes, now - request.start, error is None))
        self._record(request, "refused", str(error or refusal))
        raise refusal from error

    def _admitted(self, request: _Request) -> None:
        """Log the admission (an admission that cannot be logged is not made:
        :meth:`admit` releases its grant)."""
        waited = time.monotonic() - request.start
        decision = "admitted" if waited < POLL_INTERVAL_S else "admitted_after_wait"
        self._record(request, decision, None)

    def release(self, grant: Grant, *, ledger: DeviceLedger | None = None) -> None:
        """Return the grant's bytes (to ``ledger``, default: its device's among the
        caches) and wake waiting admissions."""
        self._ledger(grant.device_id, ledger).release_grant(grant)
        with self._released:
            self._generation += 1
            self._released.notify_all()

    def _record(self, request: _Request, decision: str, reason: str | None) -> None:
        snap = request.ledger.snapshot()
        row: dict[str, Any] = {
            "query_id": request.attempt.query_id,
            "attempt_id": request.attempt.attempt_id,
            "device_id": snap.device_id,
            "decision": decision,
            "requested_bytes": request.attempt.grant_bytes,
            "waited_s": time.monotonic() - request.start,
            "grant_bytes": snap.grant_bytes,
            "grant_count": snap.grant_count,
            "managed_capacity_bytes": snap.managed_capacity_bytes,
            "cache_charged_bytes": snap.cache_charged_bytes,
            "free_managed_bytes": snap.free_managed_bytes,
            "cache_evictable_resident_bytes": snap.cache_evictable_resident_bytes,
            "cache_pinned_in_use_bytes": snap.cache_pinned_in_use_bytes,
            "reason": reason,
        }
        self._log.record(row)


@dataclasses.dataclass(frozen=True)
class _Request:
    """One call of :meth:`Admission.admit`: the ledger, the attempt, when it began."""

    ledger: DeviceLedger
    attempt: Attempt
    start: float


def _figures(snap: LedgerSnapshot) -> str:
    return (
        f"managed capacity {snap.managed_capacity_bytes} B, grants {snap.grant_bytes} B "
        f"({snap.grant_count} attempts), cache {snap.cache_charged_bytes} B "
        f"(evictable {snap.cache_evictable_resident_bytes} B, pinned "
        f"{snap.cache_pinned_in_use_bytes} B), free {snap.free_managed_bytes} B"
    )


def _request(snap: LedgerSnapshot, nbytes: int) -> str:
    return f"a grant of {nbytes} B ({format_size(nbytes)}) on device {snap.device_id}"


def _never(snap: LedgerSnapshot, nbytes: int, limit: int) -> str:
    kept = snap.managed_capacity_bytes - limit
    resident = (
        f", less {kept} B of parked graphs and quarantined entries that stay resident"
        if kept > 0
        else ""
    )
    return (
        f"{_request(snap, nbytes)} can never be admitted: it exceeds the {limit} B the "
        f"device can ever free (its managed capacity{resident}; {_figures(snap)}); read "
        "fewer columns or rows per query, lower min_grant_bytes, or serve a larger device"
    )


def _refusal(snap: LedgerSnapshot, nbytes: int, waited: float, queued: bool) -> str:
    behind = " (older requests were still waiting ahead of it)" if queued else ""
    return (
        f"{_request(snap, nbytes)} did not fit within the {waited:.2f} s admission wait"
        f"{behind} ({_figures(snap)}); retry later, raise NEXUS_SERVICE_ADMISSION_TIMEOUT_S, "
        "or lower the cache cap"
    )
