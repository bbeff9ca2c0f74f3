"""The server's recent and running queries, for the status page.

:class:`QueryBoard` keeps the last :data:`RECENT_QUERIES` finished queries
(a bounded deque: id, query, the three cache statuses, rows, attempts,
outcome, milliseconds) and the queries running now, each with the cancel
event the server set up for it: :meth:`QueryBoard.cancel` sets that event,
the same cancel a client that disconnects triggers. Thread-safe.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RECENT_QUERIES", "QueryBoard"]

#: finished queries the board remembers
RECENT_QUERIES = 200
# characters of a query's JSON a row shows (a huge ticket stays a short row)
_SUMMARY_CHARS = 300


def _json(query: Mapping[str, Any]) -> str:
    text = json.dumps(query, separators=(",", ":"), default=str)
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _summary(query: Mapping[str, Any]) -> str:
    """One short line: ``scan SOURCE [columns]``, ``count SOURCE``,
    ``ALGORITHM on SOURCE (src -> dst)``; other queries as their JSON."""
    kind = query.get("type")
    if kind == "graph" and isinstance(query.get("edges"), Mapping):
        edges = query["edges"]
        text = (
            f"{query.get('algorithm')} on {edges.get('source')} "
            f"({query.get('src')} -> {query.get('dst')})"
        )
    elif kind in ("scan", "count") and "source" in query:
        columns = query.get("columns")
        listed = f" [{', '.join(map(str, columns))}]" if isinstance(columns, list) else ""
        text = f"{kind} {query['source']}{listed}"
    else:
        return _json(query)
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


@dataclass
class _Running:
    run_id: str
    kind: str
    summary: str
    text: str  # the query's JSON (cut at _SUMMARY_CHARS)
    started_at: float  # wall clock, for the page
    started: float  # perf_counter, for the elapsed time
    cancel: threading.Event


class QueryBoard:
    """Recent and running queries of one server. Thread-safe."""

    def __init__(self, capacity: int = RECENT_QUERIES) -> None:
        self._lock = threading.Lock()
        self._recent: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._running: dict[threading.Event, _Running] = {}
        self._ids = itertools.count(1)

    def started(
        self,
        cancel: threading.Event,
        kind: str,
        query: Mapping[str, Any],
        run_id: str | None = None,
    ) -> str:
        """Note a query that came in, identified by its ``cancel`` event; returns its
        running id (what :meth:`cancel` takes): ``run_id`` (the id the server's log
        names it by), or a number of the board's own."""
        run = _Running(
            run_id or str(next(self._ids)),
            kind,
            _summary(query),
            _json(query),
            time.time(),
            time.perf_counter(),
            cancel,
        )
        with self._lock:
            self._running[cancel] = run
        return run.run_id

    def finished(
        self,
        cancel: threading.Event,
        outcome: str,
        seconds: float,
        diagnostics: Mapping[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        """Move the query of ``cancel`` to the recent ones (``diagnostics``: its
        ``to_dict()``, None when it failed before it had any)."""
        with self._lock:
            run = self._running.pop(cancel, None)
            if run is None:
                return
            diag = diagnostics or {}
            self._recent.append(
                {
                    "run_id": run.run_id,
                    # a query that failed has no diagnostics: its id is the one it ran under
                    "query_id": diag.get("query_id") or run.run_id,
                    "type": run.kind,
                    "query": run.summary,
                    "query_json": run.text,
                    "lakehouse": (diag.get("lakehouse") or {}).get("status"),
                    "source": (diag.get("source_cache") or {}).get("status"),
                    "graph": (diag.get("graph_cache") or {}).get("status"),
                    "rows": diag.get("rows"),
                    "attempts": len(diag["attempts"]) if "attempts" in diag else None,
                    "outcome": outcome,
                    "ms": round(seconds * 1e3, 3),
                    "message": message,
                    "started_at": run.started_at,
                }
            )

    def left(self, cancel: threading.Event) -> None:
        """The query of ``cancel`` left the server; one not yet recorded as finished
        (refused before it ran) is recorded as an error."""
        with self._lock:
            run = self._running.get(cancel)
        if run is not None:
            self.finished(cancel, "error", time.perf_counter() - run.started)

    def cancel(self, run_id: str) -> bool:
        """Cancel the running query ``run_id``; False when none runs under that id."""
        with self._lock:
            for run in self._running.values():
                if run.run_id == run_id:
                    run.cancel.set()
                    return True
        return False

    def recent(self) -> list[dict[str, Any]]:
        """The finished queries, newest first."""
        with self._lock:
            return [dict(row) for row in reversed(self._recent)]

    def running(self) -> list[dict[str, Any]]:
        """The running queries, oldest first."""
        now = time.perf_counter()
        with self._lock:
            runs = sorted(self._running.values(), key=lambda r: r.started)
        return [
            {
                "run_id": run.run_id,
                "type": run.kind,
                "query": run.summary,
                "query_json": run.text,
                "started_at": run.started_at,
                "ms": round((now - run.started) * 1e3, 3),
                "cancelling": run.cancel.is_set(),
            }
            for run in runs
        ]
