"""Where the 16 warm filters of ``benchmarks/tables.py`` spend their time.

The Hive table of the benchmark, one unfiltered scan of the filters' and the
output's columns (every object decoded once into the source cache), then the
16 different filters, warm: their total time (median of ``--repeats``) with
host results and with device results (``execute_on_device``, synchronised,
released), and a cProfile of one pass of the 16 with ``--profile-result``
results, by own and by cumulative time.

    python scripts/profile_warm_filters.py --backend cuda --decoded-gib 1 --workdir DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tables import _OUTPUT, _ROW_BYTES, GIB, PARTITIONS, Ours, make_data, sixteen_filters


def _pass(ours: Ours, filters: list) -> float:
    started = time.perf_counter()
    for f in filters:
        ours(f.filter)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--decoded-gib", type=float, default=0.5)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile-result", choices=["host", "device"], default="device")
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args(argv)
    rows_per_part = int(args.decoded_gib * GIB / _ROW_BYTES / PARTITIONS)
    hive, _ = make_data(args.workdir, rows_per_part, delta_too=False)
    filters = sixteen_filters(rows_per_part)
    columns = sorted({*_OUTPUT, *(p[0] for f in filters for p in f.filter)})
    runs = {}
    for kind in ("host", "device"):
        ours = Ours(
            hive, args.workdir / f"w-{kind}", 8 * GIB, args.backend, device_result=kind == "device"
        )
        try:
            ours.fill(columns)
            _pass(ours, filters)  # every filter once: kernels loaded, plans warm
            times = [_pass(ours, filters) for _ in range(args.repeats)]
            runs[kind] = statistics.median(times)
            print(
                f"16 warm filters, {kind} results: {runs[kind] * 1e3:.1f} ms "
                f"({runs[kind] / 16 * 1e3:.2f} ms a query)",
                flush=True,
            )
            if kind == args.profile_result:
                print(f"timings of the last query: {ours.last.timings}", flush=True)
                prof = cProfile.Profile()
                prof.enable()
                _pass(ours, filters)
                prof.disable()
                text = io.StringIO()
                stats = pstats.Stats(prof, stream=text)
                stats.sort_stats("tottime").print_stats(args.top)
                stats.sort_stats("cumulative").print_stats(args.top)
                print(text.getvalue(), flush=True)
        finally:
            ours.close()


if __name__ == "__main__":
    main()
