"""Figure (5): warm reads of a whole dataset (many Parquet files under one prefix).

Each engine reads the prefix the way users write it, through our ``nexus``
filesystem and through fsspec's ``simplecache::`` and ``filecache::`` on moto S3
(each side with an s3fs client of its own, so no side warms another's listing
cache). Before timing, one read per side runs with the S3 request counters on:
the requests a warm dataset read sends are printed beside the times.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem

from _lakehouse.data import MIB, make_dataset
from _lakehouse.measure import Op, measure
from _lakehouse.peers import PEERS, make_ours, make_peer
from _lakehouse.s3 import BUCKET, COUNTS, install_counters, make_s3fs, upload_many
from _lakehouse.workloads import Bench
from nexus_cache._sizes import format_size

__all__ = ["READERS", "bench_datasets"]

_SHIM = "bench"


class _DuckShim(AbstractFileSystem):
    """Strips ``bench://`` from the URLs DuckDB passes, then calls the wrapped fs.

    DuckDB hands registered filesystems URLs with their protocol; fsspec's
    caching wrappers pass them on to s3fs unstripped, which fails. Every side is
    registered through this same thin shim, so the comparison stays even.
    """

    protocol = _SHIM
    cachable = False

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return str(path).removeprefix(f"{_SHIM}://")

    def glob(self, path: str, **kwargs: Any) -> Any:
        return self.inner.glob(self._strip_protocol(path), **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.inner.info(self._strip_protocol(path), **kwargs)

    def size(self, path: str) -> Any:
        return self.inner.size(self._strip_protocol(path))

    def modified(self, path: str) -> Any:
        return self.inner.modified(self._strip_protocol(path))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:  # type: ignore[override]
        return self.inner.open(self._strip_protocol(path), mode, **kwargs)


def _read_table(fs: Any, prefix: str) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(prefix, filesystem=fs)


def _dataset(fs: Any, prefix: str) -> Any:
    import pyarrow.dataset as ds

    return ds.dataset(prefix, filesystem=fs, format="parquet").to_table()


def _pandas(fs: Any, prefix: str) -> Any:
    import pandas as pd

    return pd.read_parquet(prefix, filesystem=fs)


def _duckdb(fs: Any, prefix: str) -> Any:
    import duckdb

    con = duckdb.connect()
    try:
        con.register_filesystem(_DuckShim(fs))
        query = f"SELECT * FROM read_parquet('{_SHIM}://{prefix}*.parquet')"
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


#: engine -> how it reads a prefix
READERS: dict[str, Callable[[Any, str], Any]] = {
    "pq.read_table": _read_table,
    "pyarrow.dataset": _dataset,
    "pandas": _pandas,
    "duckdb glob": _duckdb,
}
_TARGETED = {(16, "pq.read_table")}  # the target: <= 1.0 against both peers


def _requests() -> str:
    names = {"list_objects_v2": "LIST", "head_object": "HEAD", "get_object": "GET"}
    return ", ".join(f"{COUNTS.get(k, 0)} {v}" for k, v in names.items())


def bench_datasets(
    b: Bench, endpoint: str, files: list[int], total_bytes: int, readers: list[str]
) -> None:
    """Warm reads of an ``n``-file dataset for every ``n`` in ``files``."""
    install_counters()
    for n in files:
        _bench_dataset(b, endpoint, n, total_bytes, readers)


def _bench_dataset(b: Bench, endpoint: str, n: int, total_bytes: int, readers: list[str]) -> None:
    from nexus_cache.lakehouse import NexusCacheFileSystem

    where = b.workdir / f"dataset-{n}x{total_bytes // MIB}mib"
    paths, rows = make_dataset(where, n, total_bytes)
    nbytes = sum(p.stat().st_size for p in paths)
    keys = upload_many(endpoint, paths, f"ds{n}/")
    prefix = f"{BUCKET}/ds{n}/"
    ours = make_ours(b.fresh_dir(f"ours-dataset-{n}"), "read_through", nbytes)
    filler = make_s3fs(endpoint)
    for key in keys:
        ours.prefetch(key, fs=filler)
    sides = {"ours (nexus fs)": NexusCacheFileSystem(fs=make_s3fs(endpoint), cache=ours)}
    for kind in PEERS:
        storage = b.fresh_dir(f"{kind}-dataset-{n}")
        sides[kind] = make_peer(kind, make_s3fs(endpoint), storage)
    print(f"\n== (5) warm dataset: {n} files, {format_size(nbytes)}, s3://{prefix} ==")

    def check(table: Any, full: bool) -> None:
        if len(table) != rows:
            raise RuntimeError(f"the dataset read gave {len(table)} rows, expected {rows}")

    for reader in readers:
        read = READERS[reader]
        ops = {
            side: Op(lambda fs=fs, read=read: read(fs, prefix), check)
            for side, fs in sides.items()
        }
        for side, fs in sides.items():
            check(read(fs, prefix), True)  # warm every side's copies and listings
            COUNTS.clear()
            check(read(fs, prefix), True)
            print(f"REQUESTS (5) [s3, {n} files] {reader} {side}: {_requests()}")
        times = measure(ops, b.warm_repeats, warmup=False)
        b.report(f"[s3] warm dataset of {n} files, {reader}", times)
        target = 1.0 if (n, reader) in _TARGETED else None
        figure = f"(5) warm dataset {n} files, {reader}"
        b.compare(figure, "s3", times, "ours (nexus fs)", PEERS, False, target, nbytes=nbytes)
    ours.close()
