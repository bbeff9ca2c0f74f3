#!/usr/bin/env python3
"""Decoded source cache: a warm hit against the raw device-to-device copy.

A warm hit is what a query pays when its frame is resident: the
single-flight lookup, the pin, and a copy of the frame from the cache domain
into the attempt's own domain (the query-affine copy). The ceiling ("peer")
is a bare copy of the same bytes into an already allocated buffer, in the
same process, interleaved with ours. Also shown: the cold publication (the
leader's reserve, copy into the cache domain, reconcile, publish).

Per backend and domain kind (host always; cuda with the CuPy pool and, where
rmm-cu13 is installed, RMM) it prints the median of ``--repeats`` of each,
the throughput, and ratio = ours / peer in time. Target: warm hit throughput
>= 50% of the bare copy (ratio <= 2.0). Bytes are counted once (the frame
size), not read plus write.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nexus_cache.backends import DeviceBackend, HostBackend
from nexus_cache.device import ArrayBundle, DeviceProfile, DeviceResidentCaches, SourceFrameKey
from nexus_cache.errors import BackendUnavailableError

TARGET_RATIO = 2.0
COLUMNS = 8


def _sync(backend: DeviceBackend) -> None:
    backend.synchronize(0)


def _timed(backend: DeviceBackend, fn: Callable[[], Any]) -> float:
    _sync(backend)
    t0 = time.perf_counter()
    result = fn()
    _sync(backend)
    elapsed = time.perf_counter() - t0
    del result
    return elapsed


def run(name: str, backend: DeviceBackend, nbytes: int, repeats: int) -> list[tuple[Any, ...]]:
    cap = 2 * nbytes + (64 << 20)
    caches = DeviceResidentCaches([DeviceProfile(0, cap)], backend=backend)
    source = caches.source_cache(0)
    attempt = backend.create_domain(0)
    per_column = nbytes // COLUMNS
    host = np.random.default_rng(0).integers(0, 255, per_column, dtype=np.uint8)
    frame = ArrayBundle({f"c{i}": attempt.copy_in(host) for i in range(COLUMNS)})
    key = SourceFrameKey(("bench", name), tuple(frame))
    peer_dst = [attempt.empty(per_column, np.uint8) for _ in range(COLUMNS)]
    xp = backend.xp

    def cold() -> Any:
        claim = source.checkout_or_claim(key, domain=attempt)
        return claim.publish(frame)

    def warm() -> Any:
        with source.checkout_or_claim(key, domain=attempt) as hit:
            return hit.value

    def peer() -> None:
        for dst, src in zip(peer_dst, frame.values(), strict=True):
            xp.copyto(dst, src)

    cold_s = _timed(backend, cold)
    for _ in range(2):  # warm the attempt pool and the caches
        _timed(backend, warm)
        _timed(backend, peer)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(_timed(backend, warm))
        theirs.append(_timed(backend, peer))
    stats = source.stats()
    assert stats.publishes == 1, stats
    assert stats.hits >= repeats, stats
    results = caches.shutdown(timeout=30)
    assert all(r.complete for r in results), results
    kind = getattr(backend, "allocator", "host")
    return [
        (name, kind, "cold publish", cold_s, None, nbytes),
        (name, kind, "warm hit", statistics.median(ours), statistics.median(theirs), nbytes),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="frame size on the GPU (MiB)")
    parser.add_argument("--host-mib", type=int, default=64, help="frame size on the host (MiB)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    rows = run("host", HostBackend(device_total_bytes=8 << 30), args.host_mib << 20, args.repeats)
    try:
        from nexus_cache.backends.cuda import CudaBackend

        kinds = ["cupy"]
        from nexus_cache.backends.rmm import rmm_available

        if rmm_available():
            kinds.append("rmm")
        for kind in kinds:
            rows += run("cuda", CudaBackend(allocator=kind), args.mib << 20, args.repeats)
    except BackendUnavailableError as exc:
        print(f"cuda backend skipped: {exc}")
    print(f"python {sys.version.split()[0]}, median of {args.repeats}, {COLUMNS} columns")
    print(
        f"{'backend':<7} {'domain':<6} {'operation':<13} {'MiB':>6} {'ours ms':>9} "
        f"{'GB/s':>7} {'peer ms':>9} {'GB/s':>7} {'ratio':>6}  target"
    )
    failed = False
    for backend, kind, op, ours, peer, nbytes in rows:
        line = (
            f"{backend:<7} {kind:<6} {op:<13} {nbytes >> 20:>6} {ours * 1e3:>9.3f} "
            f"{nbytes / ours / 1e9:>7.1f}"
        )
        if peer is None:
            print(line)
            continue
        ratio = ours / peer
        verdict = ""
        if backend == "cuda":
            ok = ratio <= TARGET_RATIO
            failed |= not ok
            verdict = f"<= {TARGET_RATIO:g} {'ok' if ok else 'MISSED'}"
        print(f"{line} {peer * 1e3:>9.3f} {nbytes / peer / 1e9:>7.1f} {ratio:>6.2f}  {verdict}")
    print("\npeer = copyto of the same columns into preallocated buffers (device-to-device)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
