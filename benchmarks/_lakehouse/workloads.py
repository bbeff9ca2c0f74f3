"""The single-object figures: warm hits, cold reads, and a calibration of fills.

(1) a warm hit against a raw local read of the same bytes (throughput ratio);
(2) a cold ``read_through`` against a direct read of the remote object;
(3) warm and cold against fsspec's ``simplecache::`` and ``filecache::``.
On S3, one HEAD (``info(refresh=True)``, what an identity proof costs) is timed
in the same rotation as the warm reads: a single-object warm read may pay one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from _lakehouse.data import MIB, PageCache
from _lakehouse.measure import Op, Row, fmt, measure, spread
from _lakehouse.peers import PEERS, Remote, make_ours, make_peer, ours_read, peer_read

__all__ = ["Bench", "bench_cold", "bench_warm", "calibrate"]

_HEAD = "one HEAD (s3fs info)"


@dataclasses.dataclass
class Bench:
    """One run: the object, the repeats, and every ratio row reported so far."""

    workdir: Path
    data: Path
    size: int
    rows: int
    sha: str
    warm_repeats: int
    cold_repeats: dict[str, int]  # per remote
    page_cache: PageCache
    t0: float  # start of the run
    created: set[Path]  # directories to remove at the end
    results: list[Row] = dataclasses.field(default_factory=list)
    head_s: dict[str, float] = dataclasses.field(default_factory=dict)  # per remote

    def check_bytes(self, data: bytes, full: bool) -> None:
        if len(data) != self.size:
            raise RuntimeError(f"read {len(data)} bytes, expected {self.size}")
        if full and hashlib.sha256(data).hexdigest() != self.sha:
            raise RuntimeError("read the right number of bytes but the wrong ones")

    def check_table(self, table: Any, full: bool) -> None:
        if table.num_rows != self.rows:
            raise RuntimeError(f"read_table gave {table.num_rows} rows, expected {self.rows}")

    def compare(
        self,
        figure: str,
        remote: str,
        times: dict[str, list[float]],
        ours: str,
        peers: Iterable[str],
        throughput: bool,
        target: float | None,
        *,
        nbytes: int | None = None,
        allowance_s: float = 0.0,
    ) -> None:
        for peer in peers:
            row = Row(
                figure,
                remote,
                ours,
                times[ours],
                peer,
                times[peer],
                self.size if nbytes is None else nbytes,
                throughput,
                target,
                allowance_s,
            )
            self.results.append(row)
            print(row.line())

    def report(self, label: str, times: dict[str, list[float]]) -> None:
        print(f"  {label} [{time.perf_counter() - self.t0:.0f} s into the run]:")
        for name, values in times.items():
            print(f"    {name:<26} {spread(values)}")

    def fresh_dir(self, name: str) -> Path:
        path = self.workdir / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        self.created.add(path)  # removed at the end; nothing else in the workdir is
        return path


def _head_op(remote: Remote) -> Op:
    def head() -> Any:
        return remote.fs.info(remote.path, refresh=True)

    return Op(head, lambda info, full: None)


def bench_warm(b: Bench, remote: Remote) -> None:
    """Figures (1) and (3) warm: the entry / cached copy exists before every read."""
    import pyarrow.parquet as pq

    from nexus_cache.lakehouse import NexusCacheFileSystem

    name = remote.name
    ours = make_ours(b.fresh_dir(f"ours-warm-{name}"), "read_through", b.size)
    ours.prefetch(remote.path, fs=remote.fs)
    entry = ours.store.data_path(ours.plan(remote.path, fs=remote.fs).key)
    nfs = NexusCacheFileSystem(fs=remote.fs, cache=ours)
    dirs = {k: b.fresh_dir(f"{k}-warm-{name}") for k in PEERS}
    peers = {k: make_peer(k, remote.fs, dirs[k]) for k in PEERS}
    s3 = name == "s3"

    def byte_ops(drop: bool) -> dict[str, Op]:
        def dropper(paths: Callable[[], list[Path]]) -> Callable[[], None]:
            return (lambda: b.page_cache.drop(*paths())) if drop else (lambda: None)

        ops = {
            "ours (hit)": Op(
                lambda: ours_read(ours, remote, "hit"), b.check_bytes, dropper(lambda: [entry])
            ),
            "raw local read": Op(b.data.read_bytes, b.check_bytes, dropper(lambda: [b.data])),
        }
        for k in PEERS:
            files = dropper(lambda k=k: [p for p in dirs[k].iterdir() if p.is_file()])
            ops[k] = Op(lambda k=k: peer_read(peers[k], remote), b.check_bytes, files)
        if s3 and not drop:
            ops[_HEAD] = _head_op(remote)
        return ops

    times = measure(byte_ops(False), b.warm_repeats, warmup=True)
    b.report(f"[{name}] warm, full-object bytes, page-cache-warm", times)
    head = statistics.median(times[_HEAD]) if s3 else 0.0
    if s3:
        b.head_s[name] = head
        print(
            f"HEAD [{name}] one identity round trip (s3fs info, refresh): {spread(times[_HEAD])}"
        )
    b.compare("(1) warm hit, bytes", name, times, "ours (hit)", ["raw local read"], True, 0.9)
    b.compare("(3) warm, bytes", name, times, "ours (hit)", PEERS, False, 1.0, allowance_s=head)

    tables = {
        "ours (nexus fs)": Op(lambda: pq.read_table(remote.path, filesystem=nfs), b.check_table),
        "pyarrow local file": Op(lambda: pq.read_table(str(b.data)), b.check_table),
    }
    for k in PEERS:
        tables[k] = Op(lambda k=k: pq.read_table(remote.path, filesystem=peers[k]), b.check_table)
    if s3:
        tables[_HEAD] = _head_op(remote)
    times = measure(tables, b.warm_repeats, warmup=True)
    b.report(f"[{name}] warm, pyarrow.parquet.read_table, page-cache-warm", times)
    if s3:
        head = statistics.median(times[_HEAD])
        print(f"HEAD [{name}] measured beside read_table: {spread(times[_HEAD])}")
    b.compare(
        "(1) warm hit, read_table",
        name,
        times,
        "ours (nexus fs)",
        ["pyarrow local file"],
        True,
        0.9,
    )
    b.compare(
        "(3) warm, read_table", name, times, "ours (nexus fs)", PEERS, False, 1.0, allowance_s=head
    )

    if b.page_cache.method is not None:
        times = measure(byte_ops(True), b.warm_repeats, warmup=False)
        b.report(f"[{name}] warm, full-object bytes, page cache dropped before each read", times)
        figure = "(1) warm hit, bytes, page cache dropped"
        b.compare(figure, name, times, "ours (hit)", ["raw local read"], True, 0.9)
        b.compare(
            "(3) warm, bytes, page cache dropped", name, times, "ours (hit)", PEERS, False, 1.0
        )
    ours.close()


def bench_cold(b: Bench, remote: Remote) -> None:
    """Figures (2) and (3) cold: no entry, no cached copy; a fresh one before every read."""
    name = remote.name
    root = b.fresh_dir(f"ours-cold-{name}")
    rt = make_ours(root, "read_through", b.size)
    fbr = make_ours(root, "fill_before_read", b.size)
    peers: dict[str, Any] = {}
    source = [remote.local_source] if remote.local_source is not None else []

    def settle() -> None:
        # read_through's background fill must not overlap the next timed read
        if not rt.wait_for_fills(900):
            raise RuntimeError("a background fill did not finish within 900 s")
        b.page_cache.drop(*source)

    def fresh_ours() -> None:
        settle()
        rt.clear()
        if rt.stats()["entries"]:
            raise RuntimeError("the cache still holds an entry before a cold read")

    def fresh_peer(kind: str) -> None:
        settle()
        peers[kind] = make_peer(kind, remote.fs, b.fresh_dir(f"{kind}-cold-{name}"))

    ops = {
        "ours read_through": Op(lambda: ours_read(rt, remote, "miss"), b.check_bytes, fresh_ours),
        "direct remote read": Op(remote.read_direct, b.check_bytes, settle),
        "ours fill_before_read": Op(
            lambda: ours_read(fbr, remote, "miss"), b.check_bytes, fresh_ours
        ),
    }
    for k in PEERS:
        ops[k] = Op(
            lambda k=k: peer_read(peers[k], remote), b.check_bytes, lambda k=k: fresh_peer(k)
        )
    # warmup: one untimed cold read per op first (prepare empties it again), so
    # that no side pays a first call's costs (client set-up, imports) in a figure
    times = measure(ops, b.cold_repeats[name], warmup=True)
    settle()
    what = "remote file's page cache dropped" if source and b.page_cache.method else "cache empty"
    b.report(f"[{name}] cold ({what}), full-object bytes", times)
    background = [
        e.duration_s
        for e in rt.events.events("fill_completed")
        if e.fill_mode.value == "background"
    ]
    print(
        f"    (read_through's background fill after each read, off the read path: {spread(background)})"
    )
    b.compare(
        "(2) cold read_through",
        name,
        times,
        "ours read_through",
        ["direct remote read"],
        False,
        1.1,
    )
    b.compare("(3) cold, bytes", name, times, "ours fill_before_read", ["simplecache"], False, 1.5)
    b.compare("(3) cold, bytes", name, times, "ours fill_before_read", ["filecache"], False, None)
    b.compare("(3) cold, bytes", name, times, "ours read_through", PEERS, False, None)
    rt.close()
    fbr.close()


def calibrate(b: Bench, remotes: list[Remote]) -> None:
    """One run each of what a fill does besides reading, and of its S3 request pattern."""
    print("  calibration, 1 run each (explains the cold figures; no targets):")

    def show(label: str, seconds: float) -> None:
        print(f"    {label:<44} {fmt(seconds, b.size)}")

    payload = b.data.read_bytes()
    start = time.perf_counter()
    hashlib.sha256(payload).hexdigest()
    show("sha256 of the object in memory", time.perf_counter() - start)
    with open(b.fresh_dir("calibrate") / "copy", "wb") as f:
        start = time.perf_counter()
        f.write(payload)
        f.flush()
        written = time.perf_counter()
        os.fsync(f.fileno())
        show("write of the object (into the page cache)", written - start)
        show("fsync of those bytes", time.perf_counter() - written)
    del payload
    for remote in (r for r in remotes if r.name == "s3"):
        start = time.perf_counter()
        with remote.fs.open(remote.path, "rb", block_size=8 * MIB, cache_type="none") as f:
            while f.read(8 * MIB):
                pass
        show(
            "s3fs, 8 MiB ranged GETs (fills of objects over the fill byte budget)",
            time.perf_counter() - start,
        )
        start = time.perf_counter()
        remote.read_direct()
        show("s3fs, one GET of the whole object", time.perf_counter() - start)
        print("    (moto reads and copies the whole object for every ranged GET, so many ranged")
        print("     GETs cost O(requests x size) here; real S3 serves a range in O(range))")
