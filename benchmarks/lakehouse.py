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
   (``fill_before_read``) and both peers.

Remotes: a local directory, and moto's S3 server (``ThreadedMotoServer`` in a
process of its own, on loopback, dummy credentials) reached through s3fs.

    python benchmarks/lakehouse.py              # 256 MiB Parquet, a few minutes
    python benchmarks/lakehouse.py --quick      # 32 MiB, fewer repeats, < 1 minute
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import hashlib
import json
import logging
import mmap
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

CTX = mp.get_context("spawn")
MIB = 1024 * 1024
_ROW_BYTES = 24  # int64 + float64 + float32 + int32, plain-encoded random values
_GROUP_ROWS = 1 << 20
_DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_BUCKET = "nexus-bench"
_PEERS = ("simplecache", "filecache")


# -- data --------------------------------------------------------------------------
def make_parquet(path: Path, size_bytes: int) -> int:
    """Write (once) a Parquet file of at least ``size_bytes`` of random values.

    Random 64/32-bit values defeat both dictionary encoding and snappy, so the file
    is as large on disk as in memory. The mtime is set a minute back: the cache
    trusts a local file's identity only once it is a few seconds old.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = -(-size_bytes // _ROW_BYTES)
    if path.exists() and path.stat().st_size >= size_bytes:
        return int(pq.ParquetFile(path).metadata.num_rows)
    rng = np.random.default_rng(20261202)
    tmp = path.with_suffix(".tmp")
    schema = pa.schema(
        [("a", pa.int64()), ("b", pa.float64()), ("c", pa.float32()), ("d", pa.int32())]
    )
    with pq.ParquetWriter(tmp, schema, compression="snappy", use_dictionary=False) as writer:
        done = 0
        while done < rows:
            n = min(_GROUP_ROWS, rows - done)
            columns = [
                rng.integers(-(2**62), 2**62, n),
                rng.random(n),
                rng.standard_normal(n).astype("float32"),
                rng.integers(-(2**31), 2**31 - 1, n, dtype="int32"),
            ]
            writer.write_table(pa.table(columns, schema=schema), row_group_size=n)
            done += n
    past = time.time() - 60
    os.utime(tmp, (past, past))
    os.replace(tmp, path)
    return rows


def sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            hasher.update(chunk)
    return hasher.hexdigest()


# -- the OS page cache ---------------------------------------------------------------
def resident_fraction(path: Path) -> float:
    """Share of ``path``'s pages in the page cache (``mincore`` on a private mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            rc = libc.mincore(
                ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec
            )
        finally:
            del anchor
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in bytes(vec)) / pages


class PageCache:
    """Drops files from the OS page cache, by the first method proven to work here.

    ``posix_fadvise(DONTNEED)`` on the files involved (after ``fdatasync``) leaves
    other processes' pages alone; ``/proc/sys/vm/drop_caches`` is the fallback.
    Each is verified with ``mincore``; with neither, :attr:`method` is ``None`` and
    every figure is page-cache-warm for both sides.
    """

    def __init__(self, probe: Path) -> None:
        self.method: str | None = None
        self.detail = ""
        probe.read_bytes()
        before = resident_fraction(probe)
        for method in ("fadvise", "drop_caches"):
            try:
                self._drop(method, [probe])
                after = resident_fraction(probe)
            except OSError as exc:
                self.detail += f"{method}: {exc}; "
                continue
            self.detail += f"{method}: resident {before:.0%} -> {after:.0%}; "
            if after < 0.05:
                self.method = method
                return
            probe.read_bytes()

    @staticmethod
    def _drop(method: str, paths: list[Path]) -> None:
        if method == "drop_caches":
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            return
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def drop(self, *paths: Path) -> None:
        if self.method is not None:
            self._drop(self.method, [p for p in paths if p.exists()])

    def describe(self) -> str:
        if self.method is None:
            return f"could not drop the page cache ({self.detail.strip()}); all figures are page-cache-warm for both sides"
        return (
            f"page cache dropped with {self.method}, verified by mincore ({self.detail.strip()})"
        )


# -- the S3 server -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto_main(conn: Any) -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    conn.send_bytes(str(port).encode())
    with contextlib.suppress(EOFError):
        conn.recv_bytes()
    server.stop()


