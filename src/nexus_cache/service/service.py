"""``QueryService``: the owner of every cache, and the one place that runs queries.

It owns the lakehouse cache, the GPU-resident caches of every served device
(ledger, allocation domain, source and graph caches), the admission TSV and
the sealed attempt evidence. :meth:`QueryService.execute` runs a query as one
or more attempts:

1. plan afresh (lakehouse plans, cache keys, grant size);
2. place it and admit an immutable grant (:mod:`~nexus_cache.service.admission`
   holds the whole rule: the grant's size, the device, the FIFO wait bounded
   by :class:`AdmissionError`, the refusal of a never-admittable grant, the
   admission log), as a frozen :class:`~nexus_cache.service.admission.Attempt`;
3. run under the grant, through the lakehouse, source and graph caches;
4. release the grant and seal the attempt's evidence.

A stale plan (:class:`StalePlanError`) or an exhausted grant
(:class:`GrantExhaustedError`) ends the attempt; the next one plans again (with
a larger grant after exhaustion), up to ``max_attempts`` in all. A set cancel
event ends the query with :class:`QueryCancelledError`. Anything else ends the
query.

:meth:`QueryService.execute_on_device` runs a :class:`Scan` through the same
attempts, but its result stays in the attempt's working domain as a
:class:`~nexus_cache.service.device_result.DeviceQueryResult`, and step 4
keeps the grant: it is released with the result.

This module is the public surface (arguments, access, warm-up, shutdown);
the attempt loop, the booking of a device result's grant and the sealing of
evidence are :class:`~nexus_cache.service._runner.QueryRunner`'s.

Thread-safe: queries may run concurrently from many threads. Not
process-safe beyond what each cache states (the ledger governs one process).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from nexus_cache._numbers import check_timeout
from nexus_cache.backends import DeviceBackend, select_backend
from nexus_cache.device import (
    MANAGED_CAPACITY_FRACTION,
    SOURCE_WAIT_TIMEOUT_S,
    DeviceCacheReport,
    DeviceProfile,
    DeviceResidentCaches,
    DeviceShutdown,
)
from nexus_cache.errors import (
    CacheSecurityError,
    ConfigError,
    LifecycleError,
)
from nexus_cache.lakehouse import LakehouseCache
from nexus_cache.service._attempt import AttemptPlan, AttemptPorts, plan_attempt
from nexus_cache.service._graph_port import GraphPort
from nexus_cache.service._held import HeldResults, marked
from nexus_cache.service._runner import QueryRunner
from nexus_cache.service._source_port import SourcePort
from nexus_cache.service._work import WorkDomains
from nexus_cache.service.admission import Admission
from nexus_cache.service.config import DEFAULT_CACHE_CAP_FRACTION, ENV_EVIDENCE_DIR, ServiceConfig
from nexus_cache.service.device_result import DeviceQueryResult
from nexus_cache.service.evidence import AdmissionLog, EvidenceWriter
from nexus_cache.service.queries import Query, Scan, as_query
from nexus_cache.service.result import QueryResult
from nexus_cache.service.warmup import WarmUpReport, warm_up_devices

__all__ = ["QueryService", "is_query_id"]

# a caller's query id: it names evidence files, so nothing a path could misread
_QUERY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_query_id(value: object) -> bool:
    """Whether ``value`` may name a query: 1 to 64 letters, digits, ``-`` or ``_``."""
    return isinstance(value, str) and _QUERY_ID.fullmatch(value) is not None


def _profiles(config: ServiceConfig, backend: DeviceBackend) -> list[DeviceProfile]:
    settings = config.devices
    if settings is None:
        from nexus_cache.service.config import DeviceSettings

        settings = tuple(DeviceSettings(d) for d in range(backend.device_count()))
    profiles = []
    for device in settings:
        backend.check_device(device.device_id)
        cap = device.cache_cap_bytes
        if cap is None:
            cap = config.cache_cap_bytes
        if cap is None:
            managed = device.managed_capacity_bytes
            if managed is None:
                total = backend.mem_info(device.device_id).total_bytes
                managed = int(total * MANAGED_CAPACITY_FRACTION)
            cap = int(managed * DEFAULT_CACHE_CAP_FRACTION)
        profiles.append(DeviceProfile(device.device_id, cap, device.managed_capacity_bytes))
    return profiles


class QueryService:
    """Runs :class:`Scan`, :class:`Count` and :class:`GraphQuery` queries through the caches.

    ``config`` defaults to :meth:`ServiceConfig.from_env`. ``backend`` overrides
    ``config.backend`` with a ready :class:`DeviceBackend` (tests, embedders).
    ``on_planned(plan)`` is called after each attempt is planned and before it
    is admitted (instrumentation). Use as a context manager, or call
    :meth:`shutdown`.

    Parameters
    ----------
    config : ServiceConfig or None, optional
        The service's settings (default: from ``NEXUS_*`` variables).
    backend : DeviceBackend or None, optional
        A ready backend, instead of ``config.backend``.
    on_planned : callable or None, optional
        Called with each attempt's plan before it is admitted.

    Raises
    ------
    ConfigError
        ``config`` is not a ``ServiceConfig``, or its ``evidence_dir`` cannot
        be used.
    BackendUnavailableError
        The configured backend cannot be loaded (``cuda`` without CuPy).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> from nexus_cache.service import QueryService, Scan, ServiceConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> edges = pa.table({"src": [1, 2, 3, 3], "dst": [2, 3, 1, 4]})
    >>> pq.write_table(edges, root / "edges.parquet")
    >>> config = ServiceConfig(
    ...     backend="host",
    ...     lakehouse=LakehouseCacheConfig(root=root / "cache"),
    ...     evidence_dir=root / "evidence",
    ... )
    >>> from nexus_cache.service import Count, GraphQuery
    >>> source = str(root / "edges.parquet")
    >>> with QueryService(config) as service:
    ...     count = service.execute(Count(source))
    ...     ranks = service.execute(GraphQuery(Scan(source), "src", "dst", "pagerank"))
    >>> count.table.to_pydict()
    {'rows': [4]}
    >>> ranks.table.column_names, ranks.diagnostics.algorithm["converged"]
    (['vertex', 'pagerank'], True)
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        backend: DeviceBackend | None = None,
        on_planned: Callable[[AttemptPlan], None] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, ServiceConfig):
            raise ConfigError(
                f"config={config!r} is not accepted; use a ServiceConfig "
                "(ServiceConfig.load(path) reads a TOML file)"
            )
        self.config = config if config is not None else ServiceConfig.from_env()
        chosen = backend if backend is not None else select_backend(self.config.backend)
        self._caches = DeviceResidentCaches(_profiles(self.config, chosen), backend=chosen)
        try:
            self._lakehouse = LakehouseCache(self.config.lakehouse)
            try:
                evidence = EvidenceWriter(self.config.evidence_dir)
                log = AdmissionLog(self.config.evidence_dir)
            except CacheSecurityError:
                raise
            except OSError as exc:
                raise ConfigError(
                    f"evidence_dir={str(self.config.evidence_dir)!r} "
                    f"({ENV_EVIDENCE_DIR}) cannot be used: {' '.join(str(exc).split())}"
                ) from exc
            self._admission = Admission(log, self.config.admission_timeout_s, self._caches)
        except BaseException:
            self._caches.shutdown()
            raise
        sources = SourcePort(self._caches, SOURCE_WAIT_TIMEOUT_S)
        ports = AttemptPorts(self._lakehouse, sources, GraphPort(self._caches))
        self._lock = threading.Lock()
        # what attempts allocate, per device; the lock is shutdown's (see WorkDomains)
        self._work = WorkDomains(
            self._caches.backend,
            self._caches.device_ids,
            self._lock,
            self.config.idle_release_s,
        )
        self._closed = False
        self._shutdown: list[DeviceShutdown] | None = None
        self._held = HeldResults()  # device results handed out, until released
        # each query's attempts, over what the service owns
        self._runner = QueryRunner(
            self.config,
            self._caches,
            self._lakehouse,
            self._admission,
            evidence,
            ports,
            self._work,
            self._held,
            on_planned,
        )

    def __repr__(self) -> str:
        return f"QueryService({self._caches!r}, {self._lakehouse!r})"

    # -- access ----------------------------------------------------------------------

    @property
    def caches(self) -> DeviceResidentCaches:
        return self._caches

    @property
    def lakehouse(self) -> LakehouseCache:
        return self._lakehouse

    @property
    def backend(self) -> DeviceBackend:
        return self._caches.backend

    @property
    def admission_log(self) -> AdmissionLog:
        return self._admission.log

    def device_cache_reports(self) -> list[DeviceCacheReport]:
        return self._caches.device_cache_reports()

    def plan(self, query: Query | Mapping[str, Any] | str) -> dict[str, Any]:
        """Plan ``query`` as its first attempt would, without admitting or running it.

        Returns the plan's JSON form: every object's identity key, size and
        planned lakehouse status, ``grant_bytes`` (the grant the attempt would
        ask for) and ``parquet_bytes`` (the source's bytes). Lists the source;
        reads no data. Thread-safe.
        """
        query = as_query(query)
        if self._closed:
            raise LifecycleError("the query service was shut down; create a new one")
        cfg = self.config
        plan = plan_attempt(
            self._lakehouse,
            query,
            expansion=cfg.grant_expansion,
            min_grant=cfg.min_grant_bytes,
            storage_options=cfg.storage_options,
            allowed_roots=cfg.allowed_roots,
        )
        return {**plan.to_dict(), "parquet_bytes": plan.source.total_bytes}

    # -- queries ---------------------------------------------------------------------

    def execute(
        self,
        query: Query | Mapping[str, Any] | str,
        *,
        device: int | None = None,
        cancel: threading.Event | None = None,
        query_id: str | None = None,
    ) -> QueryResult:
        """Run ``query`` (an object, its ``to_dict()`` form or JSON text).

        ``device`` pins every attempt to that served device id. Without it an
        attempt goes where :mod:`~nexus_cache.service.admission` places it: the
        device whose caches already hold the query's source, when that device
        has room for the grant, else the device with the most free managed bytes.

        ``cancel``: once this event is set (from any thread), the query stops at
        its next look at it: while its grant waits for admission (it leaves the
        queue within 50 ms), before each object it decodes, between PageRank
        iterations, and before a retry. It then raises
        :class:`QueryCancelledError`, having released its grant, its place in
        the queue and every pin; the admission log and the attempt's evidence
        say ``cancelled``. A query that already finished returns its result.

        ``query_id``: the id its diagnostics, evidence and messages use (letters,
        digits, ``-`` and ``_``, at most 64); default: a fresh random one. A caller
        that must name the query whatever happens (the server's log) gives its own.

        Raises :class:`AdmissionError` when a grant cannot be admitted in time,
        the last transient error after ``max_attempts`` attempts, and any
        other error of the query (missing source, unknown column) at once.
        """
        result = self._execute(query, device, cancel, query_id, on_device=False)
        assert isinstance(result, QueryResult)
        return result

    def execute_on_device(
        self,
        query: Query | Mapping[str, Any] | str,
        *,
        device: int | None = None,
        cancel: threading.Event | None = None,
        query_id: str | None = None,
    ) -> DeviceQueryResult:
        """Run a :class:`Scan` as :meth:`execute` does, keeping its result in device memory.

        The same admission, attempts, retries, cancellation, statuses,
        diagnostics and evidence as :meth:`execute` (``device``, ``cancel`` and
        ``query_id`` as there). The result's columns are built in the attempt's
        working domain (CuPy arrays on CUDA, NumPy on the host backend) by the
        one-pass gather that builds :meth:`execute`'s table, without the copy to
        the host; they share no buffer with a cache entry, and the device work is
        complete when this returns. The attempt's grant stays in the ledger until
        the result, and every frame derived from its ``frame``, is released
        (:meth:`DeviceQueryResult.release`, or the end of its ``with`` block).

        The result fingerprint: where the service writes evidence, computed from
        a host copy before this returns; otherwise when first read, from the
        device result, which must not have been released by then.

        Raises :class:`ConfigError` for a :class:`Count` or :class:`GraphQuery`
        (their results are host tables: use :meth:`execute`), and what
        :meth:`execute` raises.
        """
        query = as_query(query)
        if not isinstance(query, Scan):
            raise ConfigError(
                f"execute_on_device runs Scan queries only, not a {query.kind} query; "
                "use execute() for Count and GraphQuery (their results are host tables)"
            )
        result = self._execute(query, device, cancel, query_id, on_device=True)
        assert isinstance(result, DeviceQueryResult)
        return result

    def _execute(
        self,
        query: Query | Mapping[str, Any] | str,
        device: int | None,
        cancel: threading.Event | None,
        query_id: str | None,
        *,
        on_device: bool,
    ) -> QueryResult | DeviceQueryResult:
        """The attempt loop of :meth:`execute` and :meth:`execute_on_device`."""
        query = as_query(query)
        if device is not None and (
            isinstance(device, bool)
            or not isinstance(device, int)
            or device not in self._caches.device_ids
        ):
            served = ", ".join(str(d) for d in self._caches.device_ids)
            raise ConfigError(
                f"device={device!r} is not a device this service serves; use one of: {served} "
                "(NEXUS_SERVICE_DEVICES)"
            )
        if cancel is not None and not isinstance(cancel, threading.Event):
            raise ConfigError(f"cancel={cancel!r} is not accepted; use a threading.Event or None")
        if query_id is not None and not is_query_id(query_id):
            raise ConfigError(
                f"query_id={query_id!r} is not accepted; use 1 to 64 letters, digits, '-' or '_'"
            )
        if self._closed:
            raise LifecycleError("the query service was shut down; create a new one")
        return self._runner.run(
            query, query_id or uuid.uuid4().hex[:16], device, cancel, on_device=on_device
        )

    def warm_up(self) -> float:
        """Compile and load every kernel the queries use, on every served device;
        returns the seconds it took. See :meth:`warm_up_report`."""
        return self.warm_up_report().seconds

    def warm_up_report(self) -> WarmUpReport:
        """Run each query path once per served device on a tiny built-in table
        (:mod:`nexus_cache.service.warmup`), so no later query pays a compile.

        Outside every cache and the ledger: no grant, no cache entry, no
        evidence, and no byte left charged or allocated afterwards. Safe to
        call while queries run (the work domain is shared as an attempt shares
        it) and more than once (a repeat costs milliseconds).
        """
        if self._closed:
            raise LifecycleError("the query service was shut down; create a new one")
        return warm_up_devices(self.backend, self._caches.device_ids, self._work.borrow)

    # -- lifetime ----------------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> list[DeviceShutdown]:
        """Refuse new queries; wait up to ``timeout`` for unreleased device results
        (:meth:`execute_on_device`); drain the graph caches, then the source caches,
        then release each device's allocation-domain owner; close the lakehouse cache.

        A device result still held after ``timeout`` keeps its grant, its memory and
        its device's working domain: that device's :class:`DeviceShutdown` says so
        (``complete`` is False), and the result stays readable and releasable.

        Idempotent: later calls return the first complete result (an incomplete
        one, with pins or device results still held, is retried). ``timeout`` must
        be a finite number of seconds >= 0 (:class:`ConfigError`, before anything
        is shut).
        """
        timeout = check_timeout("shutdown timeout", timeout)
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            # a query running at the first shutdown may have returned a device result
            # since: while one is held, the shutdown is not over
            if self._shutdown is not None and self._complete(bool(self._held)):
                return self._shutdown
        # not under self._lock: a release takes it
        held = self._held.wait(deadline - time.monotonic())
        with self._lock:
            if self._shutdown is not None and self._complete(bool(held)):
                return self._shutdown
            shut = self._caches.shutdown(max(0.0, deadline - time.monotonic()))
            self._lakehouse.close(wait=True, timeout=max(0.0, deadline - time.monotonic()))
            self._work.cancel_releases()
            for device_id, domain in self._work.items():
                if domain.closed or any(d == device_id for d, _ in held):
                    continue  # a live device result's memory stays where it is
                domain.release_unused()
                try:
                    domain.close()
                except LifecycleError:
                    # something of an attempt is still referenced (an error's
                    # traceback); the domain stays open and frees it later
                    pass
            self._shutdown = [marked(d, held) for d in shut]
            return self._shutdown

    def _complete(self, holding: bool) -> bool:
        """Whether the last shutdown was complete and no device result is held now."""
        return (
            self._shutdown is not None and not holding and all(d.complete for d in self._shutdown)
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> QueryService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
