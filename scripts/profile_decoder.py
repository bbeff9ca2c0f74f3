"""Where one ``engine="gpu"`` read of a Parquet file spends its time (GPU machine).

Writes the numbers-and-strings and the dictionary-heavy files of
``benchmarks/cold_read.py``, fills them into a lakehouse cache, reads each
once to load the kernels, then reads it three ways:

* plain, timed (the figure ``cold_read.py`` reports);
* under CUDA events around every kernel launch, nvCOMP call and read back
  (device time per kernel name, and how many launches);
* under cProfile (host time by function: what the Python side costs).

    python scripts/profile_decoder.py --size-mib 1024 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _workdir import workdir


def _events(fn: Callable[[], None]) -> dict[str, list[float]]:
    """Run ``fn`` with a CUDA event pair around every launch, nvCOMP call and
    read back of the page decoder; milliseconds by name."""
    import cupy as cp

    from nexus_cache.frames.gpudecode import _heap, _steps

    pairs: list[tuple[str, Any, Any]] = []

    def timed(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            try:
                return inner(*args, **kwargs)
            finally:
                end.record()
                pairs.append((name(args) if callable(name) else name, start, end))

        return run

    saved = (_heap._launch, _steps._launch, _heap.decompress_batch, _steps._read_back)
    _heap._launch = _steps._launch = timed(lambda a: f"kernel {a[0]}", saved[0])  # type: ignore[assignment]
    _heap.decompress_batch = timed(lambda a: f"nvcomp {a[1]}", saved[2])  # type: ignore[assignment]
    _steps._read_back = timed("read back", saved[3])  # type: ignore[assignment]
    try:
        fn()
    finally:
        _heap._launch, _steps._launch, _heap.decompress_batch, _steps._read_back = saved  # type: ignore[assignment]
    cp.cuda.get_current_stream().synchronize()
    out: dict[str, list[float]] = defaultdict(list)
    for name, start, end in pairs:
        out[name].append(cp.cuda.get_elapsed_time(start, end))
    return out


@contextlib.contextmanager
def _walls() -> Iterator[dict[str, list[float]]]:
    """Wall seconds of the page engine's planning (the page headers), heap
    filling, decode steps and joins, by name, while the block runs."""
    from nexus_cache.frames import _page_engine, decode
    from nexus_cache.frames.gpudecode import _heap, device

    out: dict[str, list[float]] = defaultdict(list)
    targets = [
        (decode, "plan_page_columns"),
        (decode, "decode_page_columns"),
        (_heap._Heap, "_fill"),
        (device, "decode_all"),
        (_page_engine, "join_chunks"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def timed(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                out[name].append(time.perf_counter() - started)

        return run

    for owner, name, inner in saved:
        setattr(owner, name, timed(name, inner))
    try:
        yield out
    finally:
        for owner, name, inner in saved:
            setattr(owner, name, inner)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--batch-mib",
        default="",
        help="comma-separated heap batch sizes to profile each (default: the engine's own)",
    )
    p.add_argument(
        "--fill-threads",
        default="",
        help="comma-separated thread counts that fill the pinned slots, to profile each "
        "(default: the shared pool's)",
    )
    args = p.parse_args()
    with workdir(args.workdir, "nexus-prof-") as work:
        return _profile(args, work)


def _profile(args: argparse.Namespace, work: Path) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    from nexus_cache.frames import _page_engine

    batches = [int(b) << 20 for b in args.batch_mib.split(",") if b] or [
        _page_engine.HEAP_BATCH_BYTES
    ]
    from nexus_cache import _workers

    fill_threads = [int(f) for f in args.fill_threads.split(",") if f] or [_workers.WORKERS]
    from cold_read import make_dictionary_heavy
    from nexus_cache.backends import select_backend
    from nexus_cache.frames import read_parquet
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    from source_cache import MIB, make_parquet

    files = [
        ("mixed", work / "mixed.parquet", make_parquet, args.size_mib),
        ("dict", work / "dict.parquet", make_dictionary_heavy, args.size_mib // 10),
    ]
    for _, path, make, mib in files:
        make(path, max(mib, 1) * MIB, 2_000_000)
    domain = select_backend("cuda").create_domain(0)
    config = LakehouseCacheConfig(
        root=work / "lake", policy="fill_before_read", max_bytes=4 * args.size_mib * MIB
    )
    with LakehouseCache(config) as lake:
        for label, path, _, _ in files:
            lake.prefetch(str(path))

            def read(stats: Any = None, path: Path = path) -> None:
                read_parquet(
                    str(path), domain=domain, lake=lake, engine="gpu", stats=stats
                ).release()

            read()  # kernels loaded
            host = []
            for _ in range(3):
                started = time.perf_counter()
                read_parquet(str(path), domain=domain, lake=lake, engine="host").release()
                host.append(time.perf_counter() - started)
            print(f"{label}: host pool read {min(host):.3f} s (best of 3)", flush=True)
            for batch in batches:
                for fillers in fill_threads:
                    _page_engine.HEAP_BATCH_BYTES = batch
                    _fill_threads(fillers)
                    _profile(f"{label}-batch{batch >> 20}-fill{fillers}", path, read, args.out)
    return 0


def _fill_threads(count: int) -> None:
    """The shared pool (which fills the pinned slots) with ``count`` threads."""
    from nexus_cache import _workers
    from nexus_cache.frames import staging

    if count != _workers.WORKERS:
        _workers.WORKERS = staging.WORKERS = count  # type: ignore[misc]
        _workers._pool = None  # the next batch starts a pool of this size


def _profile(label: str, path: Path, read: Callable[..., None], out_dir: Path) -> None:
    """Time, event-profile and cProfile one GPU read of ``path``."""
    from nexus_cache.frames import DecodeStats

    read()
    s = DecodeStats()
    started = time.perf_counter()
    with _walls() as walls:
        read(s)
    wall = time.perf_counter() - started
    started = time.perf_counter()
    read()
    plain = time.perf_counter() - started
    report = [
        f"{label}: {path.stat().st_size / 1e9:.2f} GB on disk; plain read {plain:.3f} s, "
        f"with stages {wall:.3f} s; stages "
        + ", ".join(f"{k} {v:.3f}" for k, v in s.gpu_stages.items())
        + f"; {s.row_groups} row groups; paths {sorted(set(s.paths.values()))}",
        "wall by step (outermost calls): "
        + ", ".join(f"{k} {sum(v):.3f} s in {len(v)}" for k, v in walls.items()),
    ]
    started = time.perf_counter()
    timings = _events(read)
    report.append(f"under events: {time.perf_counter() - started:.3f} s wall")
    total = sum(sum(v) for v in timings.values())
    report.append(f"device time in timed calls: {total / 1e3:.3f} s")
    for name, ms in sorted(timings.items(), key=lambda kv: -sum(kv[1])):
        report.append(f"  {name:<40} {len(ms):>6} calls {sum(ms):>10.1f} ms")
    prof = cProfile.Profile()
    prof.enable()
    read()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(35)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
    out = "\n".join(report)
    print(out, flush=True)
    (out_dir / f"profile-{label}.txt").write_text(out + "\n\n" + text.getvalue())


if __name__ == "__main__":
    sys.exit(main())
