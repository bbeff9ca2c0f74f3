"""Admission: an attempt's immutable grant, admitted through the device ledger.

The ledger decides (the capacity equation in ``docs/device.md``); this module
adds the bounded wait. A grant that does not fit now is retried whenever a
grant of this service is released, and at least every
:data:`POLL_INTERVAL_S` (cache bytes freed by eviction or shutdown are not
announced), until ``timeout_s`` has passed; then :class:`AdmissionError` names
the request, the managed capacity, the grants, the cache bytes, the free
capacity and the wait. A request larger than the managed capacity fails at
once: no wait could make it fit. Each decision appends one line to the
admission TSV; a grant whose decision cannot be logged (disk full, the log
replaced by a symlink) is released before the log's error is raised.

Thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from nexus_cache._sizes import format_size
from nexus_cache.device import DeviceLedger, Grant, LedgerSnapshot
from nexus_cache.errors import (
    AdmissionClosedError,
    AdmissionError,
    CapacityError,
)
from nexus_cache.service.evidence import AdmissionLog

__all__ = ["POLL_INTERVAL_S", "Admission"]

#: longest pause between two tries of a waiting grant
POLL_INTERVAL_S = 0.05


class Admission:
    """Admits and releases grants on the service's ledgers, logging each decision."""

    def __init__(self, log: AdmissionLog, timeout_s: float) -> None:
        self._log = log
        self._timeout = timeout_s
        self._released = threading.Condition()
        self._generation = 0

    @property
    def log(self) -> AdmissionLog:
        return self._log

    def admit(self, ledger: DeviceLedger, query_id: str, attempt_id: str, nbytes: int) -> Grant:
        """The grant, once it fits; :class:`AdmissionError` after the bounded wait."""
        start = time.monotonic()
        deadline = start + self._timeout
        while True:
            with self._released:
                generation = self._generation
            try:
                grant = ledger.admit_grant(attempt_id, nbytes)
            except AdmissionClosedError as exc:
                self._record(ledger, query_id, attempt_id, "closed", nbytes, start, str(exc))
                raise
            except CapacityError as exc:
                snap = ledger.snapshot()
                never = nbytes > snap.managed_capacity_bytes
                now = time.monotonic()
                if never or now >= deadline:
                    waited = now - start
                    self._record(ledger, query_id, attempt_id, "refused", nbytes, start, str(exc))
                    raise AdmissionError(_refusal(snap, nbytes, waited, never)) from exc
                with self._released:
                    if self._generation == generation:
                        self._released.wait(min(POLL_INTERVAL_S, deadline - now))
                continue
            waited = time.monotonic() - start
            decision = "admitted" if waited < POLL_INTERVAL_S else "admitted_after_wait"
            try:
                self._record(ledger, query_id, attempt_id, decision, nbytes, start, None)
            except BaseException:
                # an admission that cannot be logged is not made: the caller
                # never sees this grant, so nothing else would release it
                self.release(ledger, grant)
                raise
            return grant

    def release(self, ledger: DeviceLedger, grant: Grant) -> None:
        """Return the grant's bytes and wake waiting admissions."""
        ledger.release_grant(grant)
        with self._released:
            self._generation += 1
            self._released.notify_all()

    def _record(
        self,
        ledger: DeviceLedger,
        query_id: str,
        attempt_id: str,
        decision: str,
        nbytes: int,
        start: float,
        reason: str | None,
    ) -> None:
        snap = ledger.snapshot()
        row: dict[str, Any] = {
            "query_id": query_id,
            "attempt_id": attempt_id,
            "device_id": snap.device_id,
            "decision": decision,
            "requested_bytes": nbytes,
            "waited_s": time.monotonic() - start,
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


def _refusal(snap: LedgerSnapshot, nbytes: int, waited: float, never: bool) -> str:
    figures = (
        f"managed capacity {snap.managed_capacity_bytes} B, grants {snap.grant_bytes} B "
        f"({snap.grant_count} attempts), cache {snap.cache_charged_bytes} B "
        f"(evictable {snap.cache_evictable_resident_bytes} B, pinned "
        f"{snap.cache_pinned_in_use_bytes} B), free {snap.free_managed_bytes} B"
    )
    request = f"a grant of {nbytes} B ({format_size(nbytes)}) on device {snap.device_id}"
    if never:
        return (
            f"{request} can never be admitted: it exceeds the managed capacity ({figures}); "
            "read fewer columns or rows per query, or serve a larger device"
        )
    return (
        f"{request} did not fit within the {waited:.2f} s admission wait ({figures}); "
        "retry later, raise NEXUS_SERVICE_ADMISSION_TIMEOUT_S, or lower the cache cap"
    )
