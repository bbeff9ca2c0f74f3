"""The status page on ``--metrics-port``: real server processes on loopback, the
JSON checked against the ``reports`` action and ``/metrics``, the page in a
real headless Chromium, the token on every route, the Grafana dashboard's
metrics."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from nexus_cache.client import Client
from nexus_cache.service.datagen import fact_table, ring_edges, rmat_edges, write_parquet

from ._chromium import CHROMIUM, Browser
from ._helpers import Server, close_all, run_python, server_env, start_server, wait_until

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<script>x</script>"
HOSTILE_COLUMN = "<img src=x onerror=alert(1)>"
# A PageRank that runs for hours (alpha near 1 on a ring: see ring_edges).
_SLOW = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}
_CLIENT = """
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
print("asking", flush=True)
try:
    client.do_get(flight.Ticket(sys.argv[2].encode())).read_all()
    print("done", flush=True)
except flight.FlightError as exc:
    print("refused", str(exc).splitlines()[0], flush=True)
"""
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs Chromium (Debian's 'chromium' package; .ci/run installs it)",
)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    write_parquet(rmat_edges(8), root / "edges.parquet", row_groups=2)
    write_parquet(ring_edges(100_000), root / "ring.parquet", row_groups=2)
    # a file named <script>x</script>: a directory "<script>x<" holding "script>.parquet"
    (root / HOSTILE).parent.mkdir()
    write_parquet(fact_table(2000), root / f"{HOSTILE}.parquet", row_groups=2)
    pq.write_table(pa.table({HOSTILE_COLUMN: list(range(100))}), root / "columns.parquet")
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    for path in root.rglob("*"):
        os.utime(path, (past, past))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    root = tmp_path_factory.mktemp("served")
    server = start_server(server_env(root), "--metrics-port", "0")
    assert server.metrics_url is not None
    try:
        yield server, server.metrics_url.rsplit("/metrics", 1)[0]
    finally:
        close_all([server])


def _scan(path: Path, columns: tuple[str, ...] | None = None) -> dict[str, Any]:
    return {"type": "scan", "source": str(path), "columns": columns}


def _pagerank(path: Path, **params: Any) -> dict[str, Any]:
    edges = {"type": "scan", "source": str(path), "columns": ["src", "dst"]}
    return {
        "type": "graph",
        "edges": edges,
        "src": "src",
        "dst": "dst",
        "algorithm": "pagerank",
        "params": params,
    }


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def _post(base: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
    host = base.split("://", 1)[1]
    connection = http.client.HTTPConnection(host, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read(), answer.headers
    finally:
        connection.close()


def _status(base: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    code, body, _ = _get(base + "/api/status", headers)
    assert code == 200, body
    return dict(json.loads(body))


def _metric_samples(base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    _, text, _ = _get(base + "/metrics")
    samples = {}
    for line in text.decode().splitlines():
        if line.startswith("#") or not line:
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def _requests_by_cache(samples: dict[Any, float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        if name == "nexus_cache_requests_total":
            label = dict(labels)
            out.setdefault(label["cache"], {})[label["status"]] = value
    return out


def _mix(url: str, lake: Path) -> list[str]:
    """Scans (one of the file named <script>x</script>) and PageRanks, each twice;
    returns the query ids."""
    ids = []
    with Client(url) as client:
        for _ in range(2):
            for query in (
                _scan(lake / f"{HOSTILE}.parquet"),
                _scan(lake / "columns.parquet", (HOSTILE_COLUMN,)),
                _pagerank(lake / "edges.parquet"),
            ):
                ids.append(client.execute(query).diagnostics.query_id)
    return ids


# -- /api/status against the reports action and /metrics -----------------------------------


def test_api_status_agrees_with_reports_and_metrics(
    served: tuple[Server, str], lake: Path
) -> None:
    server, base = served
    ids = _mix(server.url, lake)
    with Client(server.url) as client:
        reports = client.reports()
    status = _status(base)
    samples = _metric_samples(base)

    # devices: the reports action's rows, plus the resident bytes of each cache
    assert [d["device_id"] for d in status["devices"]] == [r["device_id"] for r in reports]
    for device, report in zip(status["devices"], reports, strict=True):
        for name in (
            "managed_capacity_bytes",
            "cache_cap_bytes",
            "cache_charged_bytes",
            "cache_evictable_resident_bytes",
            "cache_pinned_in_use_bytes",
            "grant_bytes",
            "free_managed_bytes",
            "source_entries",
            "graph_entries",
            "source_hits",
            "graph_hits",
            "domain_used_bytes",
        ):
            assert device[name] == report[name], name
        resident = device["resident_bytes_by_cache"]
        assert resident["source"] + resident["graph"] == (
            report["cache_evictable_resident_bytes"] + report["cache_pinned_in_use_bytes"]
        )

    # resident entries: objects by path, their columns, hits since published
    sources = {(s["object"], tuple(s["columns"] or ())): s for s in status["sources"]}
    hostile = sources[(str(lake / f"{HOSTILE}.parquet"), ())]
    assert hostile["hits"] == 1
    assert hostile["bytes"] > 0
    assert hostile["pins"] == 0
    assert (str(lake / "columns.parquet"), (HOSTILE_COLUMN,)) in sources
    assert len(status["sources"]) == reports[0]["source_entries"]
    (graph,) = status["graphs"]
    short = graph["fingerprint"][:8]
    assert graph["key"] == f"{lake / 'edges.parquet'}: src -> dst, directed ({short})"
    assert graph["hits"] == 1
    assert graph["vertices"] > 0
    assert graph["edges"] == pq.read_metadata(lake / "edges.parquet").num_rows
    assert sum(s["bytes"] for s in status["sources"]) == resident["source"]

    # counters: exactly what /metrics says
    assert status["requests"] == _requests_by_cache(samples)
    ok = sum(
        v
        for (n, labels), v in samples.items()
        if n == "nexus_queries_total" and ("outcome", "ok") in labels
    )
    assert status["queries_total"]["ok"] == ok >= len(ids)
    assert status["admission"] == {
        "waits": samples[("nexus_admission_waits_total", frozenset())],
        "refusals": samples[("nexus_admission_refusals_total", frozenset())],
    }
    # the hit-rate series end with the interval running now, whose lookups count the mix
    assert status["hit_rates"]["source"][-1]["lookups"] >= len(ids)
    assert status["hit_rates"]["source"][-1]["hits"] >= len(ids) // 2

    # the recent queries, newest first, with their three statuses
    recent = {row["query_id"]: row for row in status["recent"]}
    assert set(ids) <= set(recent)
    assert status["recent"][0]["query_id"] == ids[-1]
    last = recent[ids[-1]]
    assert (last["type"], last["lakehouse"], last["source"], last["graph"]) == (
        "graph",
        "hit",
        "hit",
        "hit",
    )
    assert last["rows"] == graph["vertices"]
    assert last["attempts"] == 1
    assert last["outcome"] == "ok"
    assert last["ms"] > 0
    assert status["running"] == []

    # the lakehouse cache: bytes against MAX_BYTES, entries
    lakehouse = status["lakehouse"]
    assert lakehouse["max_bytes"] == 4 << 30
    assert lakehouse["entries"] == 3
    assert lakehouse["bytes"] > 0
    assert lakehouse["fills_in_flight"] == 0


def test_the_board_keeps_the_last_200_queries() -> None:
    import threading

    from nexus_cache.server.querylog import QueryBoard

    board = QueryBoard()
    for number in range(205):
        cancel = threading.Event()
        board.started(cancel, "scan", {"n": number})
        board.finished(cancel, "ok", 0.001, {"query_id": str(number), "attempts": [{}]})
    recent = board.recent()
    assert len(recent) == 200
    assert [r["query_id"] for r in recent[:2]] == ["204", "203"]
    assert recent[-1]["query_id"] == "5"


# -- the page in Chromium ---------------------------------------------------------------------

_TEXT = "(id) => document.getElementById(id).textContent"


@needs_chromium
def test_the_page_renders_updates_and_escapes_in_chromium(
    served: tuple[Server, str], lake: Path
) -> None:
    server, base = served
    ids = _mix(server.url, lake)
    with Browser(base + "/") as browser:
        assert browser.wait_for(
            f"document.getElementById('recent').textContent.includes({json.dumps(ids[-1])})"
        ), browser.evaluate("document.body.outerHTML")
        status = _status(base)
        devices = browser.evaluate("document.querySelectorAll('#devices .device').length")
        assert devices == len(status["devices"]) >= 1
        assert browser.evaluate("document.querySelectorAll('#devices .seg').length") >= 5
        sources = browser.evaluate(f"({_TEXT})('sources')")
        assert str(lake / f"{HOSTILE}.parquet") in sources
        assert HOSTILE_COLUMN in sources
        assert f"{lake / 'edges.parquet'}: src -> dst" in browser.evaluate(f"({_TEXT})('graphs')")
        assert browser.evaluate("document.querySelectorAll('#rates svg').length") == 3
        # the hostile names are text: no element came of them, nothing ran
        assert browser.evaluate("document.scripts.length") == 1
        assert browser.evaluate("document.querySelectorAll('main img, main script').length") == 0
        cells = browser.evaluate(
            "Array.from(document.querySelectorAll('#sources td')).map(td => td.textContent)"
        )
        assert str(lake / f"{HOSTILE}.parquet") in cells
        assert HOSTILE_COLUMN in cells

        # another query shows up without reloading the page
        browser.evaluate("window.__marker = 'same page'")
        refreshes = int(browser.evaluate("document.body.dataset.refreshes"))
        with Client(server.url) as client:
            new = client.execute(_scan(lake / "edges.parquet")).diagnostics.query_id
        assert browser.wait_for(
            f"document.getElementById('recent').textContent.includes({json.dumps(new)})"
        )
        assert browser.evaluate("window.__marker") == "same page"
        assert int(browser.evaluate("document.body.dataset.refreshes")) > refreshes


@needs_chromium
def test_the_cancel_button_cancels_a_running_query(served: tuple[Server, str], lake: Path) -> None:
    server, base = served
    query = json.dumps(_pagerank(lake / "ring.parquet", **_SLOW))
    client = run_python(server_env(Path("/nonexistent")), _CLIENT, server.url, query)
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "asking"
        assert wait_until(lambda: len(_status(base)["running"]) == 1, timeout=60)
        with Browser(base + "/") as browser:
            assert browser.wait_for("!!document.querySelector('#running button')")
            browser.evaluate("document.querySelector('#running button').click()")
            answer = client.stdout.readline()
        assert answer.startswith("refused"), answer
        assert "cancel" in answer, answer
        assert wait_until(lambda: _status(base)["running"] == [], timeout=10)
        with Client(server.url) as flight_client:
            assert wait_until(lambda: flight_client.reports()[0]["grant_bytes"] == 0, 10)
        row = _status(base)["recent"][0]
        assert row["outcome"] == "cancelled"
        assert "ring.parquet" in row["query"]
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate(timeout=30)


def test_queries_refused_for_a_slot_or_failing_are_logged_counted_and_named(
    tmp_path: Path, lake: Path
) -> None:
    """A query that got no running-query slot within queue_timeout_s, and one that
    failed, each have their log line, their count under outcome="error" and a row
    on the page naming them by the id they ran under."""
    env = server_env(
        tmp_path, NEXUS_SERVER_MAX_RUNNING_QUERIES="1", NEXUS_SERVER_QUEUE_TIMEOUT_S="0"
    )
    server = start_server(env, "--metrics-port", "0")
    query = json.dumps(_pagerank(lake / "ring.parquet", **_SLOW))
    holder = run_python(server_env(Path("/nonexistent")), _CLIENT, server.url, query)
    try:
        assert server.metrics_url is not None
        base = server.metrics_url.rsplit("/metrics", 1)[0]
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "asking"
        assert wait_until(lambda: len(_status(base)["running"]) == 1, timeout=60)
        plain = flight.connect(server.url)

        def ask(query_id: str, source: Path) -> None:
            options = flight.FlightCallOptions(headers=[(b"x-nexus-query-id", query_id.encode())])
            ticket = flight.Ticket(json.dumps(_scan(source)).encode())
            with pytest.raises(flight.FlightError):
                plain.do_get(ticket, options).read_all()

        try:
            ask("queued-out", lake / "edges.parquet")  # the PageRank holds the one slot
            holder.kill()
            assert wait_until(lambda: _status(base)["running"] == [], timeout=60)
            ask("missing-file", lake / "missing.parquet")
        finally:
            plain.close()
        server.wait_for(r"query queued-out .*edges\.parquet.* error .*queue_timeout_s=0")
        server.wait_for(r"query missing-file .*missing\.parquet.* error ")
        rows = {row["query_id"]: row for row in _status(base)["recent"]}
        assert rows["queued-out"]["outcome"] == "error"
        assert "queue_timeout_s=0" in rows["queued-out"]["message"]
        assert rows["missing-file"]["outcome"] == "error"
        assert "missing.parquet" in rows["missing-file"]["message"]
        samples = _metric_samples(base)
        errors = samples[
            ("nexus_queries_total", frozenset({("type", "scan"), ("outcome", "error")}))
        ]
        assert errors == 2
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate(timeout=30)
        close_all([server])


# -- the token ------------------------------------------------------------------------------


def test_the_token_guards_the_page_api_and_cancel(tmp_path: Path, lake: Path) -> None:
    token = "s3cret-token"
    env = server_env(tmp_path, NEXUS_SERVER_TOKEN=token)
    server = start_server(env, "--metrics-port", "0")
    try:
        assert server.metrics_url is not None
        base = server.metrics_url.rsplit("/metrics", 1)[0]
        host = base.split("://", 1)[1]
        bearer = {"Authorization": f"Bearer {token}"}
        # no token, a wrong one, the token in the URL: refused, and no data leaks
        for url, headers in (
            ("/api/status", {}),
            ("/api/status", {"Authorization": "Bearer wrong"}),
            (f"/api/status?token={token}", {}),
            ("/api/status", {"Cookie": "nexus_session=guess"}),
        ):
            code, body, _ = _get(base + url, headers)
            assert code == 401, (url, headers)
            assert b"devices" not in body
        code, body, _ = _get(base + "/")
        assert code == 401
        assert b'action="/login"' in body
        assert b"status.js" not in body
        code, body, _ = _get(base + f"/?token={token}")
        assert code == 401
        assert b"status.js" not in body
        # the header opens both
        assert _get(base + "/", bearer)[0] == 200
        assert _status(base, bearer)["devices"]
        # /metrics stays as it was: open, no data (documented)
        assert _get(base + "/metrics")[0] == 200

        # the login form: a wrong token is refused, the right one sets a session cookie
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": base}
        assert _post(base, "/login", b"token=wrong", form)[0] == 401
        code, _, headers = _post(base, "/login", f"token={token}".encode(), form)
        assert code == 303
        cookie = headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert token not in cookie
        session = {"Cookie": cookie.split(";", 1)[0]}
        assert _status(base, session)["devices"]
        # a login or cancel from another origin is refused
        cross = {**form, "Origin": "http://evil.example"}
        assert _post(base, "/login", f"token={token}".encode(), cross)[0] == 403
        # cancel: the token, then the page's own origin, then a running id
        assert _post(base, "/api/cancel/1")[0] == 401
        assert _post(base, "/api/cancel/1", headers={**session, "Origin": "http://evil"})[0] == 403
        assert _post(base, "/api/cancel/1", headers=session)[0] == 403  # no origin at all
        same = {**session, "Origin": f"http://{host}"}
        code, body, _ = _post(base, "/api/cancel/1", headers=same)
        assert code == 404
        assert b"no running query" in body
        assert _post(base, "/api/cancel/1", headers=bearer)[0] == 404
    finally:
        close_all([server])


# -- Grafana -----------------------------------------------------------------------------------


def _dashboard_metrics() -> set[str]:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "nexus-cache.json").read_text())
    exprs = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert exprs
    names = set()
    for expr in exprs:
        without_labels = re.sub(r"\{[^}]*\}", "", expr)
        names |= set(re.findall(r"\bnexus_[a-z0-9_]+", without_labels))
    return names


def test_every_metric_the_grafana_dashboard_queries_is_exported(
    served: tuple[Server, str], lake: Path
) -> None:
    server, base = served
    _mix(server.url, lake)  # every labelled series has a sample
    exported = {name for name, _ in _metric_samples(base)}
    wanted = _dashboard_metrics()
    assert len(wanted) >= 6
    assert wanted <= exported, sorted(wanted - exported)
