"""Benchmark: decoding a Parquet source into device frames, cold and warm.

One Parquet object (numbers and strings, at least ``--size-mib``) is read
through the lakehouse cache and decoded into a device frame:

* **cold**: a lakehouse hit, host decode (PyArrow), host-to-device copy
  through the pinned staging slots, all in the attempt's domain
  (``nexus_cache.frames.read_parquet``);
* **warm**: a source-cache hit: pin the resident frame and copy it
  device-to-device into the attempt's pooled domain (``copy_into``), the pin
  carried by the copy until it is released.

The raw ceilings are measured in the same run on the same bytes: a pinned
host-to-device copy and a device-to-device copy between preallocated
buffers. Targets: warm hit >= 50% of the device-to-device ceiling; the cold
host-to-device stage >= 70% of the pinned ceiling (the stage's time is the
copy engine's busy time, from CUDA events); warm end to end >= 100x faster
than cold. Throughputs count the frame's bytes once (bytes copied per
second, not read + write). Every figure is a median.

    python benchmarks/source_cache.py                  # GPU: 2 GiB source
    python benchmarks/source_cache.py --quick          # host backend smoke size
    python benchmarks/source_cache.py --backend host --size-mib 8

On CUDA the domains are RMM pools when RMM imports, else CuPy pools; set
NEXUS_DEVICE_ALLOCATOR=cupy or =rmm to choose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1 << 20
_ROW_BYTES = 52  # about the on-disk bytes per row of the generated schema
_GROUP_ROWS = 2_000_000
_WORDS = 1000


# -- data ---------------------------------------------------------------------------------
def make_parquet(
    path: Path, size_bytes: int, group_rows: int = _GROUP_ROWS, codec: str = "snappy"
) -> int:
    """Write (once) a Parquet file of at least ``size_bytes``; returns its rows.

    Columns: id int64, a int64, x float64, k int32, flag bool, s string (8..40
    random letters), cat dictionary<int32, string> of 1000 words. Random values
    defeat compression, so the file is about as large as its values. The mtime
    is set a minute back: the lakehouse trusts a local file's identity only
    once it is a few seconds old.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists() and path.stat().st_size >= size_bytes:
        return int(pq.ParquetFile(path).metadata.num_rows)
    rng = np.random.default_rng(20261203)
    words = pa.array([f"word-{i:04d}" for i in range(_WORDS)])
    tmp = path.with_suffix(".tmp")
    written = 0
    with pq.ParquetWriter(tmp, _schema(pa), compression=codec, use_dictionary=["cat"]) as w:
        while written == 0 or tmp.stat().st_size < size_bytes:
            # row groups until the file is big enough (sizes on disk are estimated)
            left = max(0, size_bytes - tmp.stat().st_size)
            n = max(1000, min(group_rows, -(-left // _ROW_BYTES)))
            lengths = rng.integers(8, 41, n, dtype=np.int32)
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            letters = rng.integers(97, 123, int(offsets[-1]), dtype=np.uint8)
            strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters))
            cat = pa.DictionaryArray.from_arrays(
                pa.array(rng.integers(0, _WORDS, n, dtype=np.int32)), words
            )
            columns = [
                pa.array(np.arange(written, written + n, dtype=np.int64)),
                pa.array(rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64)),
                pa.array(rng.standard_normal(n)),
                pa.array(rng.integers(0, 1 << 30, n, dtype=np.int32)),
                pa.array(rng.random(n) < 0.5),
                strings,
                cat,
            ]
            w.write_table(pa.Table.from_arrays(columns, schema=_schema(pa)))
            written += n
    past = time.time() - 60
    os.utime(tmp, (past, past))
    tmp.replace(path)
    return written


def _schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("id", pa.int64()),
            ("a", pa.int64()),
            ("x", pa.float64()),
            ("k", pa.int32()),
            ("flag", pa.bool_()),
            ("s", pa.string()),
            ("cat", pa.dictionary(pa.int32(), pa.string())),
        ]
    )


# -- timing -----------------------------------------------------------------------------
def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else float("inf")


def _gbs(rate: float) -> str:
    return f"{rate / 1e9:,.2f} GB/s"


@dataclass
class Ceilings:
    pinned_h2d: float  # bytes/s
    d2d: float  # bytes/s


