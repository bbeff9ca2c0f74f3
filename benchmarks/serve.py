#!/usr/bin/env python3
"""The query server against the in-process service, on the same warm queries.

One run measures, beside ``QueryService.execute`` in this process:

* **latency** of a warm one-row query seen by a client (p50, p99);
  target: p50 at most 1 ms above in-process. The floor beside it: a bare
  ``pyarrow.flight`` round trip of a one-row table (another process, no
  service), timed in the same loop;
* **streaming throughput** of a warm scan of ``--scan-gib`` GiB (default 1):
  end to end for both, and the stream alone (a plain Flight reader, from the
  first batch, which arrives once the query has executed, to the last);
  target: >= 1 GB/s on loopback. The ceiling beside it: a bare ``pyarrow.flight`` server in
  another process streaming the same bytes in batches of the same size;
* **queries per second** of the one-row query from 1, 4 and 16 client
  processes;
* with ``--soak-minutes M``, a **soak**: 16 client processes for M minutes on
  a mixed warm and cold workload (a cache cap small enough that LRU evicts,
  so projections keep missing), and beside them clients that read one batch
  of a 64 MiB result and are killed mid-stream; every result's fingerprint
  is checked against the in-process service's.
  Reported: wrong results (target 0), errors other than the killed clients
  (target 0), grants at the end (target 0), server RSS after warm-up and at
  the end (target: flat).

The server is a real ``nexus-cache serve`` process on loopback; clients are
``nexus_cache.client.Client``. ``--backend`` picks the device backend of
both sides (host by default). ``--demo-scale N`` (default 12; 0 skips it)
adds the demo's query mix, cold then warm, in process and from a client
(each side's service warmed up first, so cold means empty caches, not a
first compile); ``--only-demo`` runs that part alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _serve, when run as a script

from _serve.procs import Server, start_clients
from _serve.soak import COLUMNS, soak, soak_queries
from _workdir import workdir, workdir_label
from nexus_cache.client import Client
from nexus_cache.service import QueryService, ServiceConfig, table_fingerprint
from nexus_cache.service.datagen import rmat_edges, write_parquet

TARGET_P50_EXTRA_MS = 1.0
TARGET_GBPS = 1.0


# -- data ----------------------------------------------------------------------------------------


def _aged(path: Path) -> None:
    past = time.time() - 60
    os.utime(path, (past, past))


def make_data(work: Path, scan_gib: float, soak: bool) -> dict[str, Path]:
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    one = data / "one.parquet"
    pq.write_table(pa.table({"k": [1], "v": [0.5]}), one)
    files["one"] = one
    rows = int(scan_gib * (1 << 30)) // (8 * len(COLUMNS))
    big = data / "big.parquet"
    if not big.exists() or pq.read_metadata(big).num_rows != rows:
        writer = None
        step = 1 << 22
        for start in range(0, rows, step):
            n = min(step, rows - start)
            base = np.arange(start, start + n, dtype=np.int64)
            table = pa.table({c: base * (i + 1) for i, c in enumerate(COLUMNS)})
            if writer is None:
                writer = pq.ParquetWriter(big, table.schema, compression="none")
            writer.write_table(table, row_group_size=1 << 20)
        assert writer is not None
        writer.close()
    files["big"] = big
    if soak:
        for i in range(6):
            path = data / f"part{i}.parquet"
            n = 400_000
            base = np.arange(n, dtype=np.int64) + i
            pq.write_table(pa.table({c: base * (j + 2) for j, c in enumerate(COLUMNS)}), path)
            files[f"part{i}"] = path
        write_parquet(rmat_edges(12), data / "edges.parquet", row_groups=4)
        files["edges"] = data / "edges.parquet"
        n = 2_000_000  # 64 MiB decoded: more than gRPC buffers for a client that stops reading
        base = np.arange(n, dtype=np.int64)
        pq.write_table(
            pa.table({c: base for c in COLUMNS}), data / "mid.parquet", compression="none"
        )
        files["mid"] = data / "mid.parquet"
    for path in files.values():
        _aged(path)
    return files


def _env(work: Path, backend: str, cap: str | None, host_total: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "NEXUS_DEVICE_BACKEND": backend,
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(work / "lake-cache"),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "64GiB",
        "NEXUS_HOST_DEVICE_TOTAL_BYTES": host_total,
        "NEXUS_SERVER_MAX_RUNNING_QUERIES": "16",
        # the default 8x of the Parquet bytes would ask for the whole device for
        # the large scan, and admitting it would evict the very frame it reads
        "NEXUS_SERVICE_GRANT_EXPANSION": "2.5",
    }
    if cap is not None:
        env["NEXUS_DEVICE_CACHE_CAP_BYTES"] = cap
    for name in ("NEXUS_SERVER_TOKEN", "NEXUS_SERVER_URL", "NEXUS_SERVICE_CONFIG"):
        env.pop(name, None)
    return env


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """This process's NEXUS_* variables as in ``env`` while the block runs (the
    in-process service and the host backend read them)."""
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("NEXUS_")})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_PEER_SERVER = """
import sys
import numpy as np, pyarrow as pa, pyarrow.flight as flight
rows = int(sys.argv[1])
base = np.arange(rows, dtype=np.int64)
table = pa.table({c: base * (i + 1) for i, c in enumerate("abcd")})
table = pa.Table.from_batches(table.to_batches(max_chunksize=1 << 18))  # 8 MiB, as ours
class Peer(flight.FlightServerBase):
    def do_get(self, context, ticket):
        return flight.RecordBatchStream(table)