class MotoServer:
    """moto's S3 server in a child process, so that it does not share our GIL.

    :meth:`start` returns at once (the server boots while the caller works);
    :meth:`endpoint` waits for it. Dummy credentials go into our environment,
    which the spawned readers of figure (4) inherit.
    """

    def __init__(self) -> None:
        os.environ.update(_DUMMY_AWS)
        self._conn, child = CTX.Pipe()
        self._proc = CTX.Process(target=_moto_main, args=(child,), daemon=True)
        self._url: str | None = None

    def start(self) -> MotoServer:
        self._proc.start()
        return self

    def endpoint(self) -> str:
        if self._url is None:
            if not self._conn.poll(120):
                raise RuntimeError("the moto server did not start within 120 s")
            self._url = f"http://127.0.0.1:{int(self._conn.recv_bytes())}"
        return self._url

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send_bytes(b"stop")
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(15)


def make_s3fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)


def upload(endpoint: str, path: Path) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=_BUCKET)
    with open(path, "rb") as f:  # one PUT: moto assembles multipart uploads slowly
        client.put_object(Bucket=_BUCKET, Key=path.name, Body=f)
    return f"{_BUCKET}/{path.name}"


# -- remotes and readers ---------------------------------------------------------------
@dataclasses.dataclass
class Remote:
    """Where the object lives: ``fs`` + ``path`` (local: LocalFileSystem + absolute path)."""

    name: str
    fs: Any
    path: str
    local_source: Path | None  # the remote object itself when it is a local file

    def read_direct(self) -> bytes:
        with self.fs.open(self.path, "rb") as f:
            return bytes(f.read())


def build_remote(name: str, endpoint: str | None, data: Path, s3_path: str | None) -> Remote:
    if name == "local":
        from fsspec.implementations.local import LocalFileSystem

        return Remote("local", LocalFileSystem(), str(data), data)
    if endpoint is None or s3_path is None:
        raise ValueError("the s3 remote needs the moto endpoint and the object's path")
    return Remote("s3", make_s3fs(endpoint), s3_path, None)


def make_ours(root: Path, policy: str, size: int) -> Any:
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    config = LakehouseCacheConfig(root=root, policy=policy, max_bytes=8 * size + 64 * MIB)
    return LakehouseCache(config)


def make_peer(kind: str, remote_fs: Any, storage: Path) -> Any:
    import fsspec

    return fsspec.filesystem(
        kind, fs=remote_fs, cache_storage=str(storage), skip_instance_cache=True
    )


def ours_read(cache: Any, remote: Remote, expect: str) -> bytes:
    with cache.open(remote.path, fs=remote.fs) as f:
        data = f.read()
        status = f.diagnostics.cache_status.value
    if status != expect:
        raise RuntimeError(f"expected a cache {expect}, the read was a {status}")
    return data


def peer_read(pfs: Any, remote: Remote) -> bytes:
    with pfs.open(remote.path, "rb") as f:
        return bytes(f.read())


# -- measuring -------------------------------------------------------------------------
@dataclasses.dataclass
class Op:
    run: Callable[[], Any]
    check: Callable[[Any, bool], None]
    prepare: Callable[[], None] = lambda: None