def measure_ceilings(backend: Any, domain: Any, other: Any, nbytes: int, repeats: int) -> Ceilings:
    """Raw copies of ``nbytes`` with nothing of ours in the way."""
    import numpy as np

    src = domain.empty(nbytes, np.uint8)
    dst = other.empty(nbytes, np.uint8)
    if backend.name != "cuda":
        host = np.ones(nbytes, np.uint8)
        h2d = median_seconds(lambda: np.copyto(src, host), repeats)
        d2d = median_seconds(lambda: np.copyto(dst, src), repeats)
        return Ceilings(_rate(nbytes, h2d), _rate(nbytes, d2d))
    import cupy
    import cupyx

    chunk = min(nbytes, 256 * MIB)
    pinned = cupyx.empty_pinned((chunk,), np.uint8)
    pinned[:] = 1
    with cupy.cuda.Device(domain.device_id):
        stream = cupy.cuda.Stream(non_blocking=True)

    def h2d_copy() -> None:
        for at in range(0, nbytes, chunk):
            k = min(chunk, nbytes - at)
            cupy.cuda.runtime.memcpyAsync(
                int(src.data.ptr) + at,
                int(pinned.ctypes.data),
                k,
                cupy.cuda.runtime.memcpyHostToDevice,
                stream.ptr,
            )
        stream.synchronize()

    def d2d_copy() -> None:
        dst.data.copy_from_device_async(src.data, nbytes, stream)
        stream.synchronize()

    h2d_copy()
    d2d_copy()
    return Ceilings(
        _rate(nbytes, median_seconds(h2d_copy, repeats)),
        _rate(nbytes, median_seconds(d2d_copy, repeats)),
    )


