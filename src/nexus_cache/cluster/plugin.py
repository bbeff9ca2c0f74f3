"""The Dask worker plugin: one ``QueryService`` per worker, and what runs beside it.

Functions here that take no client (:func:`worker_service`,
:func:`worker_program_cache`, :func:`run_query`, :func:`worker_report`) run
inside a worker: in a task, or through ``client.run``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from distributed import WorkerPlugin, get_worker

from nexus_cache._storage import atomic_write, ensure_private_dir
from nexus_cache.cluster._cancel import CancelledOnWorker, worker_cancel
from nexus_cache.cluster._wire import worker_config
from nexus_cache.errors import ConfigError, LifecycleError, QueryCancelledError
from nexus_cache.program import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    RedisProgramCache,
    TieredProgramCache,
)
from nexus_cache.service import QueryResult, QueryService, ServiceConfig

__all__ = [
    "PLUGIN_NAME",
    "SHUTDOWN_RECORD",
    "QueryServicePlugin",
    "cluster_report",
    "run_query",
    "worker_program_cache",
    "worker_report",
    "worker_service",
]

_log = logging.getLogger("nexus_cache.cluster")

PLUGIN_NAME = "nexus-cache-query-service"
#: written into the worker's evidence directory when its service shuts down
SHUTDOWN_RECORD = "shutdown.json"


class QueryServicePlugin(WorkerPlugin):
    """Gives the worker one :class:`QueryService` and one program cache.

    ``config_json`` is a ``ServiceConfig`` as :meth:`ServiceConfig.to_json` writes
    it; each worker derives its own form (``worker_config``: its own
    lakehouse root and evidence directory, one device). The program cache
    is a FileStream cache (``NEXUS_PROGRAM_CACHE_DIR`` of the worker's host)
    and, with ``redis_url``, a tiered cache of memory, that FileStream cache
    and Redis, shared by every worker.

    Then the service warms up as ``nexus-cache serve`` warms up
    (:meth:`QueryService.warm_up_report`: every kernel the queries use is
    compiled and loaded, every query path run once on a tiny built-in table),
    in a thread so the worker keeps answering the scheduler meanwhile;
    registering the plugin returns once every present worker is warm. Queries
    that arrive meanwhile run (the warm-up is safe beside them). A failed
    warm-up is logged and reported (:func:`worker_report`'s ``warm_up``), and
    the worker serves on: its first queries then pay their compiles.

    On the worker's close (``teardown``) the service shuts down in its own
    order (new queries refused; per device the resident graphs, then the
    decoded sources, then the allocation domain; then the lakehouse cache),
    then the program cache closes. The outcome is logged on the
    ``nexus_cache.cluster`` logger and, with an evidence directory, written
    to ``shutdown.json`` there (atomically).
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(
        self, config_json: str, redis_url: str | None = None, shutdown_timeout: float = 10.0
    ) -> None:
        # Checked here, on the client: on a worker a bad one would only fail its
        # teardown, leaving its service running unshut.
        if (
            isinstance(shutdown_timeout, bool)
            or not isinstance(shutdown_timeout, (int, float))
            or not math.isfinite(shutdown_timeout)
            or shutdown_timeout < 0
        ):
            raise ConfigError(
                f"shutdown_timeout={shutdown_timeout!r} is not accepted; use a finite number "
                "of seconds >= 0 (default 10.0)"
            )
        # Plain data only: Dask pickles the plugin to send it.
        self.config_json = config_json
        self.redis_url = redis_url
        self.shutdown_timeout = shutdown_timeout
        self.service: QueryService | None = None
        self.program_cache: ProgramCacheResource | None = None
        self.address: str | None = None
        self.warm_up: dict[str, Any] | None = None

    async def setup(self, worker: Any) -> None:
        config = worker_config(ServiceConfig.from_json(self.config_json), worker.name)
        self.address = worker.address
        self.service = QueryService(config)
        try:
            files = FileStreamProgramCache()
            if self.redis_url:
                shared = RedisProgramCache(self.redis_url)
                self.program_cache = TieredProgramCache([InMemoryProgramCache(), files, shared])
            else:
                self.program_cache = files
        except BaseException:
            self.service.shutdown(self.shutdown_timeout)
            raise
        self.warm_up = {"state": "running", "backend": self.service.backend.name}
        self.warm_up = await asyncio.to_thread(_warm_up, self.service, worker.address)
        _log.info("nexus-cache query service ready on worker %s", worker.address)

    def teardown(self, worker: Any) -> None:
        service, self.service = self.service, None
        if service is None:
            return
        started = time.time()
        devices = service.shutdown(self.shutdown_timeout)
        if self.program_cache is not None:
            self.program_cache.close()
        record = {
            "worker": worker.address,
            "name": str(worker.name),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "order": ["refuse_queries", "graph", "source", "domain", "lakehouse", "program"],
            "complete": all(d.complete for d in devices),
            "devices": [dataclasses.asdict(d) for d in devices],
            "lakehouse_closed": True,
            "service_closed": service.closed,
        }
        _log.info(
            "nexus-cache query service on worker %s shut down (complete=%s)",
            worker.address,
            record["complete"],
        )
        evidence = service.config.evidence_dir
        if evidence is not None:
            directory = ensure_private_dir(Path(evidence))
            atomic_write(
                directory / SHUTDOWN_RECORD,
                json.dumps(record, indent=2, sort_keys=True).encode(),
                tmp_dir=directory,
            )


def _warm_up(service: QueryService, address: str) -> dict[str, Any]:
    """The service's warm-up as :func:`worker_report` shows it (never raises)."""
    started = time.perf_counter()
    try:
        report = service.warm_up_report()
    except Exception as exc:
        seconds = time.perf_counter() - started
        _log.warning(
            "nexus-cache warm-up on worker %s failed after %.2f s (%s: %s); the worker "
            "serves on, and its first queries compile what they need",
            address,
            seconds,
            type(exc).__name__,
            exc,
        )
        return {
            "state": "failed",
            "backend": service.backend.name,
            "seconds": seconds,
            "error": f"{type(exc).__name__}: {exc}",
            "devices": [],
        }
    _log.info("nexus-cache warm-up on worker %s done in %.2f s", address, report.seconds)
    return {"state": "done", **report.to_dict(), "error": None}


def _plugin(worker: Any = None) -> QueryServicePlugin:
    if worker is None:
        worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, QueryServicePlugin) or plugin.service is None:
        raise LifecycleError(
            f"worker {worker.address} has no nexus-cache query service; create a "
            "ClusterQueryClient(client) first (it registers the worker plugin)"
        )
    return plugin


def worker_service() -> QueryService:
    """This worker's query service (inside a task on a worker)."""
    service = _plugin().service
    assert service is not None
    return service


def worker_program_cache() -> ProgramCacheResource:
    """This worker's program cache, for ``cached_compile(..., cache=...)`` in a task."""
    cache = _plugin().program_cache
    assert cache is not None
    return cache


def run_query(
    payload: dict[str, Any], cancel: str | None = None
) -> tuple[str, QueryResult | CancelledOnWorker]:
    """Run one query (its ``to_dict()`` form) on this worker: ``(address, result)``.

    ``cancel`` names the cluster-wide ``distributed.Event`` that cancels it
    (see :mod:`nexus_cache.cluster._cancel`); None: it cannot be cancelled.
    A query cancelled here returns a :class:`CancelledOnWorker` in place of
    its result (the task succeeds: Dask logs no failure for it).
    """
    plugin = _plugin()
    service, address = plugin.service, plugin.address
    if service is None or address is None:  # pragma: no cover - _plugin checked it
        raise LifecycleError("the worker's query service was shut down")
    if cancel is None:
        return address, service.execute(payload)
    with worker_cancel(cancel) as event:
        try:
            return address, service.execute(payload, cancel=event)
        except QueryCancelledError as exc:
            return address, CancelledOnWorker(str(exc))


def _program_figures(cache: ProgramCacheResource | None) -> list[dict[str, Any]]:
    tiers = cache.tiers if isinstance(cache, TieredProgramCache) else (cache,)
    out = []
    for tier in tiers:
        if tier is None:
            continue
        row: dict[str, Any] = {"kind": type(tier).__name__}
        if isinstance(tier, RedisProgramCache):
            row["location"] = repr(tier)
        elif isinstance(tier, FileStreamProgramCache):
            row["location"] = str(tier.path)
        else:
            row["location"] = "memory"
        row.update(dataclasses.asdict(tier.stats()))
        if isinstance(tier, RedisProgramCache):
            row["reachable"] = tier.reachable
        out.append(row)
    return out


def worker_report(dask_worker: Any = None) -> dict[str, Any]:
    """This worker's figures as plain data: its device cache reports, its lakehouse
    cache's statistics, each program cache tier's statistics and its warm-up
    (``warm_up``: ``state`` ``running``, ``done`` or ``failed``, ``backend``,
    ``seconds``, ``error``, and per device the steps run and kernels loaded)
    (``client.run`` passes ``dask_worker``). A worker without the plugin
    reports ``service: False``."""
    worker = dask_worker if dask_worker is not None else get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, QueryServicePlugin) or plugin.service is None:
        return {"worker": worker.address, "name": str(worker.name), "service": False}
    service = plugin.service
    return {
        "worker": worker.address,
        "name": str(worker.name),
        "service": True,
        "pid": os.getpid(),
        "devices": [r.to_dict() for r in service.device_cache_reports()],
        "lakehouse": service.lakehouse.stats(recent=0),
        "program_cache": _program_figures(plugin.program_cache),
        "warm_up": plugin.warm_up,
    }


async def _report_off_the_loop(dask_worker: Any) -> dict[str, Any]:
    # ``client.run`` calls a plain function on the worker's event loop; the report
    # takes the caches' and the lakehouse's locks, and waiting for one there would
    # stall the worker's heartbeats and every other call to it
    return await asyncio.to_thread(worker_report, dask_worker)


def cluster_report(dask_client: Any) -> list[dict[str, Any]]:
    """:func:`worker_report` of every worker of ``dask_client``'s cluster, by address.

    Each worker builds its report on a thread of its own, never on its event loop."""
    reports = dask_client.run(_report_off_the_loop)
    return [reports[w] for w in sorted(reports)]
