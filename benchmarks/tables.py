#!/usr/bin/env python3
"""Benchmark: filtered scans of lakehouse tables, ours against pyarrow.dataset, DuckDB, Polars.

One run writes a 64-partition Hive dataset (``day=0`` .. ``day=63``; columns
``src``, ``dst`` int64, ``ts`` int64 rising within each file, ``w`` float64;
``--decoded-gib`` of decoded columns, 0.5 by default, 2 the size the targets
are stated for) and the same rows as a Delta table, then on each:

1. **selective query**, cold and warm: one partition of 64 (``day = k``) and a
   row-group-statistics filter (``ts < t``, keeping the first quarter of the
   file's row groups), output ``src, dst, w``. Ours is
   ``QueryService.execute(Scan(source, columns, filter=...))`` on the host
   backend, the call users make. *Cold*: a fresh service (empty decoded-source
   cache; the lakehouse byte cache already holds the files, as the peers have
   them in the page cache). *Warm*: the same query again (ours: a source-cache
   hit). Target: cold within 1.2x of the fastest peer.
2. **16 different filters** over the same columns, warm: each keeps 4
   partitions (``day in [...]``), a ``ts`` window and a ``w`` threshold, so
   every filter differs and all 64 partitions are used. Ours, after one
   unfiltered scan of the columns the filters read has filled the source
   cache, is a source-cache hit per object: only the mask and the gather run.
   Target: at least 2x faster than the fastest peer (ratio ours / fastest <=
   0.5); with ``--backend cuda``, at least 10x (ratio <= 0.1).

Peers, in the same process, on the same files: ``pyarrow.dataset``
(``partitioning="hive"``, ``filter=``; for Delta the dataset
``deltalake.DeltaTable.to_pyarrow_dataset()`` gives), DuckDB
``read_parquet(..., hive_partitioning=true)`` with the same ``WHERE`` (for
Delta, over the table's data files), Polars ``scan_parquet(...).filter(...)``
(for Delta ``scan_delta``). A peer that is not installed is skipped, and the
run says so (``pip install 'nexus-cache[bench]'`` installs Polars and
deltalake). Every side's row count is checked against the others'. Repeats
are interleaved (the order rotates), every figure is a median, and each
``RATIO`` line is *ours / peer* for times (lower is better).

    python benchmarks/tables.py                    # 0.5 GiB decoded, a few minutes on 2 cores
    python benchmarks/tables.py --decoded-gib 2    # the size the targets are stated for
    python benchmarks/tables.py --quick            # tiny (CI smoke)
    python benchmarks/tables.py --backend cuda     # ours on the GPU, the peers on the CPU
    python benchmarks/tables.py --backend cuda --device-result  # the result stays on the GPU

``--backend cuda`` runs ours on the CUDA backend: the decoded-source cache
holds the columns in device memory and the mask and the gather run there
(CuPy); a query's time ends when ``execute`` returns, that is once its
result is complete and copied to a host Arrow table (the service's result),
so it includes that copy. The peers run on the CPU as always.

``--device-result`` times ours as ``QueryService.execute_on_device`` then
``release()`` per query: the result is built in device memory (CuPy arrays on
CUDA; NumPy on the host backend, where it runs for the CI smoke test) and is
not copied to the host; each query's time ends once the device is
synchronised and the result released. The peers are unchanged (their
results are host tables, as always). Every ``RATIO`` line names the mode:
``ours (host result)`` or ``ours (device result)``.

Ours runs as a service configured without ``evidence_dir`` (the default), so
a result is hashed for its fingerprint only when someone reads it, and the
benchmark does not. ``--evidence`` gives it an evidence directory: every
result is then hashed and its sealed evidence written before ``execute``
returns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nexus_cache._sizes import format_size

__all__ = ["main", "parse_args"]

GIB = 1 << 30
PARTITIONS = 64
_ROW_BYTES = 32  # decoded bytes per row: src, dst, ts (int64), w (float64)
_GROUPS_PER_FILE = 8
_OUTPUT = ["src", "dst", "w"]
_CUTS = 16  # filters of figure (2)


# -- data ---------------------------------------------------------------------------------
def _part_table(day: int, rows: int, rng: np.random.Generator) -> pa.Table:
    vertices = max(1000, rows // 4)
    return pa.table(
        {
            "src": rng.integers(0, vertices, rows, dtype=np.int64),
            "dst": rng.integers(0, vertices, rows, dtype=np.int64),
            "ts": np.arange(day * rows, (day + 1) * rows, dtype=np.int64),
            "w": rng.random(rows),
        }
    )


def make_data(workdir: Path, rows_per_part: int, delta_too: bool = True) -> tuple[Path, Path]:
    """Write (once) the Hive directory and (``delta_too``) the Delta table of the same rows."""
    hive = workdir / f"hive-{rows_per_part}"
    delta = workdir / f"delta-{rows_per_part}"
    group = max(1, rows_per_part // _GROUPS_PER_FILE)
    if not (hive / "_done").exists():
        shutil.rmtree(hive, ignore_errors=True)
        rng = np.random.default_rng(20261206)
        for day in range(PARTITIONS):
            part = hive / f"day={day}"
            part.mkdir(parents=True)
            pq.write_table(
                _part_table(day, rows_per_part, rng), part / "part-0.parquet", row_group_size=group
            )
        (hive / "_done").touch()  # "_"-prefixed: skipped by every reader
    if delta_too and not (delta / "_delta_log").exists():
        try:
            from deltalake import write_deltalake
        except ImportError:
            return hive, delta
        dataset = ds.dataset(hive, format="parquet", partitioning="hive")
        table = dataset.to_table()  # day: int32, as the Hive partitioning infers it
        write_deltalake(
            str(delta),
            table,
            partition_by=["day"],
            writer_properties=_delta_writer(group),
        )
    past = time.time() - 60  # the lakehouse trusts a local file's identity once it is a few s old
    for root in (hive, delta):
        for path in root.rglob("*.parquet"):
            os.utime(path, (past, past))
    return hive, delta


def _delta_writer(group: int) -> Any:
    from deltalake import WriterProperties

    return WriterProperties(max_row_group_size=group, write_batch_size=min(group, 1024))


# -- queries ------------------------------------------------------------------------------
Pred = tuple[str, str, Any]


@dataclass(frozen=True)
class Query:
    name: str
    filter: list[Pred]


def selective_query(rows_per_part: int) -> Query:
    day = PARTITIONS // 3
    cut = day * rows_per_part + rows_per_part // 4  # the first quarter of its row groups
    return Query(f"day = {day}, ts < {cut}", [("day", "=", day), ("ts", "<", cut)])


def sixteen_filters(rows_per_part: int) -> list[Query]:
    out = []
    for i in range(_CUTS):
        days = [(i + j * _CUTS) % PARTITIONS for j in range(4)]
        lo = min(days) * rows_per_part + (i * rows_per_part) // (2 * _CUTS)
        hi = max(days) * rows_per_part + rows_per_part // 2
        threshold = round(0.05 * (i % 10), 2)
        pred = [("day", "in", days), ("ts", ">=", lo), ("ts", "<", hi), ("w", ">", threshold)]
        out.append(Query(f"filter {i}", pred))
    return out


def _sql_where(filter: list[Pred]) -> str:
    parts = []
    for column, op, value in filter:
        if op == "in":
            parts.append(f"{column} IN ({', '.join(str(v) for v in value)})")
        else:
            parts.append(f"{column} {op} {value}")
    return " AND ".join(parts)


def _polars_expr(pl: Any, filter: list[Pred]) -> Any:
    expr = None
    for column, op, value in filter:
        col = pl.col(column)
        if op == "in":
            term = col.is_in(value)
        else:
            term = {"=": col.__eq__, "<": col.__lt__, ">": col.__gt__, ">=": col.__ge__}[op](value)
        expr = term if expr is None else expr & term
    return expr


# -- engines ------------------------------------------------------------------------------
Runner = Callable[[list[Pred]], int]  # runs one query, returns its row count


class Ours:
    """``QueryService.execute(Scan(...))`` on the host or CUDA backend; ``fresh()`` empties
    its caches."""

    def __init__(
        self,
        source: Path,
        workdir: Path,
        cap: int,
        backend: str = "host",
        evidence: bool = False,
        device_result: bool = False,
    ) -> None:
        from nexus_cache.lakehouse import LakehouseCacheConfig
        from nexus_cache.service import ServiceConfig

        lake = LakehouseCacheConfig(
            root=workdir / "lake", policy="fill_before_read", max_bytes=4 * cap + GIB
        )
        self.config = ServiceConfig(
            backend=backend,
            cache_cap_bytes=cap,
            lakehouse=lake,
            evidence_dir=workdir / "evidence" if evidence else None,
        )
        self.source = str(source)
        self.device_result = device_result
        self.service: Any = None
        self.last: Any = None
        self.fresh()

    def fresh(self) -> None:
        from nexus_cache.service import QueryService

        self.close()
        self.service = QueryService(self.config)

    def close(self) -> None:
        if self.service is not None:
            self.service.shutdown()
            self.service = None

    def fill(self, columns: list[str]) -> None:
        """One unfiltered scan of ``columns``: each object decoded whole, once."""
        from nexus_cache.service import Scan

        self.service.execute(Scan(self.source, columns))

    def __call__(self, filter: list[Pred]) -> int:
        from nexus_cache.service import Scan

        scan = Scan(self.source, _OUTPUT, filter=filter)
        if self.device_result:  # kept on the device: complete (synchronised), then released
            with self.service.execute_on_device(scan) as kept:
                self.service.backend.synchronize(kept.diagnostics.device_id)
                self.last = kept.diagnostics
                return int(kept.frame.num_rows)
        result = self.service.execute(scan)
        self.last = result.diagnostics
        return int(result.table.num_rows)


def peers(kind: str, source: Path) -> tuple[dict[str, Runner], list[str]]:
    """The installed peers for ``kind`` (hive or delta), and lines naming the skipped ones."""
    out: dict[str, Runner] = {}
    skipped: list[str] = []
    if kind == "hive":
        dataset = ds.dataset(source, format="parquet", partitioning="hive")
        files = f"'{source}/**/*.parquet'"
    else:
        from deltalake import DeltaTable

        table = DeltaTable(str(source))
        dataset = table.to_pyarrow_dataset()
        files = "[" + ", ".join(f"'{u.removeprefix('file://')}'" for u in table.file_uris()) + "]"

    def pyarrow_dataset(filter: list[Pred]) -> int:
        return int(
            dataset.to_table(columns=_OUTPUT, filter=pq.filters_to_expression(filter)).num_rows
        )

    out["pyarrow.dataset"] = pyarrow_dataset
    try:
        import duckdb
    except ImportError:
        skipped.append("duckdb: not installed")
    else:
        con = duckdb.connect()

        def duck(filter: list[Pred]) -> int:
            sql = (
                f"SELECT {', '.join(_OUTPUT)} FROM read_parquet({files}, hive_partitioning=true) "
                f"WHERE {_sql_where(filter)}"
            )
            return int(con.execute(sql).to_arrow_table().num_rows)

        out["duckdb"] = duck
    try:
        import polars as pl
    except ImportError:
        skipped.append("polars: not installed (pip install 'nexus-cache[bench]')")
    else:
        if kind == "hive":

            def scan() -> Any:
                return pl.scan_parquet(f"{source}/**/*.parquet", hive_partitioning=True)
        else:

            def scan() -> Any:
                return pl.scan_delta(str(source))

        def polars(filter: list[Pred]) -> int:
            frame = scan().filter(_polars_expr(pl, filter)).select(_OUTPUT).collect()
            return int(frame.height)

        out["polars"] = polars
    return out, skipped


# -- timing -------------------------------------------------------------------------------
def _timed(fn: Runner, filter: list[Pred]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = fn(filter)
    return time.perf_counter() - started, rows


def _check(label: str, counts: dict[str, int]) -> None:
    if len(set(counts.values())) > 1:
        raise SystemExit(f"{label}: the engines disagree on the row count: {counts}")


@dataclass
class Figures:
    cold: dict[str, list[float]]
    warm: dict[str, list[float]]
    many: dict[str, list[float]]  # seconds for all 16 filters, per repeat
    rows: int
    many_rows: int
    diagnostics: dict[str, Any]


def bench(
    kind: str, source: Path, workdir: Path, cap: int, rows_per_part: int, args: Any
) -> Figures:
    runners, skipped = peers(kind, source)
    for line in skipped:
        print(f"SKIP [{kind}] {line}")
    ours = Ours(source, workdir, cap, args.backend, args.evidence, args.device_result)
    names = ["ours", *runners]
    cold: dict[str, list[float]] = {n: [] for n in names}
    warm: dict[str, list[float]] = {n: [] for n in names}
    many: dict[str, list[float]] = {n: [] for n in names}
    query = selective_query(rows_per_part)
    rows = 0
    try:
        for name in names:  # untimed: fills the lakehouse cache and the page cache
            (ours if name == "ours" else runners[name])(query.filter)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            counts: dict[str, int] = {}
            for name in order:
                if name == "ours":
                    ours.fresh()  # an empty decoded-source cache
                run = ours if name == "ours" else runners[name]
                seconds, counts[name] = _timed(run, query.filter)
                cold[name].append(seconds)
                seconds, _ = _timed(run, query.filter)
                warm[name].append(seconds)
            _check(f"[{kind}] {query.name}", counts)
            rows = counts["ours"]
        diagnostics = dict(ours.last.table) if ours.last is not None else {}
        filters = sixteen_filters(rows_per_part)
        many_rows = 0
        # Not timed: one unfiltered scan of the columns the filters read fills our
        # source cache with whole objects (one decoded source, many filters), and
        # a pass over the filters gives the row count every engine must match.
        ours.fill(sorted({*_OUTPUT, *(p[0] for f in filters for p in f.filter)}))
        for f in filters:
            many_rows += ours(f.filter)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                run = ours if name == "ours" else runners[name]
                total, count = 0.0, 0
                for f in filters:
                    seconds, got = _timed(run, f.filter)
                    total += seconds
                    count += got
                if count != many_rows:
                    raise SystemExit(
                        f"[{kind}] 16 filters: {name} got {count} rows, ours {many_rows}"
                    )
                many[name].append(total)
        source_status = ours.last.source_cache.get("status") if ours.last is not None else None
        diagnostics["16 filters, last source_cache"] = source_status
    finally:
        ours.close()
    return Figures(cold, warm, many, rows, many_rows, diagnostics)


# -- report -------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def mode(device_result: bool) -> str:
    """How ours ran, as the RATIO lines name it."""
    return "ours (device result)" if device_result else "ours (host result)"


def report(
    kind: str, fig: Figures, device_result: bool = False, gpu: bool = False
) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    med = {
        part: {n: statistics.median(v) for n, v in getattr(fig, part).items()}
        for part in ("cold", "warm", "many")
    }
    for name in med["cold"]:
        rows.append(
            (kind, name, _ms(med["cold"][name]), _ms(med["warm"][name]), _ms(med["many"][name]))
        )
        for part in ("cold", "warm", "many"):
            print(f"RESULT [{kind}] {part} {name}: {_ms(med[part][name])}")
    peer_names = [n for n in med["cold"] if n != "ours"]
    if not peer_names:
        print(f"RATIO [{kind}] no peer installed: nothing to compare")
        return rows
    # with the filter on the GPU, the 16 filters must be 10x faster than the CPU engines
    targets = {"cold": 1.2, "warm": None, "many": 0.1 if gpu else 0.5}
    labels = {
        "cold": "selective query, cold",
        "warm": "selective query, warm",
        "many": "16 filters, warm",
    }
    for part, target in targets.items():
        fastest = min(peer_names, key=lambda n: med[part][n])
        ratio = med[part]["ours"] / med[part][fastest]
        line = (
            f"RATIO [{kind}] {labels[part]}: {mode(device_result)} / fastest peer ({fastest}) "
            f"= {ratio:.2f}"
        )
        if target is None:
            print(f"{line} (reported)")
        else:
            verdict = "met" if ratio <= target else "NOT met"
            print(f"{line} (target <= {target:g}) -> {verdict}")
    return rows


def _table(rows: list[tuple[str, str, str, str, str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return
    table = Table(title="filtered scans, medians (16 filters: the sum of their times)")
    for name in ("table", "engine", "selective cold", "selective warm", "16 filters warm"):
        table.add_column(name, justify="left" if name in ("table", "engine") else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# -- the run ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--decoded-gib",
        type=float,
        default=None,
        help="decoded size of the data (default 0.5; 2 is the size the targets are stated for)",
    )
    p.add_argument("--quick", action="store_true", help="tiny data, 1 repeat (CI smoke)")
    p.add_argument("--repeats", type=int, default=None, help="default 5 (1 with --quick)")
    p.add_argument("--tables", default="hive,delta", help="comma list of: hive, delta")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument(
        "--backend",
        choices=("host", "cuda"),
        default="host",
        help="ours on the host (NumPy) or on the GPU (CuPy); the peers run on the CPU",
    )
    p.add_argument(
        "--evidence",
        action="store_true",
        help="ours writes sealed evidence (evidence_dir set), so every result is hashed "
        "before execute returns; by default it writes none, as a service without "
        "evidence_dir does",
    )
    p.add_argument(
        "--device-result",
        action="store_true",
        help="ours keeps each result in device memory (execute_on_device, then release), "
        "timed until the device is synchronised; with --backend cuda (on the host backend "
        "for the CI smoke run)",
    )
    args = p.parse_args(argv)
    args.decoded_gib = args.decoded_gib or (0.002 if args.quick else 0.5)
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not args.tables or not set(args.tables) <= {"hive", "delta"}:
        p.error(f"--tables={','.join(args.tables)!r}; use hive, delta or hive,delta")
    if args.decoded_gib <= 0 or args.repeats < 1:
        p.error("--decoded-gib and --repeats must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="nexus-tables-bench-") as tmp:
            return run(args, Path(tmp))
    args.workdir.mkdir(parents=True, exist_ok=True)
    return run(args, args.workdir)


def _versions() -> str:
    found = [f"pyarrow {pa.__version__}"]
    for name in ("duckdb", "polars", "deltalake"):
        try:
            found.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def run(args: argparse.Namespace, workdir: Path) -> int:
    t0 = time.perf_counter()
    rows_per_part = max(
        _GROUPS_PER_FILE * 16, int(args.decoded_gib * GIB / _ROW_BYTES / PARTITIONS)
    )
    decoded = rows_per_part * PARTITIONS * _ROW_BYTES
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"lakehouse tables benchmark, {time.strftime('%Y-%m-%d %H:%M')}: {_versions()}")
    print(f"machine: {os.cpu_count()} CPUs, load average {load} at the start")
    hive, delta = make_data(workdir, rows_per_part, "delta" in args.tables)
    print(
        f"data: {PARTITIONS} partitions x {rows_per_part:,} rows, {format_size(decoded)} decoded "
        f"(--decoded-gib {args.decoded_gib:g}; the targets are stated for 2), "
        f"{_GROUPS_PER_FILE} row groups per file, made in {time.perf_counter() - t0:.1f} s"
    )
    print(f"selective query: {selective_query(rows_per_part).name}; output {', '.join(_OUTPUT)}")
    print(f"repeats: {args.repeats}, order rotating; figures are medians")
    print(f"ours: the {args.backend} backend; the peers: the CPU")
    if args.device_result:
        print("ours' result: kept in device memory (execute_on_device, then release)")
    else:
        print("ours' result: a host Arrow table (execute)")
    cap = 2 * decoded + (64 << 20)
    table_rows: list[tuple[str, str, str, str, str]] = []
    for kind in args.tables:
        source = hive if kind == "hive" else delta
        if kind == "delta" and not (delta / "_delta_log").exists():
            print("SKIP [delta] deltalake: not installed (pip install 'nexus-cache[delta]')")
            continue
        fig = bench(kind, source, workdir, cap, rows_per_part, args)
        print(f"[{kind}] selective query: {fig.rows:,} rows; 16 filters: {fig.many_rows:,} rows")
        print(f"[{kind}] ours, diagnostics: {fig.diagnostics}")
        table_rows += report(kind, fig, args.device_result, args.backend == "cuda")
    _table(table_rows)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
