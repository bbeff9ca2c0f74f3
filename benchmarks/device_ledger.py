#!/usr/bin/env python3
"""Device ledger: cost of the cache's hot path, against a bare-lock baseline.

Prints, per backend (host always; cuda when CuPy and a GPU are present) and
for 1 and 8 threads, the median over several repeats of the time per pair:

* ``pin/release``        ``entry.pin()`` + ``handle.release()``   (target < 5 us, 1 thread)
* ``checkout/release``   the same through the source cache (key lookup, LRU touch)
* ``reserve/reconcile``  ``ledger.reserve()`` + ``ledger.reconcile()`` (teardown untimed)

There is no external peer for a device ledger, so the "peer" column is the
floor any lock-guarded counter pays: two ``threading.Lock`` acquisitions,
each with a dict update, per pair. ratio = ours / that floor. With 8
threads, figures are wall time / total pairs (all threads share one ledger
and one entry, so this is the contended case).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nexus_cache.backends import DeviceBackend, HostBackend
from nexus_cache.device import DeviceProfile, DeviceResidentCaches
from nexus_cache.errors import BackendUnavailableError

TARGET_US = 5.0
ENTRY_BYTES = 4096
CAP = 256 << 20
BATCH = 1000


def _timed(threads: int, pairs: int, body: Callable[[int], None]) -> float:
    """Run ``body(pairs)`` in ``threads`` threads at once; return us per pair."""
    if threads == 1:
        t0 = time.perf_counter()
        body(pairs)
        return (time.perf_counter() - t0) * 1e6 / pairs
    gate = threading.Barrier(threads + 1)

    def run() -> None:
        gate.wait()
        body(pairs)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    gate.wait()
    t0 = time.perf_counter()
    for worker in workers:
        worker.join()
    return (time.perf_counter() - t0) * 1e6 / (pairs * threads)


def _median(repeats: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(repeats))


def baseline_pair(threads: int, pairs: int, repeats: int) -> float:
    lock = threading.Lock()
    counts = {"evictable": 0, "pinned": 0}

    def body(n: int) -> None:
        for _ in range(n):
            with lock:
                counts["pinned"] += 1
            with lock:
                counts["pinned"] -= 1

    return _median(repeats, lambda: _timed(threads, pairs, body))


def _caches(backend: DeviceBackend) -> DeviceResidentCaches:
    return DeviceResidentCaches([DeviceProfile(0, CAP)], backend=backend)


def _published(caches: DeviceResidentCaches, key: str) -> None:
    source = caches.source_cache(0)
    entry = source.reserve(key, ENTRY_BYTES)
    array = source.factory.domain.empty(ENTRY_BYTES, "uint8")
    entry.attach(array, [array])
    del array
    source.publish(entry)


def pin_release(caches: DeviceResidentCaches, threads: int, pairs: int, repeats: int) -> float:
    handle = caches.source_cache(0).checkout("hot")
    assert handle is not None
    entry = handle.entry
    handle.release()

    def body(n: int) -> None:
        pin = entry.pin
        for _ in range(n):
            pin().release()

    return _median(repeats, lambda: _timed(threads, pairs, body))


def checkout_release(
    caches: DeviceResidentCaches, threads: int, pairs: int, repeats: int
) -> float:
    source = caches.source_cache(0)

    def body(n: int) -> None:
        checkout = source.checkout
        for _ in range(n):
            checkout("hot").release()  # type: ignore[union-attr]

    return _median(repeats, lambda: _timed(threads, pairs, body))


def reserve_reconcile(
    caches: DeviceResidentCaches, threads: int, pairs: int, repeats: int
) -> float:
    ledger = caches.ledger(0)
    factory = caches.factory(0)
    assert factory is not None
    domain, backend = factory.domain, caches.backend

    def one_round() -> float:
        made: list[list[object]] = [[] for _ in range(threads)]
        counter = iter(range(threads))
        lock = threading.Lock()

        def body(n: int) -> None:
            with lock:
                mine = made[next(counter)]
            reserve, reconcile = ledger.reserve, ledger.reconcile
            for _ in range(n):
                entry = reserve(512, domain=domain, backend=backend, evict=False)
                reconcile(entry, 512)
                mine.append(entry)

        per_pair = _timed(threads, pairs, body)
        for entries in made:  # teardown is not part of the pair
            for entry in entries:
                entry.destroy()  # type: ignore[attr-defined]
        return per_pair

    return _median(repeats, one_round)


def run_backend(
    name: str, backend: DeviceBackend, pairs: int, repeats: int, peers: dict[int, float]
) -> list[tuple[str, str, int, float, float, float | None]]:
    caches = _caches(backend)
    _published(caches, "hot")
    rows = []
    for threads in (1, 8):
        per_thread = max(1, pairs // threads)
        rr_pairs = min(per_thread, BATCH * 20 // threads)
        for label, fn, n, target in (
            ("pin/release", pin_release, per_thread, TARGET_US if threads == 1 else None),
            ("checkout/release", checkout_release, per_thread, None),
            ("reserve/reconcile", reserve_reconcile, rr_pairs, None),
        ):
            ours = fn(caches, threads, n, repeats)
            rows.append((label, name, threads, ours, peers[threads], target))
    results = caches.shutdown()
    assert all(r.complete for r in results), results
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="pairs per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats; the median is shown")
    args = parser.parse_args(argv)

    print(f"python {sys.version.split()[0]}, {args.pairs} pairs x {args.repeats} repeats")
    peers = {t: baseline_pair(t, max(1, args.pairs // t), args.repeats) for t in (1, 8)}
    rows = run_backend("host", HostBackend(device_total_bytes=1 << 30), **_kw(args, peers))
    try:
        from nexus_cache.backends.cuda import CudaBackend

        cuda = CudaBackend()
    except BackendUnavailableError as exc:
        print(f"cuda backend skipped: {exc}")
    else:
        rows += run_backend("cuda", cuda, **_kw(args, peers))

    print()
    header = f"{'operation':<18} {'backend':<7} {'thr':>3} {'ours us':>9} {'peer us':>9}"
    print(f"{header} {'ratio':>6}  target")
    failed = False
    for label, backend, threads, ours, peer, target in rows:
        verdict = ""
        if target is not None:
            ok = ours < target
            failed |= not ok
            verdict = f"< {target:g} us {'ok' if ok else 'MISSED'}"
        print(
            f"{label:<18} {backend:<7} {threads:>3} {ours:>9.3f} {peer:>9.3f} "
            f"{ours / peer:>6.2f}  {verdict}"
        )
    print("\npeer = bare threading.Lock acquire/release + dict update, twice per pair")
    return 1 if failed else 0


def _kw(args: argparse.Namespace, peers: dict[int, float]) -> dict[str, object]:
    return {"pairs": args.pairs, "repeats": args.repeats, "peers": peers}


if __name__ == "__main__":
    sys.exit(main())
