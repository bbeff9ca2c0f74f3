#!/usr/bin/env python3
"""Scale-out on Dask: a warm query mix on 1..N host-backend workers against one process.

Part 1, queries: a lake of ``--sources`` fact tables and one edge table; the
mix is, per fact table, a projected scan and a full scan, and
PageRank and BFS on the edges. Each configuration first runs the mix once
(cold: every source read and decoded once), then times ``--rounds`` rounds
of it with ``--clients`` threads submitting. Printed per configuration:
queries per second and the routing hit rate (the share of the warm
cacheable queries whose worker already held their source: a source-cache
hit). "one process" is one ``QueryService`` (host backend) given the same
threads.

Part 2, program cache: the median latency of a hit (``get`` of a 16 KiB
cubin-sized entry) through FileStream, Redis (a local ``redis-server`` on
loopback) and the tiered cache (memory, FileStream, Redis), in the same run.
Skipped when ``redis-server`` or redis-py is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import GraphQuery, QueryService, Scan, ServiceConfig
from nexus_cache.service.datagen import fact_table, rmat_edges, write_parquet


def _lake(root: Path, sources: int, rows: int, scale: int) -> tuple[list[str], str, int]:
    root.mkdir(parents=True, exist_ok=True)
    facts = []
    for i in range(sources):
        path = root / f"facts-{i}.parquet"
        write_parquet(fact_table(rows, seed=10 + i), path, row_groups=4)
        facts.append(str(path))
    edges = rmat_edges(scale)
    write_parquet(edges, root / "edges.parquet", row_groups=4)
    past = time.time() - 60  # older than local_min_age_s: identities provable
    for p in root.iterdir():
        os.utime(p, (past, past))
    return facts, str(root / "edges.parquet"), int(edges["src"][0].as_py())


def _mix(facts: list[str], edges: str, bfs_source: int) -> list[Any]:
    mix: list[Any] = []
    for f in facts:
        mix.append(Scan(f, columns=("customer", "amount")))
        mix.append(Scan(f))
    e = Scan(edges, columns=("src", "dst"))
    mix.append(GraphQuery(e, "src", "dst", "pagerank"))
    mix.append(GraphQuery(e, "src", "dst", "bfs", params={"source": bfs_source}))
    return mix


def _config(root: Path) -> ServiceConfig:
    return ServiceConfig(
        backend="host",
        cache_cap_bytes=256 << 20,
        lakehouse=LakehouseCacheConfig(
            root=root / "lakehouse",
            policy="fill_before_read",
            max_bytes="4GiB",
            local_min_age_s=0.0,
        ),
    )


def _timed_rounds(run: Any, mix: list[Any], rounds: int, clients: int) -> tuple[float, float]:
    """``(queries per second, source-cache hit rate)`` of ``rounds`` warm rounds."""
    for q in mix:  # cold round: every source read and decoded once
        run(q)
    work = [q for _ in range(rounds) for q in mix]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(run, work))
    elapsed = time.perf_counter() - t0
    statuses = [r.diagnostics.source_cache["status"] for r in results]
    cacheable = [s for s in statuses if not s.startswith("bypass")]
    hits = sum(1 for s in cacheable if s == "hit")
    return len(work) / elapsed, hits / max(1, len(cacheable))


def queries(args: argparse.Namespace, work: Path) -> None:
    facts, edges, bfs_source = _lake(work / "lake", args.sources, args.rows, args.scale)
    mix = _mix(facts, edges, bfs_source)
    print(
        f"mix: {len(mix)} queries ({args.sources} fact tables of {args.rows} rows, "
        f"R-MAT scale {args.scale}); {args.rounds} warm rounds, {args.clients} client threads; "
        f"{os.cpu_count()} CPU cores on this machine"
    )
    with QueryService(_config(work / "alone")) as alone:
        qps, hit = _timed_rounds(alone.execute, mix, args.rounds, args.clients)
    base = qps
    print(f"RESULT one process: {qps:8.1f} queries/s, source-cache hit rate {hit:.0%}")
    import distributed

    from nexus_cache.cluster import ClusterQueryClient

    for n in range(1, args.workers + 1):
        with (
            distributed.LocalCluster(
                n_workers=n,
                threads_per_worker=args.threads_per_worker,
                processes=True,
                dashboard_address=":0",
                silence_logs=40,
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            nexus = ClusterQueryClient(client, _config(work / f"cluster-{n}"))
            qps, hit = _timed_rounds(nexus.execute, mix, args.rounds, args.clients)
            used = {nexus.worker_for(q) for q in mix}
        print(
            f"RESULT {n} worker{'s' if n > 1 else ' '}: {qps:8.1f} queries/s "
            f"({qps / base:.2f}x one process), routing hit rate {hit:.0%}, "
            f"sources on {len(used)} workers"
        )


def _median_get(cache: Any, key: bytes, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        cache.get(key)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def programs(args: argparse.Namespace, work: Path) -> None:
    binary = shutil.which("redis-server")
    try:
        import redis  # noqa: F401
    except ImportError:
        binary = None
    from nexus_cache.program import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        RedisProgramCache,
        TieredProgramCache,
    )

    key, value = os.urandom(32), os.urandom(16 << 10)
    files = FileStreamProgramCache(work / "programs", memory_bytes=0)
    files[key] = value
    rows = [("FileStream (no memo)", _median_get(files, key, args.reads))]
    memo = FileStreamProgramCache(work / "programs")
    memo.get(key)
    rows.append(("FileStream (memo, default)", _median_get(memo, key, args.reads)))
    server = None
    if binary is None:
        print("redis-server or redis-py missing: Redis figures skipped")
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            shared = RedisProgramCache(url, namespace="bench")
            shared[key] = value
            rows.append(("Redis (loopback)", _median_get(shared, key, args.reads)))
            tiered = TieredProgramCache(
                [
                    InMemoryProgramCache(),
                    FileStreamProgramCache(work / "tiered"),
                    RedisProgramCache(url, namespace="bench"),
                ]
            )
            tiered.get(key)  # promoted from Redis into memory and disk
            rows.append(("tiered (hit in memory)", _median_get(tiered, key, args.reads)))
            below = TieredProgramCache(
                [FileStreamProgramCache(work / "tiered2", memory_bytes=0), shared]
            )
            below.get(key)
            rows.append(("tiered (FileStream, Redis)", _median_get(below, key, args.reads)))
        finally:
            server.terminate()
            server.wait()
    base = rows[0][1]
    for name, seconds in rows:
        print(
            f"RESULT program-cache hit, {name:27s}: {seconds * 1e6:8.1f} us "
            f"({seconds / base:.2f}x FileStream)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sources", type=int, default=9)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--scale", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--skip-queries", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="nexus-cluster-bench-"))
    os.environ.setdefault("NEXUS_PROGRAM_CACHE_DIR", str(work / "worker-programs"))
    try:
        if not args.skip_queries:
            queries(args, work)
        programs(args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
