"""The metrics / status port closes connections that stay silent: each holds a
thread, so idle clients must not pile up threads for ever."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

from tests.service._helpers import make_service

from nexus_cache.server.metrics import MetricsEndpoint, ServerMetrics


def test_silent_connections_are_closed_and_their_threads_end(tmp_path: Path) -> None:
    service = make_service(tmp_path / "svc")
    endpoint = MetricsEndpoint(
        ServerMetrics(service, lambda: 0, 1.0), "127.0.0.1", 0, idle_timeout_s=0.5
    )
    try:
        before = threading.active_count()
        idle = [
            socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) for _ in range(5)
        ]
        try:
            started = time.monotonic()
            for conn in idle:
                assert conn.recv(1) == b""  # closed by the server, not by our 10 s timeout
            assert time.monotonic() - started < 8
        finally:
            for conn in idle:
                conn.close()
        deadline = time.monotonic() + 10
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert threading.active_count() <= before
        # the port still serves
        with urllib.request.urlopen(
            f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10
        ) as got:
            assert b"nexus_queries_total" in got.read()
    finally:
        endpoint.close()
        service.shutdown()