# -- the run -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--size-mib", type=int, default=None, help="source size (default 2048; 8 with --quick)"
    )
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "host"])
    p.add_argument("--quick", action="store_true", help="tiny source, few repeats (CI smoke)")
    p.add_argument("--cold-repeats", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--warm-repeats", type=int, default=None, help="default 20 (3 with --quick)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--group-rows", type=int, default=None, help="rows per row group")
    args = p.parse_args(argv)
    quick = args.quick
    args.size_mib = args.size_mib or (8 if quick else 2048)
    args.cold_repeats = args.cold_repeats or (1 if quick else 3)
    args.warm_repeats = args.warm_repeats or (3 if quick else 20)
    args.group_rows = args.group_rows or (50_000 if quick else _GROUP_ROWS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="nexus-source-bench-") as tmp:
            return run(args, Path(tmp))
    args.workdir.mkdir(parents=True, exist_ok=True)
    return run(args, args.workdir)


def run(args: argparse.Namespace, workdir: Path) -> int:
    import pyarrow as pa

    from nexus_cache._sizes import format_size
    from nexus_cache.backends import select_backend
    from nexus_cache.device import DeviceProfile, DeviceResidentCaches
    from nexus_cache.frames import DecodeStats, read_parquet
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    t0 = time.perf_counter()
    backend = select_backend(args.backend)
    source = workdir / f"source-{args.size_mib}mib.parquet"
    rows = make_parquet(source, args.size_mib * MIB, args.group_rows)
    size = source.stat().st_size
    print(
        f"source cache benchmark, {time.strftime('%Y-%m-%d %H:%M')}: backend {backend.name} "
        f"(domains: {getattr(backend, 'allocator', 'host')}), "
        f"pyarrow {pa.__version__}, {os.cpu_count()} CPUs"
    )
    print(
        f"source: {source.name}, {format_size(size)} on disk, {rows:,} rows, "
        f"made in {time.perf_counter() - t0:.1f} s"
    )

    config = LakehouseCacheConfig(
        root=workdir / "lake", policy="fill_before_read", max_bytes=4 * size + (64 * MIB)
    )
    with LakehouseCache(config) as lake:
        started = time.perf_counter()
        present = lake.prefetch(str(source))
        print(
            f"lakehouse fill: {time.perf_counter() - started:.2f} s, entry present: {present} "
            "(not part of any figure)"
        )

        attempt = backend.create_domain(0)  # the caller's (attempt's) domain
        cold_stats: list[DecodeStats] = []
        cold_times: list[float] = []
        frame = None
        for _ in range(args.cold_repeats):
            if frame is not None:
                frame.release()
                frame = None
            stats = DecodeStats()
            started = time.perf_counter()
            frame = read_parquet(str(source), domain=attempt, lake=lake, stats=stats)
            cold_times.append(time.perf_counter() - started)
            cold_stats.append(stats)
        assert frame is not None
        nbytes = frame.nbytes
        print(f"frame: {frame.num_columns} columns, {format_size(nbytes)} in device memory")
        print(f"lakehouse read: {cold_stats[-1].lakehouse.cache_status.value}")

        cap = 2 * nbytes + 64 * MIB
        with DeviceResidentCaches([DeviceProfile(0, cap)], backend=backend) as caches:
            frame.release()
            warm = bench_warm(caches, lake, source, attempt, args.warm_repeats)
            ceilings = measure_ceilings(backend, caches.factory(0).domain, attempt, nbytes, 5)
    report(args, nbytes, cold_times, cold_stats, warm, ceilings)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


@dataclass
class Warm:
    leader: float  # the first cached read: decode + retention (copy into the cache domain)
    hit: list[float]  # checkout_or_claim hit: pin + D2D copy into the attempt domain
    end_to_end: list[float]  # read_cached_parquet: lakehouse plan + hit


def bench_warm(caches: Any, lake: Any, source: Path, attempt: Any, repeats: int) -> Warm:
    """Populate the source cache through a leader, then time hits two ways."""
    from nexus_cache.device import CheckoutStatus, SourceCheckout
    from nexus_cache.frames import DecodeStats, read_cached_parquet, source_frame_key

    sub = caches.source_cache(0)
    stats = DecodeStats()
    started = time.perf_counter()
    frame = read_cached_parquet(
        str(source), domain=attempt, source_cache=sub, lake=lake, stats=stats
    )
    leader = time.perf_counter() - started
    frame.release()
    if not stats.source.retained:
        raise SystemExit(f"the decoded frame was not retained: {stats.source.detail}")
    print(f"leader read (decode + retention): {leader * 1e3:,.1f} ms; {stats.source.detail}")
    key = source_frame_key(lake.plan(str(source)))

    def hit() -> float:
        started = time.perf_counter()
        result = sub.checkout_or_claim(key, domain=attempt)
        elapsed = time.perf_counter() - started
        assert isinstance(result, SourceCheckout), "expected a hit, got a claim"
        assert result.status is CheckoutStatus.HIT
        result.release()
        return elapsed

    def end_to_end() -> float:
        started = time.perf_counter()
        frame = read_cached_parquet(str(source), domain=attempt, source_cache=sub, lake=lake)
        elapsed = time.perf_counter() - started
        frame.release()
        return elapsed

    hit()  # the attempt domain's pool now holds blocks of these sizes
    hits, ends = [], []
    for _ in range(repeats):  # interleaved
        hits.append(hit())
        ends.append(end_to_end())
    return Warm(leader, hits, ends)


def report(
    args: argparse.Namespace,
    nbytes: int,
    cold_times: list[float],
    cold_stats: list[Any],
    warm: Warm,
    ceilings: Ceilings,
) -> None:
    from nexus_cache._sizes import format_size

    cold = statistics.median(cold_times)
    hit = statistics.median(warm.hit)
    end = statistics.median(warm.end_to_end)
    h2d_seconds = statistics.median(s.transfer.h2d_seconds for s in cold_stats)
    h2d_bytes = cold_stats[-1].transfer.h2d_bytes
    decode = statistics.median(s.decode_seconds for s in cold_stats)
    staging = statistics.median(s.transfer.staging_seconds for s in cold_stats)
    h2d_rate = _rate(h2d_bytes, h2d_seconds)
    hit_rate = _rate(nbytes, hit)
    host_bytes = cold_stats[-1].host_bytes
    rows = [
        (
            "cold end to end (lakehouse hit + decode + H2D)",
            f"{cold * 1e3:,.1f} ms",
            _gbs(_rate(nbytes, cold)),
        ),
        (
            "  host decode (decoder thread)",
            f"{decode * 1e3:,.1f} ms",
            _gbs(_rate(host_bytes, decode)),
        ),
        (
            "  staging into pinned slots (host copy)",
            f"{staging * 1e3:,.1f} ms",
            _gbs(_rate(h2d_bytes, staging)),
        ),
        ("  H2D stage (copy engine busy time)", f"{h2d_seconds * 1e3:,.1f} ms", _gbs(h2d_rate)),
        (
            "leader read (decode + retention in the cache)",
            f"{warm.leader * 1e3:,.1f} ms",
            _gbs(_rate(nbytes, warm.leader)),
        ),
        ("warm hit (checkout_or_claim: pin + D2D copy)", f"{hit * 1e3:,.3f} ms", _gbs(hit_rate)),
        (
            "warm end to end (read_cached_parquet)",
            f"{end * 1e3:,.3f} ms",
            _gbs(_rate(nbytes, end)),
        ),
        ("ceiling: pinned H2D copy, same bytes", "", _gbs(ceilings.pinned_h2d)),
        ("ceiling: D2D copy, same bytes", "", _gbs(ceilings.d2d)),
    ]
    _table(
        f"{args.backend} backend, frame {format_size(nbytes)}, medians "
        f"({len(cold_times)} cold, {len(warm.hit)} warm)",
        rows,
    )
    for label, value, unit in rows:
        print(f"RESULT {label.strip()}: {value} {unit}".replace("  ", " "))
    ratios = [
        ("warm hit / D2D ceiling", hit_rate / ceilings.d2d, 0.5),
        ("cold H2D stage / pinned H2D ceiling", h2d_rate / ceilings.pinned_h2d, 0.7),
        ("cold / warm end to end", cold / end if end > 0 else float("inf"), 100.0),
    ]
    for label, value, target in ratios:
        verdict = "met" if value >= target else "NOT met"
        print(f"RATIO {label} = {value:.2f} (target >= {target:g}) -> {verdict}")


def _table(title: str, rows: list[tuple[str, str, str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return
    table = Table(title=title)
    for name in ("figure", "time", "throughput"):
        table.add_column(name, justify="left" if name == "figure" else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
