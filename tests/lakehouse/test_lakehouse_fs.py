"""pyarrow reading through the ``nexus`` fsspec filesystem: URL chaining and wrapping."""

from __future__ import annotations

import gc
import io
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from nexus_cache.lakehouse import CacheStatus, LakehouseCache, NexusCacheFileSystem

from ._helpers import entry_files, make_cache, make_s3fs, put_object, write_old_file


def _table(n: int = 20_000, seed: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(seed, seed + n), pa.int64()),
            "name": pa.array([f"row-{i}" for i in range(n)]),
            "x": pa.array([i * 0.5 for i in range(n)], pa.float64()),
        }
    )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _statuses(cache: LakehouseCache) -> list[CacheStatus]:
    return [d.cache_status for d in cache.events.reads()]


def test_url_chaining_with_pyarrow_parquet(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    table = _table()
    put_object(s3_endpoint, s3_bucket, "t/part-0.parquet", _parquet_bytes(table))
    url = f"nexus::s3://{s3_bucket}/t/part-0.parquet"
    s3_opts = {"client_kwargs": {"endpoint_url": s3_endpoint}}
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        fs, path = fsspec.core.url_to_fs(url, s3=s3_opts, nexus={"cache": cache})
        assert isinstance(fs, NexusCacheFileSystem)
        assert path == f"{s3_bucket}/t/part-0.parquet"
        assert pq.read_table(path, filesystem=fs).equals(table)
        with fsspec.open(url, s3=s3_opts, nexus={"cache": cache}) as f:
            assert pq.read_table(f).equals(table)
        statuses = _statuses(cache)  # pyarrow may open a file more than once
        assert statuses[0] is CacheStatus.MISS
        assert set(statuses[1:]) == {CacheStatus.HIT}
        assert len(statuses) >= 2
    assert len(entry_files(root)) == 1


def test_wrapped_filesystem_with_pyarrow_dataset(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    tables = [_table(5_000, seed=i * 5_000) for i in range(3)]
    for i, t in enumerate(tables):
        put_object(s3_endpoint, s3_bucket, f"ds/part-{i}.parquet", _parquet_bytes(t))
    expected = pa.concat_tables(tables)
    with make_cache(tmp_path / "c", policy="read_through") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        passes = []
        for _ in range(2):
            got = ds.dataset(f"{s3_bucket}/ds", filesystem=nfs, format="parquet").to_table()
            assert got.sort_by("id").equals(expected)
            gc.collect()  # pyarrow closes a file (scheduling its fill) when collected
            assert cache.wait_for_fills(timeout=30)
            passes.append(_statuses(cache)[sum(len(p) for p in passes) :])
        # pyarrow may open a file more than once per scan, and a read_through
        # fill started by the first open may be published before the next one
        assert passes[0].count(CacheStatus.MISS) >= 3
        assert set(passes[0]) <= {CacheStatus.MISS, CacheStatus.HIT}
        assert set(passes[1]) == {CacheStatus.HIT}
        assert len(passes[1]) >= 3
        assert len(entry_files(tmp_path / "c")) == 3
        assert pq.read_table(f"{s3_bucket}/ds/part-1.parquet", filesystem=nfs).equals(tables[1])


def test_local_directory_remote_by_chaining(tmp_path: Path) -> None:
    table = _table(1000)
    path = write_old_file(tmp_path / "lake" / "a.parquet", _parquet_bytes(table))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        for _ in range(2):
            with fsspec.open(f"nexus::file://{path}", nexus={"cache": cache}) as f:
                assert pq.read_table(f).equals(table)
        assert _statuses(cache) == [CacheStatus.MISS, CacheStatus.HIT]
        nfs = NexusCacheFileSystem(cache=cache)  # default target: the local filesystem
        assert pq.read_table(str(path), filesystem=nfs).equals(table)
        assert nfs.cat_file(str(path), start=0, end=4) == b"PAR1"
        assert nfs.cat_file(str(path), start=-4) == b"PAR1"
        assert nfs.ls(str(path.parent), detail=False) == [str(path)]


def test_nexus_filesystem_is_read_only(tmp_path: Path) -> None:
    with make_cache(tmp_path / "c") as cache:
        nfs = NexusCacheFileSystem(cache=cache)
        with pytest.raises(NotImplementedError, match="read-only"):
            nfs.open(str(tmp_path / "x"), "wb")


def test_default_cache_comes_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nexus_cache.lakehouse import _cache as cache_module

    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(tmp_path / "envroot"))
    monkeypatch.setattr(cache_module, "_default", None)
    path = write_old_file(tmp_path / "a.bin", b"hello")
    fs: Any = NexusCacheFileSystem()
    assert fs.cache.config.root == tmp_path / "envroot"
    assert fs.cat_file(str(path)) == b"hello"
    monkeypatch.setattr(cache_module, "_default", None)


def test_pyarrow_reads_hits_zero_copy_and_misses_natively(tmp_path: Path) -> None:
    table = _table(3000)
    path = write_old_file(tmp_path / "lake" / "a.parquet", _parquet_bytes(table))
    with make_cache(tmp_path / "c", policy="read_through") as cache:
        with cache.open(path) as f:  # a miss: the local source read through Arrow
            assert not f.is_local
            first = f.read_buffer(4)
            assert bytes(first) == b"PAR1"
            f.seek(0)
            assert pq.read_table(f).equals(table)
        assert cache.wait_for_fills(timeout=30)
        with cache.open(path) as f:  # a hit: views of the mapping
            assert f.is_local
            view = f.read_buffer(4)
            assert isinstance(view, memoryview)
            assert bytes(view) == b"PAR1"
            assert f.tell() == 4
            f.seek(0)
            got = pq.read_table(f)
            del view
        assert got.equals(table)  # still valid after the handle closed


# --- fsspec conventions ----------------------------------------------------------


def test_nexus_double_colon_before_an_absolute_path(tmp_path: Path) -> None:
    table = _table(500)
    path = write_old_file(tmp_path / "lake" / "a.parquet", _parquet_bytes(table))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        for url in (f"nexus::{path}", f"nexus://{path}", f"nexus::file://{path}"):
            with fsspec.open(url, nexus={"cache": cache}) as f:
                assert pq.read_table(f).equals(table), url
            fs, inner = fsspec.core.url_to_fs(url, nexus={"cache": cache})
            assert inner == str(path)
            assert pq.read_table(inner, filesystem=fs).equals(table), url
            # the cache's own entry point takes the same spellings as local paths
            with cache.open(url) as h:
                assert h.is_local, url
        assert _statuses(cache)[0] is CacheStatus.MISS
        assert set(_statuses(cache)[1:]) == {CacheStatus.HIT}


def test_pandas_accepts_the_url_spellings_with_a_scheme(tmp_path: Path) -> None:
    import pandas as pd

    table = _table(500)
    path = write_old_file(tmp_path / "lake" / "a.parquet", _parquet_bytes(table))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        for url in (f"nexus://{path}", f"nexus::file://{path}"):
            got = pd.read_parquet(url, storage_options={"cache": cache})
            assert got.equals(table.to_pandas()), url


def test_cache_storage_option_picks_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse import _cache as cache_module

    monkeypatch.setattr(cache_module, "_by_root", {})
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "fill_before_read")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1G")
    path = write_old_file(tmp_path / "lake" / "a.bin", b"hello")
    root = tmp_path / "picked"
    for storage in (str(root), [str(root)]):
        with fsspec.open(f"nexus::file://{path}", nexus={"cache_storage": storage}) as f:
            assert f.read() == b"hello"
    assert len(entry_files(root)) == 1
    fs = NexusCacheFileSystem(cache_storage=str(root))
    assert fs.cache is cache_module.default_cache(root)  # one cache per root and process
    assert fs.cache.events.reads()[-1].cache_status is CacheStatus.HIT
    fs.cache.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"expiry_time": 60}, "expiry_time"),
        ({"check_files": True, "same_names": True}, "check_files, same_names"),
        ({"cache_storag": "/tmp/x"}, "cache_storag"),
        ({"cache_storage": "TMP"}, "cache_storage"),
        ({"cache_storage": ["/a", "/b"]}, "cache_storage"),
        # a root path given as the cache object failed at the first read with
        # AttributeError: 'str' object has no attribute 'open'
        ({"cache": "/var/cache/lake"}, "cache='/var/cache/lake' is not a LakehouseCache"),
    ],
)
def test_unknown_or_unsupported_options_are_refused_by_name(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    from nexus_cache.errors import ConfigError

    path = write_old_file(tmp_path / "a.bin", b"x")
    with pytest.raises(ConfigError, match=named):
        fsspec.open(f"nexus::file://{path}", nexus=options).open()


@pytest.mark.parametrize("storage", ["", "  ", "s3://bucket/cache", "~no-such-user-x/c", "FILE"])
def test_a_bad_cache_storage_is_named_as_the_option_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str
) -> None:
    # These were refused as "NEXUS_LAKEHOUSE_CACHE_ROOT='...' is not accepted",
    # sending the user to a variable they never set.
    from nexus_cache.errors import ConfigError

    monkeypatch.delenv("NEXUS_LAKEHOUSE_CACHE_ROOT", raising=False)
    path = write_old_file(tmp_path / "a.bin", b"x")
    if storage == "FILE":
        storage = str(path)  # a file, not a directory
    with pytest.raises(ConfigError) as caught:
        fsspec.open(f"nexus::file://{path}", nexus={"cache_storage": storage}).open()
    assert str(caught.value).startswith(f"nexus option cache_storage={storage!r}")
    assert "NEXUS_LAKEHOUSE_CACHE_ROOT" not in str(caught.value)
