"""Cancellation attacked from outside: clients killed at random moments, a shutdown
that cancels a result half streamed, a server stopped with queries waiting and
running. Real server processes on loopback (host backend)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nexus_cache.service import Scan
from nexus_cache.service.datagen import ring_edges, write_parquet

from ._helpers import close_all, server_env, start_server

# Reads the first batch of its result, waits for a line on stdin, then reads the
# rest: prints the rows it got, or the error that ended the stream.
_SLOW_READER = """
import sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
reader = client.do_get(flight.Ticket(sys.argv[2].encode()))
rows = reader.read_chunk().data.num_rows
print("first", rows, flush=True)
sys.stdin.readline()
try:
    while True:
        rows += reader.read_chunk().data.num_rows
except StopIteration:
    print("complete", rows, flush=True)
except flight.FlightError as exc:
    print("error", " ".join(str(exc).split())[:300], flush=True)
"""


def _old(path: Path) -> None:
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    os.utime(path, (past, past))


def test_a_result_cut_short_by_shutdown_ends_in_an_error_not_a_short_table(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    rows = 4_000_000  # 64 MB of result: several streamed batches
    write_parquet(ring_edges(rows - 1), lake / "ring.parquet", row_groups=4)
    _old(lake / "ring.parquet")
    env = server_env(
        tmp_path,
        NEXUS_SERVER_SHUTDOWN_TIMEOUT_S="1",
        NEXUS_SERVICE_EVIDENCE_DIR=str(tmp_path / "evidence"),
    )
    server = start_server(env)
    ticket = json.dumps(Scan(str(lake / "ring.parquet")).to_dict())
    reader = subprocess.Popen(
        [sys.executable, "-c", _SLOW_READER, server.url, ticket],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None
        assert reader.stdin is not None
        first = reader.stdout.readline().split() or ["nothing"]
        assert first[0] == "first", reader.communicate(timeout=30)
        assert 0 < int(first[1]) < rows
        # the client stalls mid-stream; the server is told to stop and, after
        # its 1 s wait, cancels the query still streaming
        server.process.send_signal(signal.SIGTERM)
        server.wait_for(r"1 queries still running .* cancelling them")
        reader.stdin.write("go\n")
        reader.stdin.flush()
        out, _err = reader.communicate(timeout=60)
        assert server.process.wait(60) == 0
        # the whole result, or an error: never a shorter table that looks whole
        kind, detail = out.split(maxsplit=1)
        assert kind == "error" or int(detail) == rows, out
        if kind == "error":
            assert "cut short" in detail
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.communicate(timeout=30)
        close_all([server])
