#!/usr/bin/env python3
"""The first query on a fresh machine: kernel compilation with and without warm-up.

Generates an R-MAT edge table (``--scale``, Graph500 parameters) as Parquet,
then runs four fresh Python processes one after the other, each with its
own lakehouse cache root (so every first query is cold: lakehouse fill,
decode, graph build) and each timing its first PageRank, BFS and Jaccard
through a new ``QueryService``:

1. ``fresh machine, no warm-up``: empty CuPy kernel cache (``CUPY_CACHE_DIR``)
   and empty program cache (``NEXUS_PROGRAM_CACHE_DIR``): the queries pay
   every compile (the figure the warm-up removes);
2. ``fresh machine, warm-up``: again both caches empty; ``warm_up()`` runs
   first and is timed apart: the first queries through a ready service;
3. ``second process, warm-up``: the caches run 2 filled; the warm-up now
   only loads kernels from disk;
4. ``second process, no warm-up``: the same caches, no warm-up: the
   reference cold figures of a machine whose kernels are on disk.

Prints one line per process and query, then ``RATIO`` lines: run 2's first
PageRank and BFS against run 4's (target: <= 2x), and run 3's warm-up
time. ``--json`` prints the figures as one document. ``--backend host``
runs the same on NumPy (no compile; the CI smoke run).

Usage: ``python benchmarks/warmup.py --scale 20`` (on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

_RUNS = (
    ("fresh machine, no warm-up", "a", False),
    ("fresh machine, warm-up", "b", True),
    ("second process, warm-up", "b", True),
    ("second process, no warm-up", "b", False),
)
_QUERIES = ("pagerank", "bfs", "jaccard")


def _child(args: argparse.Namespace) -> int:
    """One process: optional warm-up, then the first PageRank, BFS and Jaccard."""
    started = time.perf_counter()
    from nexus_cache.service import QueryService
    from nexus_cache.service.demo import demo_config, demo_queries

    config = demo_config(Path(args.child_dir), args.backend)
    edges = str(Path(args.lake) / "edges.parquet")
    mix = dict(demo_queries(edges, edges, args.bfs_source))
    out: dict[str, Any] = {}
    with QueryService(config) as service:
        out["service_start_s"] = time.perf_counter() - started
        if args.child_warm:
            out["warmup_s"] = service.warm_up()
        compiled = _kernel_files()
        for name in _QUERIES:
            t0 = time.perf_counter()
            service.execute(mix[name])
            out[f"{name}_s"] = time.perf_counter() - t0
            # kernels this query compiled (files the kernel caches gained), by name
            now = _kernel_files()
            out[f"{name}_compiled"] = len(now - compiled)
            out[f"{name}_kernels"] = sorted({k for p in now - compiled for k in _names(p)})
            compiled = now
        out["backend"] = service.backend.name
    print(json.dumps(out))
    return 0


def _kernel_files() -> set[Path]:
    """Files in CuPy's kernel cache and the program cache (the child's own dirs)."""
    roots = [os.environ.get("CUPY_CACHE_DIR"), os.environ.get("NEXUS_PROGRAM_CACHE_DIR")]
    return {
        p
        for root in roots
        if root and Path(root).is_dir()
        for p in Path(root).rglob("*")
        if p.is_file()
    }


def _names(path: Path) -> set[str]:
    """The kernel names a compiled file holds (its symbol strings)."""
    import re

    text = path.read_bytes()
    return {m.decode() for m in re.findall(rb"(?:cupy_|nexus_)[A-Za-z0-9_]{2,60}", text)}


def _run_child(
    args: argparse.Namespace, lake: Path, caches: Path, work: Path, warm: bool, source: int
) -> dict[str, Any]:
    env = dict(os.environ)
    env["CUPY_CACHE_DIR"] = str(caches / "cupy")
    env["NEXUS_PROGRAM_CACHE_DIR"] = str(caches / "program")
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--backend",
        args.backend,
        "--child-dir",
        str(work),
        "--lake",
        str(lake),
        "--bfs-source",
        str(source),
    ]
    if warm:
        command.append("--child-warm")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmark process failed ({done.returncode}):\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=20, help="R-MAT scale (default 20)")
    parser.add_argument("--backend", choices=("auto", "cuda", "host"), default="auto")
    parser.add_argument("--workdir", default=None, help="keep the data and caches here")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--runs",
        default="1,2,3,4",
        help="which runs, comma-separated (default 1,2,3,4; the RATIO lines need 2 with 4, and 2 with 3)",
    )
    # the child processes' own arguments
    parser.add_argument("--child-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lake", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bfs-source", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_dir is not None:
        return _child(args)
    try:
        args.runs = sorted({int(r) for r in args.runs.split(",")})
    except ValueError:
        parser.error(f"--runs takes run numbers 1-4 separated by commas, not {args.runs!r}")
    if not args.runs or not set(args.runs) <= {1, 2, 3, 4}:
        parser.error(f"--runs takes run numbers 1-4, not {args.runs}")
    with tempfile.TemporaryDirectory(prefix="nexus-warmup-bench-") as tmp:
        root = Path(args.workdir) if args.workdir is not None else Path(tmp)
        return _measure(args, root)


def _measure(args: argparse.Namespace, root: Path) -> int:
    from nexus_cache.service.datagen import rmat_edges, write_parquet

    lake = root / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    edges = rmat_edges(args.scale, timestamps=True)  # the demo mix filters on ts
    write_parquet(edges, lake / "edges.parquet")
    source = int(edges.column("src")[0].as_py())
    results: dict[int, dict[str, Any]] = {}
    for number, (label, caches, warm) in enumerate(_RUNS, start=1):
        if number not in args.runs:
            continue
        work = root / f"run{number}"
        figures = _run_child(args, lake, root / f"caches-{caches}", work, warm, source)
        results[number] = {"run": number, "label": label, **figures}
        if not args.json:
            shown = ", ".join(
                f"{k[:-2]} {v:.3f} s" for k, v in figures.items() if k.endswith("_s")
            )
            shown += "; kernel files compiled by " + ", ".join(
                f"{q} {figures.get(f'{q}_compiled', 0)}"
                + (
                    f" ({' '.join(figures[f'{q}_kernels'][:6])})"
                    if figures.get(f"{q}_kernels")
                    else ""
                )
                for q in _QUERIES
            )
            print(f"run {number} ({label}, {figures['backend']}): {shown}", flush=True)
    ratios = {}
    if 2 in results and 4 in results:
        ratios = {
            f"first {q} through a warmed service vs second-process cold": results[2][f"{q}_s"]
            / max(results[4][f"{q}_s"], 1e-9)
            for q in ("pagerank", "bfs")
        }
    if args.json:
        doc = {
            "scale": args.scale,
            "edges": edges.num_rows,
            "runs": list(results.values()),
            "ratios": ratios,
        }
        print(json.dumps(doc, indent=2))
        return 0
    for name, ratio in ratios.items():
        print(f"RATIO {name}: {ratio:.2f}x (target <= 2x)")
    if 2 in results and 3 in results:
        print(
            f"RATIO warm-up of a second process (kernels on disk): "
            f"{results[3]['warmup_s']:.3f} s (fresh machine: {results[2]['warmup_s']:.3f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
