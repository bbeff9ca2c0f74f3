"""Prometheus metrics of a running server, served as text at ``/metrics``.

Exported (prometheus-client, the ``metrics`` extra; imported only here):

* the device ledger gauges ``nexus_gpu_cache_evictable_resident_bytes`` and
  ``nexus_gpu_cache_pinned_in_use_bytes`` (per ``device``), read from the
  ledgers at scrape time through the device layer's own collector;
* ``nexus_cache_requests_total{cache,status}``: each query's lakehouse,
  source-cache and graph-cache status (``mixed(...)`` counts as ``mixed``);
* ``nexus_admission_waits_total`` (a query whose grant waited) and
  ``nexus_admission_refusals_total`` (a query refused a grant);
* ``nexus_server_auth_refused_total{reason}``: calls refused for their token
  (``missing``, ``malformed``, ``wrong``);
* ``nexus_queries_total{type,outcome}`` (``ok``, ``error``, ``cancelled``),
  ``nexus_query_duration_seconds{type}`` (a histogram: execution plus
  streaming) and ``nexus_queries_running`` (waiting for a slot, executing or
  streaming).

The registry is private to the server. Thread-safe (prometheus-client's
metrics are).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nexus_cache.errors import BackendUnavailableError
from nexus_cache.server.auth import REFUSAL_REASONS

__all__ = ["MetricsEndpoint", "ServerMetrics"]

_CACHES = (("lakehouse", "lakehouse"), ("source_cache", "source"), ("graph_cache", "graph"))
# seconds; warm one-row queries land in the first buckets, cold graph builds in the last
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ServerMetrics:
    """The server's counters and histograms, plus the ledger gauges of ``service``."""

    def __init__(self, service: Any, running: Callable[[], int], admit_wait_s: float) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            raise BackendUnavailableError(
                f"--metrics-port needs prometheus-client ({exc}); install nexus-cache[metrics] "
                "or leave --metrics-port out"
            ) from exc
        self.registry = CollectorRegistry()
        service.caches.register_prometheus(self.registry)
        self._admit_wait_s = admit_wait_s
        self._statuses = Counter(
            "nexus_cache_requests",
            "Queries by cache and the status that cache answered with.",
            ["cache", "status"],
            registry=self.registry,
        )
        self._waits = Counter(
            "nexus_admission_waits",
            "Queries whose grant waited for device memory before admission.",
            registry=self.registry,
        )
        self._refusals = Counter(
            "nexus_admission_refusals",
            "Queries refused a grant (AdmissionError).",
            registry=self.registry,
        )
        self._auth_refused = Counter(
            "nexus_server_auth_refused",
            "Calls refused for their token, by reason (missing, malformed, wrong).",
            ["reason"],
            registry=self.registry,
        )
        for reason in REFUSAL_REASONS:
            self._auth_refused.labels(reason)  # every reason is exported from the start
        self._queries = Counter(
            "nexus_queries",
            "Queries served, by type and outcome.",
            ["type", "outcome"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "nexus_query_duration_seconds",
            "Seconds from ticket to the last streamed batch.",
            ["type"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        running_gauge = Gauge(
            "nexus_queries_running",
            "Queries waiting for a slot, executing or streaming now.",
            registry=self.registry,
        )
        running_gauge.set_function(running)

    def observe(
        self, kind: str, outcome: str, seconds: float, diagnostics: Mapping[str, Any] | None
    ) -> None:
        """Count one finished query (``diagnostics``: its ``to_dict()``, None when it failed)."""
        self._queries.labels(kind, outcome).inc()
        self._latency.labels(kind).observe(seconds)
        if diagnostics is None:
            return
        for field, cache in _CACHES:
            status = str((diagnostics.get(field) or {}).get("status", "unknown"))
            if status.startswith("mixed"):
                status = "mixed"
            self._statuses.labels(cache, status).inc()
        if float(diagnostics.get("timings", {}).get("admit_s", 0.0)) >= self._admit_wait_s:
            self._waits.inc()

    def refused(self) -> None:
        self._refusals.inc()

    def auth_refused(self, reason: str) -> None:
        """Count one call refused for its token (``reason``: one of REFUSAL_REASONS)."""
        self._auth_refused.labels(reason).inc()

    def counts(self) -> dict[str, Any]:
        """The counters as plain numbers (what ``/metrics`` says): ``requests``
        (cache -> status -> queries), ``queries`` (outcome -> queries), ``waits``,
        ``refusals``."""
        requests: dict[str, dict[str, float]] = {cache: {} for _, cache in _CACHES}
        queries: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == "nexus_cache_requests_total":
                    cache, status = sample.labels["cache"], sample.labels["status"]
                    requests.setdefault(cache, {})[status] = sample.value
                elif sample.name == "nexus_queries_total":
                    outcome = sample.labels["outcome"]
                    queries[outcome] = queries.get(outcome, 0.0) + sample.value
        return {
            "requests": requests,
            "queries": queries,
            "waits": self.registry.get_sample_value("nexus_admission_waits_total") or 0.0,
            "refusals": self.registry.get_sample_value("nexus_admission_refusals_total") or 0.0,
        }

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


#: seconds a connection to the metrics / status port may stay silent before it is closed
IDLE_TIMEOUT_S = 30.0


class MetricsEndpoint:
    """``GET /metrics`` over HTTP on ``host:port`` in a daemon thread; with ``pages``
    (a :class:`~nexus_cache.server.status_web.StatusPages`) also the status page's
    routes (404 elsewhere). One thread a connection; a connection silent for
    ``idle_timeout_s`` is closed, so idle clients cannot hold threads for ever."""

    def __init__(
        self,
        metrics: ServerMetrics,
        host: str,
        port: int,
        pages: Any | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        render = metrics.text

        class Handler(BaseHTTPRequestHandler):
            # a connection that sends nothing for this long is closed: each holds
            # a thread, so idle ones must not pile up
            timeout = idle_timeout_s

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    if pages is not None:
                        pages.get(self)
                        return
                    self.send_error(404, "only /metrics is served here")
                    return
                body = render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if pages is None:
                    self.send_error(404, "only GET /metrics is served here")
                    return
                pages.post(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would drown the query log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="nexus-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
