"""Where one cold selective table query spends its time (host backend).

The query of ``benchmarks/tables.py``'s "selective query, cold": one
partition of 64 and a ``ts`` filter that keeps a quarter of that file's row
groups, on a fresh ``QueryService`` (an empty decoded-source cache; the
lakehouse byte cache already holds the files). Prints:

* the median of each part of ``execute`` (its diagnostics' timings; what is
  left of the wall time after ``total_s`` is the result's fingerprint and the
  evidence seal), against ``pyarrow.dataset`` on the same files and filter;
  and of Arrow's own read (``ParquetFile.read_row_groups``) within ours and of
  the wall time less that read: Arrow's read time moves with the machine's
  load far more than the rest, so compare versions by what is left of it;
* a cProfile of ``--runs`` cold queries (only ``execute``; each on a fresh
  service), by cumulative and by own time.

    python scripts/profile_cold_query.py --data /tmp/tb/w --workdir /tmp/prof
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

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tables import _OUTPUT, _ROW_BYTES, GIB, PARTITIONS, Ours, make_data, selective_query


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoded-gib", type=float, default=0.5)
    parser.add_argument("--data", type=Path, required=True, help="where the tables are (or go)")
    parser.add_argument("--workdir", type=Path, required=True, help="the lakehouse cache root")
    parser.add_argument("--table", choices=["hive", "delta"], default="hive")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    rows_per_part = int(args.decoded_gib * GIB / _ROW_BYTES / PARTITIONS)
    hive, delta = make_data(args.data, rows_per_part)
    source = hive if args.table == "hive" else delta
    query = selective_query(rows_per_part)
    ours = Ours(source, args.workdir, 4 * GIB)
    if args.table == "hive":
        dataset = ds.dataset(source, format="parquet", partitioning="hive")
    else:
        from deltalake import DeltaTable

        dataset = DeltaTable(str(source)).to_pyarrow_dataset()
    expr = pq.filters_to_expression(query.filter)
    arrow_read = [0.0]
    read_row_groups = pq.ParquetFile.read_row_groups

    def timed_read(self: pq.ParquetFile, *args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return read_row_groups(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            arrow_read[0] += time.perf_counter() - started

    try:
        ours(query.filter)  # fills the lakehouse cache
        parts: dict[str, list[float]] = {}
        walls, peer = [], []
        for _ in range(args.runs):
            ours.fresh()
            arrow_read[0] = 0.0
            pq.ParquetFile.read_row_groups = timed_read  # type: ignore[method-assign]
            try:
                t = time.perf_counter()
                ours(query.filter)
                walls.append(time.perf_counter() - t)
            finally:
                pq.ParquetFile.read_row_groups = read_row_groups  # type: ignore[method-assign]
            timings = dict(ours.last.timings)
            timings["fingerprint+evidence (wall - total_s)"] = walls[-1] - timings["total_s"]
            timings["Arrow's read_row_groups (in read_decode_s)"] = arrow_read[0]
            timings["wall - Arrow's read"] = walls[-1] - arrow_read[0]
            for name, seconds in timings.items():
                parts.setdefault(name, []).append(seconds)
            t = time.perf_counter()
            dataset.to_table(columns=_OUTPUT, filter=expr)
            peer.append(time.perf_counter() - t)
        print(f"{args.table}, {query.name}: {ours.last.rows} rows, {args.runs} cold runs, medians")
        print(f"  {'execute (wall)':40s} {statistics.median(walls) * 1e3:8.2f} ms")
        for name, values in parts.items():
            print(f"  {name:40s} {statistics.median(values) * 1e3:8.2f} ms")
        print(f"  {'pyarrow.dataset':40s} {statistics.median(peer) * 1e3:8.2f} ms")
        profile = cProfile.Profile()
        for _ in range(args.runs):
            ours.fresh()
            profile.enable()
            ours(query.filter)
            profile.disable()
    finally:
        ours.close()
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
