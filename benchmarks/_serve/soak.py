"""The soak of ``benchmarks/serve.py``: clients on a mixed warm and cold workload
for a set time, a few killed mid-stream; wrong results, errors, grants left
and the server's RSS are counted."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from _serve.procs import Server, start_clients
from nexus_cache.client import Client

__all__ = ["COLUMNS", "soak", "soak_queries"]

COLUMNS = ("a", "b", "c", "d")  # the scan files' columns


def soak_queries(files: dict[str, Path]) -> list[dict[str, Any]]:
    """Warm one-row scans, projections of six parts (cold whenever LRU evicted
    them), counts, and warm graph queries on one edge list."""
    queries: list[dict[str, Any]] = [{"type": "scan", "source": str(files["one"])}]
    for i in range(6):
        source = str(files[f"part{i}"])
        queries.append({"type": "count", "source": source})
        for r in (1, 2, 4):
            queries.append({"type": "scan", "source": source, "columns": list(COLUMNS[:r])})
            queries.append({"type": "scan", "source": source, "columns": list(COLUMNS[-r:])})
    edges = {"type": "scan", "source": str(files["edges"]), "columns": ["src", "dst"]}
    first = int(pq.read_table(files["edges"], columns=["src"])["src"][0].as_py())
    for algorithm, params in (("pagerank", {}), ("bfs", {"source": first}), ("jaccard", {})):
        queries.append(
            {
                "type": "graph",
                "edges": edges,
                "src": "src",
                "dst": "dst",
                "algorithm": algorithm,
                "directed": algorithm != "jaccard",
                "params": params,
            }
        )
    return queries


_SOAK_CLIENT = """
import json, random, sys, time
from nexus_cache.client import Client
from nexus_cache.service import table_fingerprint
url, spec, seed, end = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), float(sys.argv[4])
queries, expected = spec["queries"], spec["expected"]
rng = random.Random(seed)
client = Client(url)
done = wrong = errors = 0
while time.time() < end:
    query = rng.choice(queries)
    try:
        result = client.execute(query)
    except Exception as exc:
        errors += 1
        print("error", type(exc).__name__, " ".join(str(exc).split())[:200], flush=True)
        continue
    if table_fingerprint(result.table) != expected[json.dumps(query, sort_keys=True)]:
        wrong += 1
    done += 1
print("done", done, wrong, errors, flush=True)
"""


_KILLED_READER = """
import sys, time
import pyarrow.flight as flight
reader = flight.connect(sys.argv[1]).do_get(flight.Ticket(sys.argv[2].encode()))
reader.read_chunk()
print("reading", flush=True)
time.sleep(600)
"""


def soak(
    url: str,
    server: Server,
    env: dict[str, str],
    files: dict[str, Path],
    minutes: float,
    expected: dict[str, str],
) -> dict[str, Any]:
    work_file = Path(tempfile.mkstemp(suffix=".json")[1])
    work_file.write_text(json.dumps({"queries": soak_queries(files), "expected": expected}))
    end = time.time() + minutes * 60
    workers = start_clients(
        env, _SOAK_CLIENT, [[url, str(work_file), str(seed), str(end)] for seed in range(16)]
    )
    warm_until = time.time() + min(60.0, minutes * 60 / 4)
    rss: list[tuple[float, int]] = []
    killed = 0
    big = json.dumps({"type": "scan", "source": str(files["mid"])})
    while time.time() < end:
        time.sleep(5)
        rss.append((time.time(), server.rss_bytes()))
        if killed < max(3, int(minutes * 2)) and random.random() < 0.5:
            # a client that reads one batch of a large result and is killed mid-stream
            reader = subprocess.Popen(
                [sys.executable, "-c", _KILLED_READER, url, big],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert reader.stdout is not None
            reader.stdout.readline()
            reader.kill()
            reader.wait(30)
            killed += 1
    done = wrong = errors = 0
    messages: list[str] = []
    for w in workers:
        out, _ = w.communicate(timeout=600)
        for line in out.splitlines():
            if line.startswith("error "):
                messages.append(line[len("error ") :])
            elif line.startswith("done "):
                d, wr, e = (int(x) for x in line.split()[1:])
                done, wrong, errors = done + d, wrong + wr, errors + e
    work_file.unlink()
    time.sleep(1)
    with Client(url) as client:
        deadline = time.time() + 30
        while client.health()["running_queries"] and time.time() < deadline:
            time.sleep(0.2)
        reports = client.reports()
        idle = client.health()["rss_bytes"]
    after = [r for t, r in rss if t >= warm_until] or [rss[-1][1]]
    half = len(after) // 2
    return {
        "queries": done,
        "wrong": wrong,
        "errors": errors,
        "error_messages": sorted(set(messages))[:5],
        "killed_clients": killed,
        "grants_at_end": sum(r["grant_count"] for r in reports),
        # under load RSS follows the queries in flight; compare halves, and idle
        "rss_median_first_half_mib": round(statistics.median(after[: max(1, half)]) / 2**20),
        "rss_median_second_half_mib": round(statistics.median(after[half:]) / 2**20),
        "rss_max_after_warmup_mib": round(max(after) / 2**20),
        "rss_idle_at_end_mib": round(idle / 2**20),
    }
