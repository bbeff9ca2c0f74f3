"""Running one query as attempts, for :class:`~nexus_cache.service.QueryService`.

:class:`QueryRunner` is the attempt loop and what each attempt does around its
plan and run (:mod:`~nexus_cache.service._attempt`): plan afresh, place and
admit the grant (:mod:`~nexus_cache.service.admission`), run in the device's
work domain, release the grant (or book it with a device result until that is
released) and seal the attempt's evidence. A stale plan or an exhausted grant
is retried, with a larger grant after exhaustion, up to ``max_attempts``.
It works over the caches, admission, evidence and work domains its service
owns; the service checks a query's arguments and its own lifetime first.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from nexus_cache.device import DeviceResidentCaches, Grant
from nexus_cache.errors import (
    AdmissionError,
    GrantExhaustedError,
    QueryCancelledError,
    StalePlanError,
)
from nexus_cache.frames import DeviceFrame, FrameOwner
from nexus_cache.lakehouse import LakehouseCache
from nexus_cache.service._attempt import (
    AttemptOutcome,
    AttemptPlan,
    AttemptPorts,
    plan_attempt,
    run_attempt,
)
from nexus_cache.service._held import HeldResults
from nexus_cache.service._work import WorkDomains
from nexus_cache.service.admission import Admission, Attempt, GrantMemory, check_cancelled
from nexus_cache.service.config import ServiceConfig
from nexus_cache.service.device_result import DeviceQueryResult
from nexus_cache.service.evidence import EvidenceWriter
from nexus_cache.service.fingerprint import table_fingerprint
from nexus_cache.service.queries import Query
from nexus_cache.service.result import (
    AttemptRecord,
    Diagnostics,
    QueryResult,
    defer_device_fingerprint,
    defer_evidence_digest,
    defer_fingerprint,
)

__all__ = ["QueryRunner"]

_TRANSIENT = (StalePlanError, GrantExhaustedError)


@dataclasses.dataclass
class _QueryRun:
    """One call of :meth:`QueryService.execute`: the query and its attempts' records."""

    query: Query
    query_id: str
    #: the device every attempt is pinned to, or None (admission places each)
    device: int | None
    cancel: threading.Event | None
    #: ``time.perf_counter()`` when the query began
    start: float
    records: list[AttemptRecord] = dataclasses.field(default_factory=list)
    #: the result stays in device memory (:meth:`QueryService.execute_on_device`)
    on_device: bool = False
    #: ``query.to_dict()``, made once (the grant memory's key, every attempt's
    #: evidence and the diagnostics read it; none changes it)
    query_dict: dict[str, Any] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.query_dict = self.query.to_dict()


