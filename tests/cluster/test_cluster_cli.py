"""``nexus-cache cluster report`` against a real scheduler (workers in this process)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from nexus_cache.cli.main import main  # noqa: E402
from nexus_cache.cluster import ClusterQueryClient  # noqa: E402
from nexus_cache.graph.registry import ALGORITHMS  # noqa: E402
from nexus_cache.service import Count, Scan  # noqa: E402
from service._helpers import make_config, make_lake  # noqa: E402


@contextlib.contextmanager
def _in_process(workers: int) -> Iterator[tuple[Any, Any]]:
    """A LocalCluster of ``workers`` in-process workers and a client, closed within
    bounds: a cluster stuck at close fails its test instead of holding the run."""
    local = distributed.LocalCluster(
        n_workers=workers, processes=False, dashboard_address=":0", silence_logs=40
    )
    try:
        client = distributed.Client(local)
        try:
            yield local, client
        finally:
            client.close(timeout=20)
    finally:
        local.close(timeout=30)


@pytest.fixture
def cluster(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    with _in_process(2) as (local, client):
        yield local, client


def test_report_lists_each_workers_caches_as_json_and_as_a_table(cluster, tmp_path, capsys):
    local, client = cluster
    lake = make_lake(tmp_path)
    nexus = ClusterQueryClient(client, make_config(tmp_path))
    query = Scan(lake.facts)
    nexus.execute(query)
    owner = nexus.execute(query).diagnostics.worker
    assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    workers = {w["worker"]: w for w in data["workers"]}
    assert set(workers) == set(nexus.workers())
    assert workers[owner]["devices"][0]["source_hits"] == 1
    assert workers[owner]["lakehouse"]["root"].endswith("worker-" + workers[owner]["name"])
    (program,) = workers[owner]["program_cache"]
    assert program["kind"] == "FileStreamProgramCache"
    assert main(["cluster", "report", "--scheduler", local.scheduler_address]) == 0
    out = capsys.readouterr().out
    for address in workers:
        assert address in out
    assert "2 workers" in out
    assert "warm-up" in out


def test_each_worker_is_warmed_up_when_the_plugin_starts(cluster, capsys):
    local, client = cluster
    ClusterQueryClient(client)  # registering the plugin returns once the workers are warm
    assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)["workers"]
    assert len(reports) == 2
    for report in reports:
        warm_up = report["warm_up"]
        assert warm_up["state"] == "done", warm_up
        assert warm_up["error"] is None
        assert warm_up["backend"] == "host"
        assert warm_up["seconds"] > 0
        (device,) = warm_up["devices"]
        # every query path ran once: the decode, the scan result, every algorithm
        assert {"decode", "scan result", "source copy"} <= set(device["steps"])
        for name in ALGORITHMS:
            assert any(step.startswith(f"{name} (") for step in device["steps"]), name
        # nothing of it stays charged
        assert report["devices"][0]["source_entries"] == 0
        assert report["devices"][0]["graph_entries"] == 0
    assert main(["cluster", "report", "--scheduler", local.scheduler_address]) == 0
    out = capsys.readouterr().out
    assert (
        out.count(" s ") >= 2 or out.count(" s│") >= 2 or out.count(" s ") + out.count(" s|") >= 2
    )


def test_a_failed_warm_up_is_reported_and_the_worker_serves_on(tmp_path, monkeypatch, capsys):
    # A 16 KiB host device: the service starts, its warm-up runs out of memory.
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", "16KiB")
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    lake = make_lake(tmp_path)
    with _in_process(1) as (local, client):
        nexus = ClusterQueryClient(client, make_config(tmp_path, cache_cap_bytes=1024))
        assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
        (report,) = json.loads(capsys.readouterr().out)["workers"]
        assert report["service"] is True
        warm_up = report["warm_up"]
        assert warm_up["state"] == "failed"
        assert "NEXUS_HOST_DEVICE_TOTAL_BYTES" in warm_up["error"]
        assert main(["cluster", "report", "--scheduler", local.scheduler_address]) == 0
        assert "FAILED after" in capsys.readouterr().out
        # the worker's service answers (here: with its own refusal of a too-large grant)
        with pytest.raises(Exception, match="can never be admitted"):
            nexus.execute(Count(lake.facts))


def test_a_worker_without_the_plugin_is_listed_as_such(cluster, capsys):
    local, _ = cluster
    assert main(["cluster", "report", "--scheduler", local.scheduler_address, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [w["service"] for w in data["workers"]] == [False, False]


def _refused_address() -> str:
    with socket.socket() as s:  # bound, never listening: a connection is refused
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_refused_scheduler_address_fails_at_once_not_after_the_timeout(capsys):
    address = _refused_address()
    started = time.monotonic()
    assert main(["cluster", "report", "--scheduler", address, "--timeout", "60"]) == 2
    # Dask alone retries a refused connection for the whole --timeout
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: cannot reach the Dask scheduler")
    assert "refused" in err
    assert err.count("\n") == 1


def test_an_unknown_scheduler_host_fails_at_once(capsys):
    started = time.monotonic()
    address = "tcp://no-such-host.invalid:8786"
    assert main(["cluster", "report", "--scheduler", address, "--timeout", "60"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "no-such-host.invalid" in err
    assert "unknown" in err


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e400"])
def test_a_timeout_that_is_no_positive_number_of_seconds_is_a_bad_option(timeout, capsys):
    # Dask failed on these far from the option: a negative or NaN one with a
    # ValueError of its own and exit status 1, zero as an unreachable scheduler
    argv = ["cluster", "report", "--scheduler", _refused_address(), "--timeout", timeout]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--timeout {timeout!r} is not accepted" in err
    assert "seconds > 0" in err


def test_an_unreachable_scheduler_is_one_line_and_exit_2(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    assert main(["cluster", "report", "--scheduler", address, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: cannot reach the Dask scheduler")
    assert err.count("\n") == 1


@contextlib.contextmanager
def _listener(answer: bytes | None) -> Iterator[str]:
    """A loopback TCP listener that is no Dask scheduler: it sends ``answer`` to
    each connection and keeps it open, or (None) never answers at all."""
    server = socket.create_server(("127.0.0.1", 0))
    kept: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            kept.append(conn)
            if answer is not None:
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        # shutdown wakes the thread's accept (a close alone leaves it waiting)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)
        assert not thread.is_alive()
        for conn in kept:
            conn.close()


@pytest.mark.parametrize(
    "answer",
    [None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"],
    ids=["silent", "http"],
)
def test_a_listener_that_is_no_scheduler_fails_within_the_timeout(answer):
    # Dask bounds the connection, not its handshake: a silent listener held the
    # command forever, an HTTP answer failed it with a MemoryError (exit 1)
    with _listener(answer) as address:
        argv = ["cluster", "report", "--scheduler", address, "--timeout", "2"]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "nexus_cache.cli.main", *argv],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 60
    assert done.stderr.startswith("nexus-cache: error: ")
    assert address in done.stderr
    assert "no Dask scheduler" in done.stderr
    assert "check --scheduler" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_workers_address_is_refused_naming_its_scheduler(cluster, capsys):
    local, client = cluster
    worker = sorted(client.scheduler_info()["workers"])[0]
    assert main(["cluster", "report", "--scheduler", worker, "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert f"at {worker} is no Dask scheduler (it says it is a Worker)" in err
    assert f"its scheduler is at {local.scheduler_address}" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("address", ["foo", "tcp://127.0.0.1", "http://127.0.0.1:8786"])
def test_a_malformed_scheduler_address_is_named_as_such(address, capsys):
    # it failed as 'cannot reach ... within 2 s (ValueError)', then waited 6 s
    started = time.monotonic()
    assert main(["cluster", "report", "--scheduler", address, "--timeout", "2"]) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert err.startswith(f"nexus-cache: error: --scheduler {address!r} is not a Dask scheduler")
    assert err.count("\n") == 1


def test_a_worker_that_does_not_answer_fails_the_report_within_the_timeout(
    cluster, monkeypatch, capsys
):
    # Dask's Client.run has no bound: a worker that never answered (its event loop
    # stuck) held the command for ever, whatever --timeout said
    import asyncio

    from nexus_cache.cluster import plugin

    local, _ = cluster

    async def stuck(dask_worker):  # type: ignore[no-untyped-def]
        await asyncio.sleep(60)

    monkeypatch.setattr(plugin, "_report_off_the_loop", stuck)
    started = time.monotonic()
    argv = ["cluster", "report", "--scheduler", local.scheduler_address, "--timeout", "2"]
    assert main(argv) == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert f"the workers of the Dask scheduler at {local.scheduler_address} did not all " in err
    assert "within 2 s" in err
    assert err.count("\n") == 1


def test_a_workers_report_is_built_off_its_event_loop(cluster, monkeypatch):
    # a report that waits (for a busy cache's lock) must not stall the worker
    import asyncio

    from nexus_cache.cluster import plugin

    _, client = cluster
    ClusterQueryClient(client)
    on_a_loop = []
    real = plugin.worker_report

    def spy(dask_worker=None):  # type: ignore[no-untyped-def]
        try:
            asyncio.get_running_loop()
            on_a_loop.append(True)
        except RuntimeError:  # no event loop runs in this thread
            on_a_loop.append(False)
        return real(dask_worker)

    monkeypatch.setattr(plugin, "worker_report", spy)
    reports = plugin.cluster_report(client)
    assert [r["service"] for r in reports] == [True, True]
    assert on_a_loop == [False, False]
