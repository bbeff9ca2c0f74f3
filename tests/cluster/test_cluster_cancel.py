"""A cancel event given to ``ClusterQueryClient.execute`` stops the query on its
worker, which releases its grant: a real Dask ``LocalCluster`` (host backend)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from nexus_cache.cluster import ClusterQueryClient, worker_report  # noqa: E402
from nexus_cache.errors import ConfigError, QueryCancelledError  # noqa: E402
from nexus_cache.service import GraphQuery, Scan  # noqa: E402
from nexus_cache.service.datagen import fact_table, ring_edges, write_parquet  # noqa: E402
from server._helpers import wait_until  # noqa: E402
from service._helpers import make_config  # noqa: E402

pytestmark = pytest.mark.timeout(180)

# A PageRank that runs for hours (alpha near 1 on a ring).
_SLOW = {"alpha": 0.99999, "tol": 1e-300, "max_iter": 10**8}


def _failure_logs(client: Any) -> list[str]:
    """The ``Compute Failed`` records (with their tracebacks) in the workers' and
    the scheduler's logs, as Dask keeps them."""
    records = [msg for logs in client.get_worker_logs().values() for _, msg in logs]
    records += [msg for _, msg in client.get_scheduler_logs()]
    return [msg for msg in records if "Compute Failed" in msg or "Traceback" in msg]


def _executing(client: Any) -> int:
    """How many tasks the one worker's threads run now."""
    counts = client.run(lambda dask_worker: dask_worker.state.executing_count)
    return int(sum(counts.values()))


def _grants(client: object) -> list[int]:
    reports = client.run(worker_report)  # type: ignore[attr-defined]
    return [d["grant_count"] for r in reports.values() for d in r["devices"]]


@contextlib.contextmanager
def _one_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, ClusterQueryClient]]:
    """A one-worker process cluster on the host backend, its Dask client and
    a ClusterQueryClient over it."""
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", "1GiB")
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=True,
            dashboard_address=":0",
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client, ClusterQueryClient(client, make_config(tmp_path))


def test_a_cancel_event_stops_the_query_on_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring, facts = tmp_path / "ring.parquet", tmp_path / "facts.parquet"
    write_parquet(ring_edges(100_000), ring, row_groups=2)
    write_parquet(fact_table(2000), facts, row_groups=2)
    past = time.time() - 60
    for path in (ring, facts):
        os.utime(path, (past, past))
    with _one_worker(tmp_path, monkeypatch) as (client, nexus):
        with pytest.raises(ConfigError, match="cancel="):
            nexus.execute(Scan(str(facts)), cancel=True)  # type: ignore[arg-type]
        already = threading.Event()
        already.set()
        with pytest.raises(QueryCancelledError, match="before it was sent to a worker"):
            nexus.execute(Scan(str(facts)), cancel=already)
        # a cancel event never set changes nothing
        assert nexus.execute(Scan(str(facts)), cancel=threading.Event()).table.num_rows == 2000
        cancel = threading.Event()
        timer = threading.Timer(2.0, cancel.set)
        timer.start()
        started = time.monotonic()
        with pytest.raises(QueryCancelledError, match="during its graph algorithm"):
            nexus.execute(
                GraphQuery(Scan(str(ring)), "src", "dst", "pagerank", params=_SLOW),
                cancel=cancel,
            )
        timer.join()
        # the query would run for hours: a bound far above the cancel's cost
        # still tells a cancelled run from one that ran on (on a loaded host too)
        assert time.monotonic() - started < 60
        assert _grants(client) == [0]  # the worker released the grant
        # the worker goes on serving
        assert nexus.execute(Scan(str(facts))).table.num_rows == 2000
        # a cancel is an outcome the caller asked for, not a failure: no traceback
        assert _failure_logs(client) == []
        # (while a query that fails is logged as Dask logs it: the logs are read)
        with pytest.raises(Exception, match="missing"):
            nexus.execute(Scan(str(tmp_path / "missing.parquet")))
        (failed,) = _failure_logs(client)
        assert "missing.parquet" in failed
        assert "QueryCancelledError" not in failed


def test_ctrl_c_in_the_caller_cancels_the_query_on_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = tmp_path / "ring.parquet"
    write_parquet(ring_edges(100_000), ring, row_groups=2)
    past = time.time() - 60
    os.utime(ring, (past, past))
    assert threading.current_thread() is threading.main_thread()  # where SIGINT lands
    with _one_worker(tmp_path, monkeypatch) as (client, nexus):
        slow = GraphQuery(Scan(str(ring)), "src", "dst", "pagerank", params=_SLOW)
        # the caller holds an event, so the query is cancellable; Ctrl-C comes instead
        timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            nexus.execute(slow, cancel=threading.Event())
        timer.join()
        # the worker stops at its next iteration and its task ends
        assert wait_until(
            lambda: _grants(client) == [0] and _executing(client) == 0, timeout=60
        ), "the worker's query runs on"
        assert _failure_logs(client) == []
