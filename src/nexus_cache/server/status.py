"""``/api/status``: what the status page shows, as one JSON document.

:func:`build_status` assembles it from what the server already has: the
``reports`` action's device rows (ledger, device memory, allocation-domain
counters, subdomain stats), the resident entries of each source and graph
cache, the lakehouse cache's stats, the metrics' counters, the hit-rate
history (:class:`HitRateHistory`) and the recent and running queries
(:class:`~nexus_cache.server.querylog.QueryBoard`).

Values that come from data or queries (paths, column names) are plain JSON
strings here; the page renders them as text.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from nexus_cache.server.metrics import ServerMetrics
from nexus_cache.server.querylog import QueryBoard

__all__ = ["HISTORY_SAMPLE_S", "HISTORY_WINDOW_S", "HitRateHistory", "build_status"]

#: seconds between two samples of the hit-rate counters
HISTORY_SAMPLE_S = 10.0
#: seconds of hit-rate history kept (one hour)
HISTORY_WINDOW_S = 3600.0
# statuses that say the cache was not asked (they count neither as hit nor miss)
_NOT_ASKED = ("none", "bypass", "unknown", "disabled", "not_applicable")


def _asked(statuses: Mapping[str, float]) -> tuple[float, float]:
    """(hits, queries the cache answered) of one cache's status counts."""
    hits = statuses.get("hit", 0.0)
    asked = sum(n for status, n in statuses.items() if status not in _NOT_ASKED)
    return hits, asked


class HitRateHistory:
    """Per-interval hits and lookups of each cache over the last hour, sampled from
    the metrics' counters when asked (no thread: an idle server samples nothing;
    the last point is the interval still running). Thread-safe."""

    def __init__(
        self,
        counts: Callable[[], dict[str, Any]],
        sample_s: float = HISTORY_SAMPLE_S,
        window_s: float = HISTORY_WINDOW_S,
    ) -> None:
        self._counts = counts
        self._sample_s = sample_s
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, dict[str, tuple[float, float]]]] = deque(
            maxlen=max(2, int(window_s / sample_s) + 1)
        )
        self.series()  # the first interval starts now

    def series(self, now: float | None = None) -> dict[str, list[dict[str, float | None]]]:
        """Per cache, one point per interval: ``t`` (its end, epoch seconds),
        ``hits``, ``lookups`` and ``rate`` (None when nothing was looked up)."""
        now = time.time() if now is None else now
        requests = self._counts()["requests"]
        current = {cache: _asked(statuses) for cache, statuses in requests.items()}
        with self._lock:
            if not self._samples or now - self._samples[-1][0] >= self._sample_s:
                self._samples.append((now, current))
            samples = list(self._samples)
        if samples[-1][0] != now:  # the interval still running ends now
            samples.append((now, current))
        out: dict[str, list[dict[str, float | None]]] = {}
        for (_, before), (t, after) in pairwise(samples):
            for cache, (hits, asked) in after.items():
                old_hits, old_asked = before.get(cache, (0.0, 0.0))
                lookups = asked - old_asked
                out.setdefault(cache, []).append(
                    {
                        "t": t,
                        "hits": hits - old_hits,
                        "lookups": lookups,
                        "rate": (hits - old_hits) / lookups if lookups else None,
                    }
                )
        return out


def _source_row(device: int, view: Any) -> dict[str, Any]:
    key = view.key
    return {
        "device": device,
        "object": key.location or key.fingerprint,
        "columns": list(key.columns) or None,  # None: every column
        "fingerprint": key.fingerprint,
        "bytes": view.nbytes,
        "pins": view.pins,
        "hits": view.hits,
        "published_at": view.published_at,
        "last_used_at": view.last_used_at,
    }


def _graph_row(device: int, view: Any) -> dict[str, Any]:
    key = view.key
    weight = f" weight {key.weight_column}" if key.weight_column else ""
    where = key.location if key.location is not None else key.fingerprint
    return {
        "device": device,
        "key": f"{where}: {key.source_column} -> {key.destination_column}{weight}, "
        f"{'directed' if key.options.directed else 'undirected'} ({key.fingerprint[:8]})",
        "fingerprint": key.fingerprint,
        "vertices": view.detail.get("vertices"),
        "edges": view.detail.get("edges"),
        "bytes": view.nbytes,
        "pins": view.pins,
        "hits": view.hits,
        "published_at": view.published_at,
        "last_used_at": view.last_used_at,
    }


def _devices(service: Any) -> tuple[list[dict[str, Any]], ...]:
    caches = service.caches
    devices: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    graphs: list[dict[str, Any]] = []
    for report in service.device_cache_reports():
        row = report.to_dict()
        resident = {}
        for name, subdomain in (
            ("source", caches.source_cache(report.device_id)),
            ("graph", caches.graph_cache(report.device_id)),
        ):
            views = subdomain.entries() if subdomain is not None else []
            resident[name] = sum(view.nbytes for view in views)
            rows = sources if name == "source" else graphs
            make = _source_row if name == "source" else _graph_row
            rows.extend(make(report.device_id, view) for view in views)
        row["resident_bytes_by_cache"] = resident
        devices.append(row)
    return devices, sources, graphs


def _lakehouse(service: Any) -> dict[str, Any]:
    cache = service.lakehouse
    stats = cache.stats(recent=0)
    return {
        "root": stats.get("root"),
        "max_bytes": cache.config.max_bytes,
        "bytes": stats.get("bytes"),
        "entries": stats.get("entries"),
        "fills_in_flight": stats.get("fills_in_flight"),
        "background_fills_pending": stats.get("background_fills_pending"),
        "reads": stats.get("reads"),
    }


def build_status(
    service: Any,
    metrics: ServerMetrics,
    board: QueryBoard,
    history: HitRateHistory,
    health: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``/api/status`` document (JSON-ready)."""
    devices, sources, graphs = _devices(service)
    counts = metrics.counts()
    return {
        "time": time.time(),
        "health": dict(health),
        "devices": devices,
        "sources": sources,
        "graphs": graphs,
        "lakehouse": _lakehouse(service),
        "requests": counts["requests"],
        "queries_total": counts["queries"],
        "admission": {"waits": counts["waits"], "refusals": counts["refusals"]},
        "hit_rates": history.series(),
        "running": board.running(),
        "recent": board.recent(),
    }