class QueryRunner:
    """The attempts of every query of one :class:`~nexus_cache.service.QueryService`.

    Thread-safe as its service is: queries may run concurrently from many threads.
    """

    def __init__(
        self,
        config: ServiceConfig,
        caches: DeviceResidentCaches,
        lakehouse: LakehouseCache,
        admission: Admission,
        evidence: EvidenceWriter,
        ports: AttemptPorts,
        work: WorkDomains,
        held: HeldResults,
        on_planned: Callable[[AttemptPlan], None] | None,
    ) -> None:
        self.config = config
        self._caches = caches
        self._lakehouse = lakehouse
        self._admission = admission
        self._needs = GrantMemory()
        self._evidence = evidence
        self._ports = ports
        self._work = work
        self._held = held
        self._on_planned = on_planned

    def run(
        self,
        query: Query,
        query_id: str,
        device: int | None,
        cancel: threading.Event | None,
        *,
        on_device: bool,
    ) -> QueryResult | DeviceQueryResult:
        """Run ``query``'s attempts until one succeeds, a non-transient error ends
        it, or ``max_attempts`` is spent (the last transient error is raised).
        Its arguments were checked by the service."""
        run = _QueryRun(query, query_id, device, cancel, time.perf_counter(), on_device=on_device)
        floor = self._needs.floor(run.query_dict)
        short = False  # an attempt ran past its grant
        for number in range(1, self.config.max_attempts + 1):
            check_cancelled(cancel, run.query_id, "before its next attempt")
            try:
                result = self._attempt(run, number, floor)
            except _TRANSIENT as exc:
                if number == self.config.max_attempts:
                    raise
                if isinstance(exc, GrantExhaustedError):
                    floor = 2 * max(exc.needed_bytes, run.records[-1].grant_bytes)
                    short = True
                continue
            if short:  # its estimate fell short: the next run asks for what this one used
                self._needs.learn(run.query_dict, run.records[-1].used_bytes)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, run: _QueryRun, number: int, floor: int) -> QueryResult | DeviceQueryResult:
        cfg = self.config
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        plan = plan_attempt(
            self._lakehouse,
            run.query,
            expansion=cfg.grant_expansion,
            min_grant=cfg.min_grant_bytes,
            floor=floor,
            storage_options=cfg.storage_options,
            allowed_roots=cfg.allowed_roots,
        )
        timings["plan_s"] = time.perf_counter() - t0
        if self._on_planned is not None:
            self._on_planned(plan)
        attempt = self._admission.place(
            run.query_id,
            number,
            plan.grant_bytes,
            source_keys=plan.source.identity_keys,
            device=run.device,
            floor=floor,
            min_grant=cfg.min_grant_bytes,
            cancel=run.cancel,
        )
        plan = dataclasses.replace(plan, grant_bytes=attempt.grant_bytes)
        outcome = AttemptOutcome(timings=timings)
        t0 = time.perf_counter()
        try:
            grant = self._admission.admit(attempt)
        except (AdmissionError, QueryCancelledError) as exc:
            timings["admit_s"] = time.perf_counter() - t0
            kind = "cancelled" if isinstance(exc, QueryCancelledError) else "refused"
            self._seal(run, attempt, plan, outcome, kind, exc)
            raise
        # The evidence's ledger snapshot is taken while the grant is still held;
        # the grant is released whatever sealing does (an interrupt included).
        try:
            timings["admit_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            table = self._run(plan, attempt, grant, outcome, run.on_device)
        except BaseException as exc:
            last = number == self.config.max_attempts
            kind = "retried" if isinstance(exc, _TRANSIENT) and not last else "failed"
            try:
                if isinstance(exc, QueryCancelledError):
                    kind = "cancelled"
                    self._admission.cancelled(attempt, exc)
                self._seal(run, attempt, plan, outcome, kind, exc)
            finally:
                self._admission.release(grant)
            raise
        # Until a device result reaches the caller, anything that fails (a Ctrl-C
        # included) gives its frame, its grant and its share of the working domain
        # back here, at once and exactly once (``settle`` is idempotent; once the
        # result's frame holds it, its release runs it instead).
        booked: DeviceFrame | None = None
        settle: Callable[[], None] | None = None
        try:
            timings["execute_s"] = time.perf_counter() - t0
            timings["total_s"] = time.perf_counter() - run.start
            statuses = outcome.statuses(plan)
            digest = self._seal(run, attempt, plan, outcome, "ok", None, table, statuses)
            self._admission.remember(plan.source.identity_keys, attempt.device_id)
            diagnostics = Diagnostics(
                query_id=run.query_id,
                query=run.query_dict,
                device_id=attempt.device_id,
                attempts=tuple(run.records),
                lakehouse=statuses["lakehouse"],
                source_cache=statuses["source_cache"],
                graph_cache=statuses["graph_cache"],
                timings=dict(timings),
                rows=table.num_rows,
                result_fingerprint=digest or "",
                algorithm={} if outcome.graph is None else dict(outcome.graph.algorithm),
                table=statuses["table"],
            )
            if isinstance(table, DeviceFrame):  # the grant goes with the result
                settle = self._book(grant, run.query_id)
                booked = table.with_owner(FrameOwner(settle))
                table.release()  # the same buffers, now held by ``booked`` alone
                if digest is None:
                    defer_device_fingerprint(diagnostics, booked)
                return DeviceQueryResult(booked, diagnostics)
        except BaseException:
            if isinstance(table, DeviceFrame):
                table.release()
            if booked is not None:
                booked.release()
            if settle is not None:
                settle()
            raise
        finally:
            if settle is None:  # not booked: the frame and the grant go back now
                if isinstance(table, DeviceFrame):
                    table.release()
                    self._work.leave(attempt.device_id)
                self._admission.release(grant)
        assert isinstance(table, pa.Table)
        if digest is None:
            defer_fingerprint(diagnostics, table)
        return QueryResult(table, diagnostics)

    def _run(
        self,
        plan: AttemptPlan,
        attempt: Attempt,
        grant: Grant,
        outcome: AttemptOutcome,
        on_device: bool,
    ) -> pa.Table | DeviceFrame:
        """Run the attempt in its device's work domain. A device result (``on_device``)
        keeps borrowing the domain until it is released (:meth:`_book`), and its
        device work is complete when this returns."""
        device_id = attempt.device_id
        with self._work.borrow(device_id) as domain:
            result = run_attempt(
                plan, attempt, grant, domain, self._ports, outcome, device_result=on_device
            )
            if isinstance(result, DeviceFrame):
                try:
                    self._caches.backend.synchronize(device_id)
                except BaseException:
                    result.release()
                    raise
                self._work.stay(device_id)  # the result's share, until it goes
            return result

    def _book(self, grant: Grant, query_id: str) -> Callable[[], None]:
        """Hold a device result's ``grant`` and its share of the work domain until the
        returned settlement runs (once; see :class:`HeldResults`); shutdown() waits
        for it meanwhile."""
        device_id = grant.device_id

        def give_back() -> None:
            try:
                self._admission.release(grant)
            finally:
                self._work.leave(device_id)

        return self._held.book(give_back, device_id, query_id)

    def _seal(
        self,
        run: _QueryRun,
        attempt: Attempt,
        plan: AttemptPlan,
        outcome: AttemptOutcome,
        kind: str,
        error: BaseException | None,
        table: pa.Table | DeviceFrame | None = None,
        statuses: dict[str, Any] | None = None,
    ) -> str | None:
        """Seal the attempt's evidence and add its record to ``run``; returns the
        result fingerprint ('' without a result; None where the service writes no
        evidence: nothing records it, so it is computed when first read). A device
        result is hashed from a host copy. ``statuses``: ``outcome.statuses(plan)``
        where the caller made them already."""
        fingerprint: str | None = ""
        if table is not None:
            written = self._evidence.directory is not None
            if written:
                host = table.to_arrow() if isinstance(table, DeviceFrame) else table
                fingerprint = table_fingerprint(host)
                del host
            else:
                fingerprint = None
        ledger = self._caches.ledger(attempt.device_id).snapshot()
        message = None if error is None else f"{type(error).__name__}: {error}"
        # what the document holds, as it is now; the rest (the plan, the ledger
        # snapshot: frozen) is turned into JSON values when the document is made
        backend = self._caches.backend.name
        statuses = outcome.statuses(plan) if statuses is None else statuses
        used, timings = outcome.used_bytes, dict(outcome.timings)
        result = (
            None
            if table is None
            else {
                "rows": table.num_rows,
                "columns": table.column_names,
                "fingerprint": fingerprint,
            }
        )
        query = run.query_dict

        def make() -> dict[str, Any]:
            return {
                "attempt_id": attempt.attempt_id,
                "query_id": attempt.query_id,
                "outcome": kind,
                "error": message,
                "plan": {**plan.to_dict(query=False), "query": query},
                "device_id": attempt.device_id,
                "backend": backend,
                "statuses": statuses,
                "ledger": ledger.to_dict(),
                "used_bytes": used,
                "timings": timings,
                "result": result,
            }

        digest = self._evidence.digest(make)
        record = AttemptRecord(
            attempt_id=attempt.attempt_id,
            device_id=attempt.device_id,
            grant_bytes=plan.grant_bytes,
            used_bytes=outcome.used_bytes,
            outcome=kind,
            error=message,
            evidence_digest=digest if isinstance(digest, str) else "",
        )
        if not isinstance(digest, str):
            defer_evidence_digest(record, digest)
        run.records.append(record)
        return fingerprint
