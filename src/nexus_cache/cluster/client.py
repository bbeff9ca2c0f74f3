"""``ClusterQueryClient``: queries routed to the Dask worker whose caches hold their source."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from nexus_cache.cluster._cancel import CancelledOnWorker, cancel_name
from nexus_cache.cluster._routing import rendezvous_order, routing_key
from nexus_cache.cluster.plugin import PLUGIN_NAME, QueryServicePlugin, cluster_report, run_query
from nexus_cache.errors import ConfigError, LifecycleError, QueryCancelledError
from nexus_cache.program import REDIS_URL_VARIABLE, default_redis_url
from nexus_cache.service import Diagnostics, Query, QueryResult, ServiceConfig, as_query

__all__ = ["ENV_REDIS_URL", "ClusterDiagnostics", "ClusterQueryClient"]

#: the Redis program cache every worker shares (unset: none)
ENV_REDIS_URL = REDIS_URL_VARIABLE.name
# How often a waiting query checks that its worker is still there.
_POLL_S = 0.2


@dataclasses.dataclass(frozen=True, repr=False)  # Diagnostics' repr, which never raises
class ClusterDiagnostics(Diagnostics):
    """:class:`Diagnostics` plus where the query ran: ``worker`` (its address as
    Dask names it) and ``lost_workers`` (workers that left while running it,
    in order; the query was sent to the next worker each time)."""

    worker: str = ""
    lost_workers: tuple[str, ...] = ()


def _lost_worker_errors() -> tuple[type[BaseException], ...]:
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return (KilledWorker, CommClosedError)


def _connected(dask_client: Any) -> Any:
    """``dask_client``, unless it is closed (then it has no scheduler to ask)."""
    status = getattr(dask_client, "status", None)
    if status in ("closing", "closed"):
        raise LifecycleError(
            f"the Dask client is {status}; make a new distributed.Client and a "
            "ClusterQueryClient on it"
        )
    return dask_client


class ClusterQueryClient:
    """Runs queries on the query services of a Dask cluster's workers.

    ``dask_client`` is a connected ``distributed.Client``. ``config`` (default
    :meth:`ServiceConfig.from_env`, read here) is sent to every worker as
    JSON; each builds one :class:`QueryService` from it for its device
    (see :class:`QueryServicePlugin`). The plugin is registered with the
    scheduler, so workers that join later get a service too. ``redis_url``
    (default ``$NEXUS_PROGRAM_CACHE_REDIS_URL``) adds a Redis tier that every
    worker's program cache shares.

    :meth:`execute` sends a query to the first live worker in its source's
    rendezvous order, so queries on one source meet one worker's source and
    graph caches and sources spread over the workers. A worker that leaves
    while running the query (killed, lost) is dropped from the order and the
    query runs on the next; when a worker leaves, only the sources it was
    first for move. Errors of the query itself (bad column, missing source)
    are raised as the service raises them. Thread-safe: one client may serve
    many threads.
    """

    def __init__(
        self,
        dask_client: Any,
        config: ServiceConfig | None = None,
        *,
        redis_url: str | None = None,
        shutdown_timeout: float = 10.0,
        max_worker_losses: int = 3,
    ) -> None:
        if config is not None and not isinstance(config, ServiceConfig):
            raise ConfigError(
                f"config={config!r} is not accepted; use a ServiceConfig (or omit it to read "
                "the NEXUS_* environment)"
            )
        if isinstance(max_worker_losses, bool) or not isinstance(max_worker_losses, int):
            raise ConfigError(f"max_worker_losses must be an int >= 0, got {max_worker_losses!r}")
        if max_worker_losses < 0:
            raise ConfigError(f"max_worker_losses must be an int >= 0, got {max_worker_losses!r}")
        self.config = config if config is not None else ServiceConfig.from_env()
        if redis_url is None:
            redis_url = default_redis_url()
        self.redis_url = redis_url
        self._client = dask_client
        self._max_losses = max_worker_losses
        plugin = QueryServicePlugin(self.config.to_json(), redis_url, shutdown_timeout)
        _connected(dask_client).register_plugin(plugin, name=PLUGIN_NAME)

    @property
    def dask_client(self) -> Any:
        return self._client

    def workers(self) -> list[str]:
        """The addresses of the live workers, as the scheduler knows them now."""
        client = _connected(self._client)
        try:
            # the scheduler's answer itself: Client.scheduler_info() returns the client's
            # cached copy, which its periodic refresh (asking for no worker) may replace
            # with an empty worker list between the fetch and the read
            info = client.sync(client.scheduler.identity, n_workers=-1)
        except TypeError:  # distributed before n_workers: it lists them all
            info = client.sync(client.scheduler.identity)
        return sorted(info.get("workers", {}))

    def worker_for(self, query: Query | Mapping[str, Any] | str) -> str:
        """The worker :meth:`execute` would send ``query`` to now."""
        order = rendezvous_order(routing_key(as_query(query)), self.workers())
        if not order:
            raise LifecycleError("the Dask cluster has no workers; start some and retry")
        return order[0]

    def execute(
        self,
        query: Query | Mapping[str, Any] | str,
        *,
        cancel: threading.Event | None = None,
    ) -> QueryResult:
        """Run ``query`` (an object, its ``to_dict()`` form or JSON text) on its worker.

        Returns what :meth:`QueryService.execute` returns, with
        :class:`ClusterDiagnostics` naming the worker. Raises
        :class:`LifecycleError` when no worker is left, or more than
        ``max_worker_losses`` workers left while running it.

        ``cancel``: once this event is set (from any thread), or the calling
        thread is interrupted (Ctrl-C), the worker's query is cancelled as
        :meth:`QueryService.execute` cancels it (it reaches the worker within
        about half a second); this call then raises :class:`QueryCancelledError`
        once the worker has released the query's grant.
        """
        if cancel is not None and not isinstance(cancel, threading.Event):
            raise ConfigError(f"cancel={cancel!r} is not accepted; use a threading.Event or None")
        q = as_query(query)
        key, payload = routing_key(q), q.to_dict()
        lost: list[str] = []
        errors = _lost_worker_errors()
        while True:
            if cancel is not None and cancel.is_set():
                raise QueryCancelledError(
                    "the query was cancelled before it was sent to a worker (its cancel event "
                    "was set); no worker runs it"
                )
            live = [w for w in self.workers() if w not in lost]
            order = rendezvous_order(key, live)
            if not order:
                raise LifecycleError(
                    "the Dask cluster has no workers left for this query"
                    + (f" (lost while running it: {', '.join(lost)})" if lost else "")
                )
            target = order[0]
            task = f"nexus-query-{uuid.uuid4().hex}"
            future = self._client.submit(
                run_query,
                payload,
                None if cancel is None else cancel_name(task),
                key=task,
                workers=[target],
                allow_other_workers=False,
                pure=False,
            )
            try:
                address, result = self._wait(future, target, cancel)
            except errors:
                address, result = None, None
            if isinstance(result, CancelledOnWorker):
                raise QueryCancelledError(result.message)
            if result is not None and address is not None:
                return _with_worker(result, address, tuple(lost))
            future.cancel()
            lost.append(target)
            if len(lost) > self._max_losses:
                raise LifecycleError(
                    f"{len(lost)} workers left while running this query ({', '.join(lost)}); "
                    "the cluster is losing workers: check their logs"
                )

    def _wait(
        self, future: Any, target: str, cancel: threading.Event | None
    ) -> tuple[str | None, QueryResult | CancelledOnWorker | None]:
        """The task's ``(address, result)``; ``(None, None)`` once ``target`` has left
        (the scheduler cannot place a task restricted to a worker that is gone).
        Sets the task's cluster-wide cancel event once ``cancel`` is set or this
        thread is interrupted."""
        # A plain event rather than Dask's timed waits: a timed Future.result
        # can fail inside Dask when the timeout meets the result.
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        shared: Any = None
        try:
            while not done.wait(_POLL_S):
                if cancel is not None and cancel.is_set() and shared is None:
                    shared = self._cancel_task(future.key)
                if target not in self.workers():
                    break
        except BaseException:  # Ctrl-C: the worker must not run on for nobody
            if cancel is not None and shared is None:
                self._cancel_task(future.key)
            raise
        try:
            if future.done():  # also a result that raced the departure
                address, result = future.result()
                return address, result
            return None, None
        finally:
            if shared is not None:
                shared.clear()  # the scheduler forgets the event

    def _cancel_task(self, task: str) -> Any:
        """Set the cluster-wide cancel event of ``task``; returns it."""
        from distributed import Event

        shared = Event(cancel_name(task), client=self._client)
        shared.set()
        return shared

    def report(self) -> list[dict[str, Any]]:
        """Per worker, in address order: its device cache reports, lakehouse and
        program cache figures (plain data; see :func:`worker_report`)."""
        return cluster_report(_connected(self._client))


def _with_worker(result: QueryResult, worker: str, lost: tuple[str, ...]) -> QueryResult:
    d = result.diagnostics
    fields = {f.name: getattr(d, f.name) for f in dataclasses.fields(Diagnostics)}
    diagnostics = ClusterDiagnostics(**fields, worker=worker, lost_workers=lost)
    return QueryResult(table=result.table, diagnostics=diagnostics)
