#!/usr/bin/env python3
"""``nexus-cache scan --server`` against a bare pyarrow Flight client, wall time.

A warm one-row query costs the server a few milliseconds; what a user waits
for is the command: interpreter start, imports, the call, the printed rows.
This runs, in fresh processes and alternating so that the machine's load
weighs on both alike:

* **ours**: ``nexus-cache scan --server URL one.parquet`` (prints the table);
* **bare**: a script that imports ``pyarrow.flight``, sends the same ticket
  with ``do_get`` and prints the rows.

It prints the median and minimum wall time of each and ``RATIO ours / bare``
(target: at most 1.5). The server is a real ``nexus-cache serve`` on
loopback (host backend unless ``--backend``), warmed by one query first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _serve, when run as a script

from _serve.procs import Server
from _workdir import workdir, workdir_label

TARGET_RATIO = 1.5

_BARE = """
import json, sys
import pyarrow.flight as flight
client = flight.connect(sys.argv[1])
ticket = flight.Ticket(json.dumps({"type": "scan", "source": sys.argv[2]}).encode())
table = client.do_get(ticket).read_all()
print(table.slice(0, 20).to_pylist())
"""


def _env(work: Path, backend: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "NEXUS_DEVICE_BACKEND": backend,
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(work / "lake-cache"),
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1GiB",
        "NEXUS_HOST_DEVICE_TOTAL_BYTES": str(1 << 30),
    }
    for name in ("NEXUS_SERVER_TOKEN", "NEXUS_SERVER_URL", "NEXUS_SERVICE_CONFIG"):
        env.pop(name, None)
    return env


def _wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="host", choices=("host", "cuda"))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--runs", type=int, default=20, help="runs of each (default 20)")
    args = parser.parse_args(argv)
    with workdir(args.workdir, "nexus-cli-remote-bench-") as work:
        return _run(args, work)


def _run(args: argparse.Namespace, work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    one = work / "one.parquet"
    pq.write_table(pa.table({"k": [1], "v": [0.5]}), one)
    past = time.time() - 60  # older than local_min_age_s: the identity is provable
    os.utime(one, (past, past))
    env = _env(work, args.backend)
    server = Server(env)
    try:
        ours = [sys.executable, "-m", "nexus_cache.cli.main", "scan", "--server", server.url]
        commands = {
            "ours": [*ours, str(one)],
            "bare": [sys.executable, "-c", _BARE, server.url, str(one)],
        }
        for command in commands.values():
            _wall(command, env)  # warm: the server's caches, the OS's file cache
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(max(1, args.runs)):
            for name, command in commands.items():
                walls[name].append(_wall(command, env))
    finally:
        code = server.stop()
    med = {name: statistics.median(times) for name, times in walls.items()}
    kept = workdir_label(args.workdir, work)
    print(f"backend {args.backend}; {args.runs} runs each, alternating; {kept}")
    for name, label in (("ours", "nexus-cache scan --server"), ("bare", "bare pyarrow do_get")):
        print(
            f"one-row warm scan, {label}: median {med[name] * 1e3:.0f} ms, "
            f"min {min(walls[name]) * 1e3:.0f} ms"
        )
    ratio = med["ours"] / med["bare"]
    verdict = "within" if ratio <= TARGET_RATIO else "ABOVE"
    print(f"RATIO ours / bare (medians): {ratio:.2f} ({verdict} the {TARGET_RATIO:g}x target)")
    print(json.dumps({"ours_s": med["ours"], "bare_s": med["bare"], "ratio": ratio}))
    print(f"server exit status on SIGTERM: {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
