"""The measured objects: random-valued Parquet files, and the OS page cache."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import time
from pathlib import Path

__all__ = ["MIB", "PageCache", "make_dataset", "make_parquet", "resident_fraction", "sha256_file"]

MIB = 1024 * 1024
_ROW_BYTES = 24  # int64 + float64 + float32 + int32, plain-encoded random values
_GROUP_ROWS = 1 << 20


def make_parquet(path: Path, size_bytes: int, *, seed: int = 20261202) -> int:
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
    rng = np.random.default_rng(seed)
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


def make_dataset(directory: Path, files: int, total_bytes: int) -> tuple[list[Path], int]:
    """Write (once) ``files`` Parquet files sharing ``total_bytes``; ``(paths, rows)``."""
    directory.mkdir(parents=True, exist_ok=True)
    each = max(1, total_bytes // files)
    paths = [directory / f"part-{i:04d}.parquet" for i in range(files)]
    rows = sum(make_parquet(p, each, seed=i) for i, p in enumerate(paths))
    return paths, rows


def sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            hasher.update(chunk)
    return hasher.hexdigest()


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
            return (
                f"could not drop the page cache ({self.detail.strip()}); "
                "all figures are page-cache-warm for both sides"
            )
        return (
            f"page cache dropped with {self.method}, verified by mincore ({self.detail.strip()})"
        )
