"""Benchmark: the lakehouse byte cache against raw reads and fsspec's whole-file caches.

Ours and its peers run in the same process, interleaved repeat by repeat (the order
alternates), and every figure is a median. Ratios are always *ours / peer*; which
way is better is printed with each one. Figures (issue 3, "Benchmark"):

1. warm hit vs a raw local read of the same bytes, as full-object reads and as
   ``pyarrow.parquet.read_table`` (through our fsspec filesystem vs pyarrow on the
   local file); throughput ratio, target >= 0.9;
2. cold ``read_through`` vs a direct read of the remote object; time ratio, target <= 1.1;
3. warm and cold vs fsspec ``simplecache::`` and ``filecache::`` on the same
   workload; time ratio, target <= 1.0 warm (ours no slower), cold reported;
4. N spawned processes reading one uncached object at once: how often the remote
   was fetched and whether any reader got wrong or partial bytes, for ours
   (``fill_before_read``) and both peers;
5. warm reads of a whole dataset (16 and 256 files under one S3 prefix) with
   ``pq.read_table``, ``pyarrow.dataset``, pandas and a DuckDB glob, against both
   peers, with the S3 requests each side sends per read; target <= 1.0 for
   ``read_table`` over 16 files.

On S3 one HEAD is timed beside the warm single-object reads: such a read may pay
one identity round trip, so its target is ``<= 1.0 x peer + one HEAD``.

The pieces live in ``benchmarks/_lakehouse/`` (data, s3, peers, measure,
workloads, datasets, concurrency, report).

Remotes: a local directory, and moto's S3 server (``ThreadedMotoServer`` in a
process of its own, on loopback, dummy credentials) reached through s3fs.

    python benchmarks/lakehouse.py              # 256 MiB Parquet, a few minutes
    python benchmarks/lakehouse.py --quick      # 32 MiB, fewer repeats, about a minute
    python benchmarks/lakehouse.py --only dataset --dataset-files 16,256
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _lakehouse, when run as a script

from _lakehouse.concurrency import ConcResult, bench_concurrency
from _lakehouse.data import MIB, PageCache, make_parquet, sha256_file
from _lakehouse.datasets import READERS, bench_datasets
from _lakehouse.peers import build_remote
from _lakehouse.report import code_version, load, print_table, versions
from _lakehouse.s3 import MotoServer, upload
from _lakehouse.workloads import Bench, bench_cold, bench_warm, calibrate
from nexus_cache._sizes import format_size

__all__ = ["main", "parse_args"]

_PARTS = ("warm", "cold", "concurrency", "dataset")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="32 MiB, 3 warm / 2 cold repeats, 3 readers")
    add("--size-mib", type=int, help="size of the Parquet object (default 256, --quick 32)")
    add("--workdir", type=Path, default=Path("/tmp/nexus-bench"), help="keeps the objects")
    add("--warm-repeats", type=int, help="default 7 (--quick 3)")
    add("--cold-repeats", type=int, help="default 5 local, 3 s3 (--quick 2)")
    add("--procs", type=int, help="concurrent readers in (4) (default 4, --quick 3)")
    add(
        "--rounds",
        type=int,
        help="rounds of (4), races being timing-dependent (default 3, --quick 1)",
    )
    add("--remotes", default="local,s3", help="comma list of: local, s3")
    add("--only", help=f"comma list of parts to run: {', '.join(_PARTS)} (default: all)")
    add("--dataset-files", help="file counts of (5) (default 16,256; --quick 16)")
    add("--dataset-mib", type=int, help="bytes of each dataset of (5) (default 32, --quick 8)")
    add("--dataset-readers", help=f"comma list of: {', '.join(READERS)} (default: all)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.size_mib = args.size_mib or (32 if quick else 256)
    args.warm_repeats = args.warm_repeats or (3 if quick else 7)
    # an s3 cold repeat costs ~30 s at 256 MiB on moto (see the calibration lines)
    cold = args.cold_repeats or (2 if quick else 0)
    args.cold_repeats = {"local": cold or 5, "s3": cold or 3}
    args.procs = args.procs or (3 if quick else 4)
    args.rounds = args.rounds or (1 if quick else 3)
    args.remotes = _csv(args.remotes)
    if not args.remotes or not set(args.remotes) <= {"local", "s3"}:
        parser.error(f"--remotes={','.join(args.remotes)!r}; use local, s3 or local,s3")
    args.only = _csv(args.only) if args.only else list(_PARTS)
    if not args.only or not set(args.only) <= set(_PARTS):
        parser.error(f"--only={','.join(args.only)!r}; use a comma list of {', '.join(_PARTS)}")
    try:
        args.dataset_files = [
            int(n) for n in _csv(args.dataset_files or ("16" if quick else "16,256"))
        ]
    except ValueError:
        parser.error(f"--dataset-files={args.dataset_files!r}; use file counts like 16,256")
    args.dataset_mib = args.dataset_mib or (8 if quick else 32)
    args.dataset_readers = _csv(args.dataset_readers) if args.dataset_readers else list(READERS)
    if not set(args.dataset_readers) <= set(READERS):
        parser.error(f"--dataset-readers: use a comma list of {', '.join(READERS)}")
    if "dataset" in args.only and "s3" not in args.remotes:
        args.only.remove("dataset")  # datasets are read from S3 only
    if min(args.size_mib, args.warm_repeats, *args.cold_repeats.values(), args.rounds) < 1:
        parser.error("--size-mib, --rounds and the repeats must be >= 1")
    if min(args.dataset_files, default=1) < 1 or args.dataset_mib < 1:
        parser.error("--dataset-files and --dataset-mib must be >= 1")
    if args.procs < 2:
        parser.error(f"--procs={args.procs}; use 2 or more concurrent readers")
    return args


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"lakehouse byte cache benchmark, {time.strftime('%Y-%m-%d %H:%M')}: {versions()}")
    print(f"machine: {os.cpu_count()} CPUs, {load()} at the start (other work on it adds noise)")
    print(f"measuring {code_version()}")
    server = MotoServer().start() if "s3" in args.remotes else None  # boots meanwhile
    created: set[Path] = set()
    conc: list[ConcResult] = []
    try:
        data = workdir / f"data-{args.size_mib}mib.parquet"
        rows = make_parquet(data, args.size_mib * MIB)
        size = data.stat().st_size
        cache = PageCache(data)
        b = Bench(
            workdir,
            data,
            size,
            rows,
            sha256_file(data),
            args.warm_repeats,
            args.cold_repeats,
            cache,
            t0,
            created,
        )
        print(f"object: {data}, {format_size(size)}, {rows} rows of random values")
        print(
            f"repeats: {b.warm_repeats} warm, cold {b.cold_repeats}, order rotating; figures are medians"
        )
        print(f"page cache: {cache.describe()}")
        print(
            "warm = our entry / the peer's cached copy exists; page-cache-warm = its pages are in RAM too"
        )
        endpoint = s3_path = None
        if server is not None:
            endpoint = server.endpoint()
            s3_path = upload(endpoint, data)
            print(f"moto S3 at {endpoint} in its own process, object s3://{s3_path}")
        print(f"setup took {time.perf_counter() - t0:.1f} s")
        remotes = [build_remote(name, endpoint, data, s3_path) for name in args.remotes]
        for remote in remotes:
            if {"warm", "cold"} & set(args.only):
                print(f"\n== remote: {remote.name} ==")
            if "warm" in args.only:
                bench_warm(b, remote)
            if "cold" in args.only:
                bench_cold(b, remote)
        if "cold" in args.only:
            print()
            calibrate(b, remotes)
        if "dataset" in args.only and endpoint is not None:
            bench_datasets(
                b, endpoint, args.dataset_files, args.dataset_mib * MIB, args.dataset_readers
            )
        if "concurrency" in args.only:
            print(
                f"\n== (4) {args.procs} processes (spawn) read one uncached object at once, "
                f"{args.rounds} round(s) =="
            )
            conc = bench_concurrency(b, remotes, endpoint, s3_path, args.procs, args.rounds)
        print_table(b.results, conc)
    finally:
        if server is not None:
            server.stop()
        for path in created:  # only what we made; the objects stay for the next run
            shutil.rmtree(path, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; {load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