server = Peer("grpc://127.0.0.1:0")
print(server.port, flush=True)
sys.stdin.read()
server.shutdown()
"""


_PEER_FILES = """
import sys
import pyarrow as pa, pyarrow.flight as flight
class Peer(flight.FlightServerBase):
    def do_get(self, context, ticket):
        # the Arrow IPC file the ticket names, in batches of about 8 MiB, as ours
        table = pa.ipc.open_file(ticket.ticket.decode()).read_all()
        rows = max(1, (8 << 20) // max(1, table.nbytes // max(1, table.num_rows)))
        return flight.RecordBatchStream(pa.Table.from_batches(table.to_batches(max_chunksize=rows)))
server = Peer("grpc://127.0.0.1:0")
print(server.port, flush=True)
sys.stdin.read()
server.shutdown()
"""


def peer_tables(env: dict[str, str], paths: list[Path], repeats: int) -> list[float]:
    """Per Arrow IPC file, the seconds a bare pyarrow.flight server (another process,
    no service) takes to stream its table to a client (median of ``repeats``):
    the transport's floor for a result of those bytes."""
    with _peer(env, _PEER_FILES) as client:
        figures = []
        for path in paths:
            ticket = flight.Ticket(str(path).encode())
            client.do_get(ticket).read_all()  # the peer's first read of the file
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                client.do_get(ticket).read_all()
                times.append(time.perf_counter() - t0)
            figures.append(statistics.median(times))
        return figures


_LOG_SPLIT = re.compile(
    r"query (\S+) .* ok [\d.]+ ms \(execute ([\d.]+) ms(?:, stream ([\d.]+) ms)?\)"
)


def server_split(lines: list[str], query_ids: list[str]) -> tuple[float, float]:
    """Median milliseconds ``(execute, stream)`` of the queries ``query_ids`` as the
    server's log lines give them (stream 0 for a result of one batch)."""
    found: dict[str, tuple[float, float]] = {}
    for line in lines:
        if (m := _LOG_SPLIT.search(line)) and m.group(1) in query_ids:
            found[m.group(1)] = (float(m.group(2)), float(m.group(3) or 0.0))
    if not found:
        return float("nan"), float("nan")
    return (
        statistics.median(e for e, _ in found.values()),
        statistics.median(s for _, s in found.values()),
    )


def stream_only(url: str, query: dict[str, Any], repeats: int) -> tuple[float, int]:
    """``(seconds, bytes)`` of the stream alone, best of ``repeats``: from the first
    batch's arrival (the query has executed by then) to the last's."""

    client = flight.connect(url)
    best = (float("inf"), 0)
    try:
        for _ in range(repeats):
            reader = client.do_get(flight.Ticket(json.dumps(query).encode()))
            reader.read_chunk()
            t0, nbytes = time.perf_counter(), 0
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                nbytes += chunk.data.nbytes
            elapsed = time.perf_counter() - t0
            if elapsed < best[0]:
                best = (elapsed, nbytes)
    finally:
        client.close()
    return best


@contextlib.contextmanager
def _peer(env: dict[str, str], script: str, *args: str) -> Iterator[Any]:
    """A Flight client of a bare pyarrow.flight server (another process, no service)
    that ``script`` runs with ``args`` (:data:`_PEER_SERVER`: every ``do_get``
    streams a table of ``args[0]`` rows of 4 int64 columns; :data:`_PEER_FILES`:
    the Arrow IPC file a ticket names)."""

    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        client = flight.connect(f"grpc://127.0.0.1:{process.stdout.readline().strip()}")
        try:
            yield client
        finally:
            client.close()
    finally:
        process.communicate("", timeout=60)


def peer_stream(env: dict[str, str], rows: int, repeats: int) -> float:
    """Seconds a bare pyarrow.flight server (another process, the same table
    bytes, no service) takes to stream the table to a client: the ceiling."""

    with _peer(env, _PEER_SERVER, str(rows)) as client:
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            client.do_get(flight.Ticket(b"all")).read_all()
            times.append(time.perf_counter() - t0)
        return min(times[1:])


# -- measurements ------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(run: Any, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls (``repeats=0``: 20 untimed calls, a warm-up)."""
    if repeats == 0:
        for _ in range(20):
            run()
        return []
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


_QPS_CLIENT = """
import json, sys, time
from nexus_cache.client import Client
client = Client(sys.argv[1])
query = json.loads(sys.argv[2])
client.execute(query)
sys.stdout.write("ready\\n"); sys.stdout.flush()
start = float(sys.stdin.readline())
while time.time() < start:
    time.sleep(0.001)
done, end = 0, start + float(sys.argv[3])
while time.time() < end:
    client.execute(query)
    done += 1
print(done)
"""


def qps(
    env: dict[str, str], url: str, query: dict[str, Any], clients: int, seconds: float
) -> float:
    """Queries per second of ``clients`` processes, all started before the clock runs."""
    procs = start_clients(env, _QPS_CLIENT, [[url, json.dumps(query), str(seconds)]] * clients)
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()
    start = time.time() + 0.5
    total = 0
    for p in procs:
        out, _ = p.communicate(f"{start}\n", timeout=seconds + 300)
        total += int(out.split()[-1])
    return total / seconds


# -- the demo's query mix ------------------------------------------------------------------------


def demo_mix(work: Path, backend: str, scale: int, host_total: str) -> None:
    """The demo's queries, cold then warm (median of 3), in-process and from a client
    of a fresh server, each on a lakehouse root of its own; per warm query, what
    the server adds, its own split of it (executing, streaming: its log lines),
    and the floor of the transport: a bare pyarrow.flight server streaming the
    same result bytes."""
    from nexus_cache.service.datagen import fact_table
    from nexus_cache.service.demo import demo_queries

    lake = work / f"demo-{scale}"
    lake.mkdir(parents=True, exist_ok=True)
    edges = rmat_edges(scale, timestamps=True)  # the demo mix filters on ts
    write_parquet(edges, lake / "edges.parquet")
    write_parquet(fact_table(16 << scale), lake / "facts.parquet")
    for path in lake.iterdir():
        _aged(path)
    mix = demo_queries(
        str(lake / "edges.parquet"), str(lake / "facts.parquet"), int(edges["src"][0].as_py())
    )
    figures: dict[str, dict[str, float]] = {}
    warm_ids: dict[str, list[str]] = {}
    results: dict[str, Path] = {}

    def timed(run: Any, side: str) -> None:
        for name, query in mix:
            t0 = time.perf_counter()
            run(query)
            cold = time.perf_counter() - t0
            warm = []
            for _ in range(3):
                t0 = time.perf_counter()
                result = run(query)
                warm.append(time.perf_counter() - t0)
                warm_ids.setdefault(f"{side}:{name}", []).append(result.diagnostics.query_id)
            figures.setdefault(name, {})[f"{side}_cold"] = cold
            figures[name][f"{side}_warm"] = statistics.median(warm)
            figures[name]["bytes"] = result.table.nbytes
            if side == "server":
                results[name] = lake / f"result-{name}.arrow"
                with pa.ipc.new_file(results[name], result.table.schema) as writer:
                    writer.write_table(result.table)

    local_env = _env(work / f"demo-{scale}-local", backend, None, host_total)
    with _environment(local_env), QueryService(ServiceConfig.from_env()) as service:
        # as the server does before it reports ready: "cold" is the caches,
        # not the first compile of a kernel
        service.warm_up()
        timed(service.execute, "local")
    server = Server(_env(work / f"demo-{scale}-server", backend, None, host_total))
    try:
        with Client(server.url) as client:
            timed(client.execute, "server")
    finally:
        server.stop()
    floors = peer_tables(local_env, list(results.values()), 3)
    print(
        f"demo mix at scale {scale} ({backend}), seconds: in-process cold / warm, server cold / warm"
    )
    for name, f in figures.items():
        print(
            f"  {name:11s} {f['local_cold']:8.4f} / {f['local_warm']:8.4f}   "
            f"{f['server_cold']:8.4f} / {f['server_warm']:8.4f}"
        )
    print(
        "warm, ms: in-process, server (added; the server's log: execute, stream), "
        "result MB, a bare pyarrow.flight stream of the same bytes; target: the server adds "
        "at most 10% to a warm query above 10 ms"
    )
    for (name, f), floor in zip(figures.items(), floors, strict=True):
        local, remote = f["local_warm"] * 1e3, f["server_warm"] * 1e3
        execute, stream = server_split(server.lines, warm_ids[f"server:{name}"])
        verdict = (
            "(under 10 ms)"
            if local <= 10
            else f"ratio {remote / local:.2f}: {'met' if remote <= 1.1 * local else 'MISSED'}"
        )
        print(
            f"  {name:11s} {local:8.1f} {remote:8.1f} (+{remote - local:.1f}; "
            f"{execute:.1f}, {stream:.1f})  {f['bytes'] / 1e6:7.2f} MB  "
            f"bare stream {floor * 1e3:6.1f}   {verdict}"
        )


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host", choices=("host", "cuda"))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--scan-gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--stream-repeats", type=int, default=3)
    parser.add_argument("--qps-seconds", type=float, default=5.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--soak-cache-cap", default="160MiB")
    parser.add_argument("--demo-scale", type=int, default=12, help="0 skips the demo mix")
    parser.add_argument(
        "--only-demo", action="store_true", help="only the demo mix (at --demo-scale)"
    )
    args = parser.parse_args(argv)
    with workdir(args.workdir, "nexus-serve-bench-") as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: Path) -> int:
    if args.only_demo:
        demo_mix(work, args.backend, max(args.demo_scale, 1), str(8 << 30))
        return 0
    soaking = args.soak_minutes > 0
    files = make_data(work, args.scan_gib, soaking)
    host_total = str(int(args.scan_gib * 6 * (1 << 30)) + (2 << 30))
    env = _env(work, args.backend, None, host_total)
    one = {"type": "scan", "source": str(files["one"])}
    big = {"type": "scan", "source": str(files["big"])}
    big_bytes = 0
    kept = workdir_label(args.workdir, work)
    print(f"backend {args.backend}; scan {args.scan_gib:g} GiB; {kept}")

    # in-process and through the server, interleaved (alternating blocks) so
    # that the machine's load weighs on both alike
    server = Server(env)
    try:
        with (
            _environment(env),
            QueryService(ServiceConfig.from_env()) as service,
            Client(server.url) as client,
            _peer(env, _PEER_SERVER, "1") as bare,
        ):
            sides = {"local": service.execute, "remote": client.execute}
            # the floor: a bare pyarrow.flight round trip of a one-row table
            ticket = flight.Ticket(b"one")
            timed = {**sides, "bare": lambda _query: bare.do_get(ticket).read_all()}
            lat: dict[str, list[float]] = {side: [] for side in timed}
            block = max(1, args.repeats // 10)
            for run in timed.values():
                latency(lambda run=run: run(one), 0)  # warm-up
            for _ in range(10):
                for side, run in timed.items():
                    lat[side] += latency(lambda run=run: run(one), block)
            local_lat, remote_lat = lat["local"], lat["remote"]
            statuses = {}
            for run in sides.values():
                result = run(big)  # cold: decode into that side's source cache
                big_bytes = result.table.nbytes
                del result
            times: dict[str, list[float]] = {"local": [], "remote": []}
            for _ in range(args.stream_repeats):
                for side, run in sides.items():
                    t0 = time.perf_counter()
                    result = run(big)
                    times[side].append(time.perf_counter() - t0)
                    statuses[side] = result.diagnostics.source_cache["status"]
                    assert result.table.nbytes == big_bytes
                    del result
            local_stream, remote_stream = times["local"], times["remote"]
            status, remote_status = statuses["local"], statuses["remote"]
        p50_l, p99_l = _percentile(local_lat, 0.5) * 1e3, _percentile(local_lat, 0.99) * 1e3
        p50_r, p99_r = _percentile(remote_lat, 0.5) * 1e3, _percentile(remote_lat, 0.99) * 1e3
        print(f"one-row warm query, in-process: p50 {p50_l:.3f} ms, p99 {p99_l:.3f} ms")
        print(f"one-row warm query, server:     p50 {p50_r:.3f} ms, p99 {p99_r:.3f} ms")
        p50_b = _percentile(lat["bare"], 0.5) * 1e3
        extra = p50_r - p50_l
        print(
            f"RATIO one-row p50 above in-process: {extra:.3f} ms "
            f"(target <= {TARGET_P50_EXTRA_MS} ms: {'met' if extra <= TARGET_P50_EXTRA_MS else 'MISSED'})"
        )
        print(
            f"floor: a bare pyarrow.flight round trip of a one-row table, p50 {p50_b:.3f} ms; "
            f"the server's fixed cost above it (p50 above in-process, less the floor): "
            f"{extra - p50_b:.3f} ms"
        )
        t_local, t_remote = min(local_stream), min(remote_stream)
        gbps_local, gbps_remote = big_bytes / t_local / 1e9, big_bytes / t_remote / 1e9
        t_stream, streamed = stream_only(server.url, big, args.stream_repeats)
        streamed = max(streamed, 1)  # a result of one batch leaves nothing to time
        gbps_stream = streamed / t_stream / 1e9
        print(
            f"warm scan of {big_bytes / 2**30:.2f} GiB (source cache {status} / "
            f"{remote_status}): in-process {t_local:.3f} s ({gbps_local:.2f} GB/s), "
            f"server {t_remote:.3f} s ({gbps_remote:.2f} GB/s end to end)"
        )
        print(
            f"RATIO streaming of the result over loopback (first batch to last): "
            f"{t_stream:.3f} s for {streamed / 2**30:.2f} GiB, {gbps_stream:.2f} GB/s (target >= {TARGET_GBPS} GB/s: "
            f"{'met' if gbps_stream >= TARGET_GBPS else 'MISSED'})"
        )
        t_peer = peer_stream(env, pq.read_metadata(files["big"]).num_rows, args.stream_repeats)
        print(
            f"ceiling: a bare pyarrow.flight server streams the same bytes in {t_peer:.3f} s "
            f"({big_bytes / t_peer / 1e9:.2f} GB/s); ours / bare = "
            f"{(t_stream / streamed) / (t_peer / big_bytes):.2f} in time per byte"
        )
        for n in (int(c) for c in args.clients.split(",")):
            rate = qps(env, server.url, one, n, args.qps_seconds)
            print(f"QPS one-row warm query, {n} client processes: {rate:.0f}")
    finally:
        code = server.stop()
    print(f"server exit status on SIGTERM: {code}")
    if args.demo_scale > 0:
        demo_mix(work, args.backend, args.demo_scale, host_total)
    if soaking:
        # expected answers from the in-process service; a server whose cache
        # cap is small enough that LRU keeps evicting, so cold queries go on
        expected = {}
        with _environment(env), QueryService(ServiceConfig.from_env()) as service:
            for query in soak_queries(files):
                key = json.dumps(query, sort_keys=True)
                expected[key] = table_fingerprint(service.execute(query).table)
        soak_env = _env(work, args.backend, args.soak_cache_cap, host_total)
        server = Server(soak_env)
        try:
            figures = soak(server.url, server, soak_env, files, args.soak_minutes, expected)
        finally:
            code = server.stop()
        print(
            f"soak {args.soak_minutes:g} min, 16 clients, cache cap {args.soak_cache_cap}: "
            + json.dumps(figures)
        )
        print(f"soak server exit status on SIGTERM: {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
