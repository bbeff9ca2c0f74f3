"""Admission: an attempt's immutable grant, admitted through the device ledger.

The ledger decides (the capacity equation in ``docs/device.md``); this module
adds the order and the bounded wait. Grants are admitted **first come, first
served per device**: a request that arrives while older ones wait queues
behind them, so a stream of small grants cannot starve a large one that fits
the device alone. The oldest waiter is tried whenever a grant of this service
is released, and at least every :data:`POLL_INTERVAL_S` (cache bytes freed by
eviction or shutdown are not announced), until ``timeout_s`` has passed; then
:class:`AdmissionError` names the request, the managed capacity, the grants,
the cache bytes, the free capacity and the wait. A request larger than what
the device can ever free (its ``ceiling``: the managed capacity, less what
stays resident) fails at once with :class:`GrantTooLargeError`: no wait could
make it fit. Each decision appends one line to the admission TSV; a grant
whose decision cannot be logged (disk full, the log replaced by a symlink) is
released before the log's error is raised.

Thread-safe.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from nexus_cache._sizes import format_size
from nexus_cache.device import DeviceLedger, Grant, LedgerSnapshot
from nexus_cache.errors import (
    AdmissionClosedError,
    AdmissionError,
    CapacityError,
    GrantTooLargeError,
)
from nexus_cache.service.evidence import AdmissionLog

__all__ = ["POLL_INTERVAL_S", "Admission"]

#: longest pause between two tries of a waiting grant
POLL_INTERVAL_S = 0.05


class Admission:
    """Admits and releases grants on the service's ledgers, in arrival order per
    ledger, logging each decision."""

    def __init__(self, log: AdmissionLog, timeout_s: float) -> None:
        self._log = log
        self._timeout = timeout_s
        self._released = threading.Condition()
        self._generation = 0
        # per ledger: the tickets of the requests waiting there, oldest first
        self._queues: dict[DeviceLedger, deque[object]] = {}

    @property
    def log(self) -> AdmissionLog:
        return self._log

    def admit(
        self,
        ledger: DeviceLedger,
        query_id: str,
        attempt_id: str,
        nbytes: int,
        *,
        ceiling: Callable[[], int] | None = None,
    ) -> Grant:
        """The grant, once it fits and every older request on ``ledger`` has left the
        queue; :class:`AdmissionError` after the bounded wait.

        ``ceiling()`` is the largest grant the device could ever admit (default:
        its managed capacity); a larger request raises :class:`GrantTooLargeError`
        at once, also when the ceiling drops while it waits.
        """
        request = _Request(ledger, query_id, attempt_id, nbytes, time.monotonic())
        deadline = request.start + self._timeout
        ticket = object()
        with self._released:
            self._queues.setdefault(ledger, deque()).append(ticket)
        try:
            while True:
                with self._released:
                    generation = self._generation
                    first = self._queues[ledger][0] is ticket
                if first:
                    try:
                        grant = ledger.admit_grant(attempt_id, nbytes)
                    except AdmissionClosedError as exc:
                        self._record(request, "closed", str(exc))
                        raise
                    except CapacityError as exc:
                        self._refuse_if_due(request, deadline, ceiling, exc)
                    else:
                        return self._admitted(request, grant)
                else:  # older requests wait here: this one queues behind them
                    self._refuse_if_due(request, deadline, ceiling, None)
                with self._released:
                    if self._generation == generation:
                        self._released.wait(
                            max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic()))
                        )
        finally:
            with self._released:
                queue = self._queues[ledger]
                queue.remove(ticket)
                if not queue:
                    del self._queues[ledger]
                # the next request in line may go now
                self._generation += 1
                self._released.notify_all()

    def _refuse_if_due(
        self,
        request: _Request,
        deadline: float,
        ceiling: Callable[[], int] | None,
        error: CapacityError | None,
    ) -> None:
        """Raise the refusal when the request can never fit or its wait is over."""
        snap = request.ledger.snapshot()
        limit = snap.managed_capacity_bytes if ceiling is None else ceiling()
        nbytes = request.nbytes
        never = nbytes > limit
        now = time.monotonic()
        if not (never or now >= deadline):
            return
        if never:
            refusal: AdmissionError = GrantTooLargeError(_never(snap, nbytes, limit))
        else:
            refusal = AdmissionError(_refusal(snap, nbytes, now - request.start, error is None))
        self._record(request, "refused", str(error or refusal))
        raise refusal from error

    def _admitted(self, request: _Request, grant: Grant) -> Grant:
        waited = time.monotonic() - request.start
        decision = "admitted" if waited < POLL_INTERVAL_S else "admitted_after_wait"
        try:
            self._record(request, decision, None)
        except BaseException:
            # an admission that cannot be logged is not made: the caller
            # never sees this grant, so nothing else would release it
            self.release(request.ledger, grant)
            raise
        return grant

    def release(self, ledger: DeviceLedger, grant: Grant) -> None:
        """Return the grant's bytes and wake waiting admissions."""
        ledger.release_grant(grant)
        with self._released:
            self._generation += 1
            self._released.notify_all()

    def _record(self, request: _Request, decision: str, reason: str | None) -> None:
        snap = request.ledger.snapshot()
        row: dict[str, Any] = {
            "query_id": request.query_id,
            "attempt_id": request.attempt_id,
            "device_id": snap.device_id,
            "decision": decision,
            "requested_bytes": request.nbytes,
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
    """One call of :meth:`Admission.admit`: what it asks for and when it began."""

    ledger: DeviceLedger
    query_id: str
    attempt_id: str
    nbytes: int
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