def measure(ops: dict[str, Op], repeats: int, *, warmup: bool) -> dict[str, list[float]]:
    """Median-ready timings; the order of the ops rotates every repeat."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    if warmup:
        for name in names:
            ops[name].prepare()
            ops[name].check(ops[name].run(), True)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            op = ops[name]
            op.prepare()
            gc.collect()
            start = time.perf_counter()
            out = op.run()
            times[name].append(time.perf_counter() - start)
            op.check(out, r == 0 and not warmup)
            del out
    return times


@dataclasses.dataclass
class Row:
    figure: str
    remote: str
    ours: str
    ours_s: list[float]
    peer: str
    peer_s: list[float]
    nbytes: int
    throughput: bool  # ratio reported as throughput ours/peer (else time ours/peer)
    target: float | None  # throughput: >= target; time: <= target

    @property
    def ratio(self) -> float:
        o, p = statistics.median(self.ours_s), statistics.median(self.peer_s)
        return p / o if self.throughput else o / p

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "reported"
        ok = self.ratio >= self.target if self.throughput else self.ratio <= self.target
        return "met" if ok else "NOT met"

    def line(self) -> str:
        o, p = statistics.median(self.ours_s), statistics.median(self.peer_s)
        kind = (
            "throughput ours/peer (higher is better)"
            if self.throughput
            else "time ours/peer (lower is better)"
        )
        target = ""
        if self.target is not None:
            target = f", target {'>=' if self.throughput else '<='} {self.target}: {self.verdict}"
        return (
            f"RATIO {self.figure} [{self.remote}] {self.ours} vs {self.peer}: "
            f"{_fmt(o, self.nbytes)} vs {_fmt(p, self.nbytes)} -> {kind} = {self.ratio:.2f}{target}"
        )


def _fmt(seconds: float, nbytes: int) -> str:
    return f"{seconds * 1e3:.0f} ms ({nbytes / MIB / seconds:.0f} MiB/s)"


def _spread(times: list[float]) -> str:
    med = statistics.median(times)
    return f"median {med * 1e3:.0f} ms, range {min(times) * 1e3:.0f}-{max(times) * 1e3:.0f} ms, n={len(times)}"


# -- the run -------------------------------------------------------------------------
@dataclasses.dataclass
class Bench:
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
    ) -> None:
        for peer in peers:
            row = Row(
                figure, remote, ours, times[ours], peer, times[peer], self.size, throughput, target
            )
            self.results.append(row)
            print(row.line())

    def report(self, label: str, times: dict[str, list[float]]) -> None:
        print(f"  {label} [{time.perf_counter() - self.t0:.0f} s into the run]:")
        for name, values in times.items():
            print(f"    {name:<26} {_spread(values)}")

    def fresh_dir(self, name: str) -> Path:
        path = self.workdir / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        self.created.add(path)  # removed at the end; nothing else in the workdir is
        return path


def bench_warm(b: Bench, remote: Remote) -> None:
    """Figures (1) and (3) warm: the entry / cached copy exists before every read."""
    import pyarrow.parquet as pq

    from nexus_cache.lakehouse import NexusCacheFileSystem

    name = remote.name
    ours = make_ours(b.fresh_dir(f"ours-warm-{name}"), "read_through", b.size)
    ours.prefetch(remote.path, fs=remote.fs)
    entry = ours.store.data_path(ours.plan(remote.path, fs=remote.fs).key)
    nfs = NexusCacheFileSystem(fs=remote.fs, cache=ours)
    dirs = {k: b.fresh_dir(f"{k}-warm-{name}") for k in _PEERS}
    peers = {k: make_peer(k, remote.fs, dirs[k]) for k in _PEERS}

    def byte_ops(drop: bool) -> dict[str, Op]:
        def dropper(paths: Callable[[], list[Path]]) -> Callable[[], None]:
            return (lambda: b.page_cache.drop(*paths())) if drop else (lambda: None)

        ops = {
            "ours (hit)": Op(
                lambda: ours_read(ours, remote, "hit"), b.check_bytes, dropper(lambda: [entry])
            ),
            "raw local read": Op(b.data.read_bytes, b.check_bytes, dropper(lambda: [b.data])),
        }
        for k in _PEERS:
            files = dropper(lambda k=k: [p for p in dirs[k].iterdir() if p.is_file()])
            ops[k] = Op(lambda k=k: peer_read(peers[k], remote), b.check_bytes, files)
        return ops

    times = measure(byte_ops(False), b.warm_repeats, warmup=True)
    b.report(f"[{name}] warm, full-object bytes, page-cache-warm", times)
    b.compare("(1) warm hit, bytes", name, times, "ours (hit)", ["raw local read"], True, 0.9)
    b.compare("(3) warm, bytes", name, times, "ours (hit)", _PEERS, False, 1.0)

    tables = {
        "ours (nexus fs)": Op(lambda: pq.read_table(remote.path, filesystem=nfs), b.check_table),
        "pyarrow local file": Op(lambda: pq.read_table(str(b.data)), b.check_table),
    }
    for k in _PEERS:
        tables[k] = Op(lambda k=k: pq.read_table(remote.path, filesystem=peers[k]), b.check_table)
    times = measure(tables, b.warm_repeats, warmup=True)
    b.report(f"[{name}] warm, pyarrow.parquet.read_table, page-cache-warm", times)
    b.compare(
        "(1) warm hit, read_table",
        name,
        times,
        "ours (nexus fs)",
        ["pyarrow local file"],
        True,
        0.9,
    )
    b.compare("(3) warm, read_table", name, times, "ours (nexus fs)", _PEERS, False, 1.0)

    if b.page_cache.method is not None:
        times = measure(byte_ops(True), b.warm_repeats, warmup=False)
        b.report(f"[{name}] warm, full-object bytes, page cache dropped before each read", times)
        figure = "(1) warm hit, bytes, page cache dropped"
        b.compare(figure, name, times, "ours (hit)", ["raw local read"], True, 0.9)
        b.compare(
            "(3) warm, bytes, page cache dropped", name, times, "ours (hit)", _PEERS, False, 1.0
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
    for k in _PEERS:
        ops[k] = Op(
            lambda k=k: peer_read(peers[k], remote), b.check_bytes, lambda k=k: fresh_peer(k)
        )
    times = measure(ops, b.cold_repeats[name], warmup=False)
    settle()
    what = "remote file's page cache dropped" if source and b.page_cache.method else "cache empty"
    b.report(f"[{name}] cold ({what}), full-object bytes", times)
    background = [
        e.duration_s
        for e in rt.events.events("fill_completed")
        if e.fill_mode.value == "background"
    ]
    print(
        f"    (read_through's background fill after each read, off the read path: {_spread(background)})"
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
    for ours_key in ("ours fill_before_read", "ours read_through"):
        b.compare("(3) cold, bytes", name, times, ours_key, _PEERS, False, None)
    rt.close()
    fbr.close()


def calibrate(b: Bench, remotes: list[Remote]) -> None:
    """One run each of what a fill does besides reading, and of its S3 request pattern."""
    print("  calibration, 1 run each (explains the cold figures; no targets):")

    def show(label: str, seconds: float) -> None:
        print(f"    {label:<44} {_fmt(seconds, b.size)}")

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


# -- (4) concurrency -----------------------------------------------------------------
_COUNTS: dict[str, int] = {}


def _install_counters() -> None:
    """Count what this process fetches from the remotes (every s3fs GET; local get_file)."""
    import s3fs
    from aiobotocore.response import AioStreamingBody
    from fsspec.implementations.local import LocalFileSystem

    call_s3 = s3fs.S3FileSystem._call_s3

    async def counting_call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get_object":
            _COUNTS["s3_gets"] = _COUNTS.get("s3_gets", 0) + 1
        return await call_s3(self, method, *args, **kwargs)

    # Bytes are counted as the response bodies are read, not from Content-Length:
    # s3fs opens a full GET and closes it unread when it switches to ranged parts.
    body_read = AioStreamingBody.read

    async def counting_body_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        data = await body_read(self, *args, **kwargs)
        _COUNTS["s3_bytes"] = _COUNTS.get("s3_bytes", 0) + len(data)
        return data

    get_file = LocalFileSystem.get_file

    def counting_get_file(self: Any, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> Any:
        _COUNTS["local_get_file"] = _COUNTS.get("local_get_file", 0) + 1
        return get_file(self, path1, path2, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = counting_call_s3  # type: ignore[method-assign]
    AioStreamingBody.read = counting_body_read  # type: ignore[method-assign]
    LocalFileSystem.get_file = counting_get_file  # type: ignore[method-assign]


def _conc_worker(index: int, spec_json: str, barrier: Any) -> None:
    """One of N processes: for each task, set up, meet the others, read everything."""
    spec = json.loads(spec_json)
    _install_counters()
    out: list[dict[str, Any]] = []
    for task in spec["tasks"]:
        _COUNTS.clear()
        rec: dict[str, Any] = {
            "remote": task["remote"],
            "kind": task["kind"],
            "round": task["round"],
            "error": None,
        }
        reader: Callable[[], tuple[bytes, Any]] | None = None
        try:
            remote = build_remote(
                task["remote"], spec["endpoint"], Path(spec["data"]), spec["s3_path"]
            )
            if task["kind"] == "ours":
                cache = make_ours(Path(task["dir"]), "fill_before_read", spec["size"])

                def reader(cache: Any = cache, remote: Remote = remote) -> tuple[bytes, Any]:
                    with cache.open(remote.path, fs=remote.fs) as f:
                        return f.read(), f.diagnostics.to_dict()
            else:
                pfs = make_peer(task["kind"], remote.fs, Path(task["dir"]))

                def reader(pfs: Any = pfs, remote: Remote = remote) -> tuple[bytes, Any]:
                    return peer_read(pfs, remote), None
        except Exception as exc:
            rec["error"] = f"setup: {type(exc).__name__}: {exc}"
        try:
            barrier.wait(timeout=300)
        except Exception as exc:  # another process failed: stop, say so
            rec["error"] = rec["error"] or f"barrier: {type(exc).__name__}"
            out.append(rec)
            break
        rec["start"], cpu = time.time(), time.process_time()
        if reader is not None and rec["error"] is None:
            try:
                data, diag = reader()
                rec["end"], rec["cpu_s"] = time.time(), time.process_time() - cpu
                rec["len"] = len(data)
                rec["sha_ok"] = hashlib.sha256(data).hexdigest() == spec["sha"]
                rec["diag"] = diag
                del data
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rec.setdefault("end", time.time())
        if task["kind"] == "ours" and reader is not None and rec["error"] is None:
            counts = cache.events.counts()
            rec["fills"] = counts.get("fill_completed", 0)
            rec["remote_reads"] = (
                rec["fills"] + counts.get("fill_failed", 0) + counts.get("read_mode.remote", 0)
            )
        else:
            rec["remote_reads"] = _COUNTS.get("local_get_file", 0)
        rec["s3_gets"] = _COUNTS.get("s3_gets", 0)
        rec["s3_bytes"] = _COUNTS.get("s3_bytes", 0)
        out.append(rec)
        try:
            barrier.wait(timeout=900)  # the next task starts when every reader is done
        except Exception:
            break
    Path(spec["out"], f"worker-{index}.json").write_text(json.dumps(out))


@dataclasses.dataclass
class ConcResult:
    remote: str
    kind: str
    readers: int
    correct: int
    partial: int
    wrong: int
    errors: list[str]
    fetched: float  # object sizes fetched from the remote per round, all readers together
    fills: list[int] | None  # per round
    wall_s: float  # median over rounds: first reader's start to last reader's end
    bad_lengths: list[int]  # lengths read by readers that got wrong or partial bytes

    @classmethod
    def from_records(
        cls, remote: str, kind: str, recs: list[dict[str, Any]], procs: int, rounds: int, size: int
    ) -> ConcResult:
        by_round = [[r for r in recs if r["round"] == n] for n in range(rounds)]
        walls = [
            max(r["end"] for r in rs) - min(r["start"] for r in rs)
            for rs in by_round
            if rs and all("start" in r for r in rs)
        ]
        read = [r for r in recs if r["error"] is None]
        bad = [r for r in read if not (r["len"] == size and r["sha_ok"])]
        if remote == "s3":  # bytes of GET responses read, in object sizes
            fetched = sum(r["s3_bytes"] for r in recs) / size / rounds
        else:  # whole-object reads of the source file
            fetched = sum(r.get("remote_reads", 0) for r in recs) / rounds
        return cls(
            remote=remote,
            kind=kind,
            readers=procs * rounds,
            correct=len(read) - len(bad),
            partial=sum(1 for r in bad if r["len"] < size),
            wrong=sum(1 for r in bad if r["len"] >= size),
            errors=[r["error"] for r in recs if r["error"]]
            + ["no result"] * (procs * rounds - len(recs)),
            fetched=fetched,
            fills=[sum(r.get("fills", 0) for r in rs) for rs in by_round]
            if kind == "ours"
            else None,
            wall_s=statistics.median(walls) if walls else float("nan"),
            bad_lengths=sorted(r["len"] for r in bad),
        )

    @property
    def verdict(self) -> str:
        if self.kind != "ours":
            return "observed"
        rounds = len(self.fills or [])
        one_fill = self.fills is not None and set(self.fills) == {1}
        ok = one_fill and rounds and self.correct == self.readers and abs(self.fetched - 1) < 0.01
        return "met" if ok else "NOT met"


def bench_concurrency(
    b: Bench,
    remotes: list[Remote],
    endpoint: str | None,
    s3_path: str | None,
    procs: int,
    rounds: int,
) -> list[ConcResult]:
    """Figure (4): ``procs`` processes, spawned once, run every task in lockstep."""
    base = b.fresh_dir("concurrency")
    tasks = []
    for n in range(rounds):
        for remote in remotes:
            for kind in ("ours", *_PEERS):
                d = base / f"{remote.name}-{kind}-{n}"
                d.mkdir()
                tasks.append({"remote": remote.name, "kind": kind, "dir": str(d), "round": n})
    spec = {
        "tasks": tasks,
        "endpoint": endpoint,
        "s3_path": s3_path,
        "data": str(b.data),
        "size": b.size,
        "sha": b.sha,
        "out": str(base),
    }
    barrier = CTX.Barrier(procs)
    workers = [
        CTX.Process(target=_conc_worker, args=(i, json.dumps(spec), barrier)) for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(1800)
        if w.is_alive():
            w.terminate()
            w.join(15)
    records: list[dict[str, Any]] = []
    for i in range(procs):
        path = base / f"worker-{i}.json"
        if path.exists():
            records.extend(json.loads(path.read_text()))
    results = []
    for remote in remotes:
        for kind in ("ours", *_PEERS):
            recs = [r for r in records if (r["remote"], r["kind"]) == (remote.name, kind)]
            results.append(ConcResult.from_records(remote.name, kind, recs, procs, rounds, b.size))
    for res in results:
        fills = f", fills per round {res.fills}" if res.fills is not None else ""
        errors = f", errors: {sorted(set(res.errors))}" if res.errors else ""
        if res.bad_lengths:
            errors += f" (bad readers got {res.bad_lengths} of {b.size} bytes)"
        print(
            f"RESULT (4) [{res.remote}] {res.kind}: {res.readers} reads, remote fetched "
            f"{res.fetched:.2f}x the object per round{fills}; {res.correct} correct, "
            f"{res.partial} partial, {res.wrong} wrong bytes{errors}; "
            f"wall {res.wall_s * 1e3:.0f} ms per round -> {res.verdict}"
        )
    for remote in remotes:
        ours = next(r for r in results if (r.remote, r.kind) == (remote.name, "ours"))
        for peer in (r for r in results if r.remote == remote.name and r.kind != "ours"):
            print(
                f"RATIO (4) [{remote.name}] ours vs {peer.kind}: remote fetches {ours.fetched:.2f}x vs "
                f"{peer.fetched:.2f}x; correct readers {ours.correct}/{ours.readers} vs "
                f"{peer.correct}/{peer.readers}; wall time ours/peer = {ours.wall_s / peer.wall_s:.2f}"
            )
    return results


# -- output --------------------------------------------------------------------------
def print_table(rows: list[Row], conc: list[ConcResult]) -> None:
    print(
        "\nSummary (medians; ratio = ours/peer: 'thr' = throughput, higher is better; 'time' = time, lower is better)"
    )
    head = f"{'figure':<42} {'remote':<6} {'ours':<22} {'ours ms':>8} {'peer':<20} {'peer ms':>8} {'ratio':>10} {'target':>8}  verdict"
    print(head)
    print("-" * len(head))
    for r in rows:
        target = "" if r.target is None else (">=" if r.throughput else "<=") + f"{r.target}"
        kind = "thr" if r.throughput else "time"
        print(
            f"{r.figure:<42} {r.remote:<6} {r.ours:<22} {statistics.median(r.ours_s) * 1e3:>8.0f} "
            f"{r.peer:<20} {statistics.median(r.peer_s) * 1e3:>8.0f} {r.ratio:>5.2f} {kind:<4} {target:>8}  {r.verdict}"
        )
    if conc:
        print(
            f"\n{'(4) concurrency':<22} {'remote':<6} {'reads':>5} {'fetched/round':>13} {'fills/round':>11} {'correct':>7} {'partial':>7} {'wrong':>5} {'errors':>6} {'wall ms':>8}  verdict"
        )
        for c in conc:
            fills = "-" if c.fills is None else ",".join(map(str, c.fills))
            print(
                f"{c.kind:<22} {c.remote:<6} {c.readers:>5} {c.fetched:>12.2f}x {fills:>11} {c.correct:>7} "
                f"{c.partial:>7} {c.wrong:>5} {len(c.errors):>6} {c.wall_s * 1e3:>8.0f}  {c.verdict}"
            )


def _versions() -> str:
    import fsspec
    import moto
    import pyarrow
    import s3fs

    return f"python {sys.version.split()[0]}, pyarrow {pyarrow.__version__}, fsspec {fsspec.__version__}, s3fs {s3fs.__version__}, moto {moto.__version__}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="32 MiB, 3 warm / 2 cold repeats, 3 readers")
    add("--size-mib", type=int, help="size of the Parquet object (default 256, --quick 32)")
    add("--workdir", type=Path, default=Path("/tmp/nexus-bench"), help="keeps the object")
    add("--warm-repeats", type=int, help="default 7 (--quick 3)")
    add("--cold-repeats", type=int, help="default 5 local, 3 s3 (--quick 2)")
    add("--procs", type=int, help="concurrent readers in (4) (default 4, --quick 3)")
    add(
        "--rounds",
        type=int,
        help="rounds of (4), races being timing-dependent (default 3, --quick 1)",
    )
    add("--remotes", default="local,s3", help="comma list of: local, s3")
    args = parser.parse_args(argv)
    quick = args.quick
    args.size_mib = args.size_mib or (32 if quick else 256)
    args.warm_repeats = args.warm_repeats or (3 if quick else 7)
    # an s3 cold repeat costs ~30 s at 256 MiB on moto (see the calibration lines)
    cold = args.cold_repeats or (2 if quick else 0)
    args.cold_repeats = {"local": cold or 5, "s3": cold or 3}
    args.procs = args.procs or (3 if quick else 4)
    args.rounds = args.rounds or (1 if quick else 3)
    args.remotes = [r.strip() for r in args.remotes.split(",") if r.strip()]
    if not args.remotes or not set(args.remotes) <= {"local", "s3"}:
        parser.error(f"--remotes={','.join(args.remotes)!r}; use local, s3 or local,s3")
    if min(args.size_mib, args.warm_repeats, *args.cold_repeats.values(), args.rounds) < 1:
        parser.error("--size-mib, --rounds and the repeats must be >= 1")
    if args.procs < 2:
        parser.error(f"--procs={args.procs}; use 2 or more concurrent readers")
    return args


def _code_version() -> str:
    """The last commit of the measured package, and whether it has local changes."""
    import subprocess

    import nexus_cache.lakehouse as pkg

    where = os.path.dirname(pkg.__file__)
    try:
        git = ["git", "-C", where]
        commit = subprocess.run(
            [*git, "log", "-1", "--format=%h", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"nexus_cache.lakehouse from {where} (not a git checkout)"
    return f"nexus_cache.lakehouse at {commit}{' + uncommitted changes' if dirty else ''}"


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"lakehouse byte cache benchmark, {time.strftime('%Y-%m-%d %H:%M')}: {_versions()}")
    print(f"machine: {os.cpu_count()} CPUs, {_load()} at the start (other work on it adds noise)")
    print(f"measuring {_code_version()}")
    server = MotoServer().start() if "s3" in args.remotes else None  # boots meanwhile
    created: set[Path] = set()
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
        print(f"object: {data}, {size / MIB:.1f} MiB, {rows} rows of random values")
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
            print(f"\n== remote: {remote.name} ==")
            bench_warm(b, remote)
            bench_cold(b, remote)
        print()
        calibrate(b, remotes)
        print(
            f"\n== (4) {args.procs} processes (spawn) read one uncached object at once, {args.rounds} round(s) =="
        )
        conc = bench_concurrency(b, remotes, endpoint, s3_path, args.procs, args.rounds)
        print_table(b.results, conc)
    finally:
        if server is not None:
            server.stop()
        for path in created:  # only what we made; the object stays for the next run
            shutil.rmtree(path, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; {_load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
