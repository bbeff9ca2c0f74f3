"""Planned hits: identities proven by the listing a dataset read makes anyway, by the
``info`` a single-file read makes anyway, or (opt-in) by a recent proof within the
identity TTL. Requests are counted at s3fs's one call into botocore, against moto."""

from __future__ import annotations

import io
import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import (
    CacheStatus,
    EventKind,
    LakehouseCacheConfig,
    NexusCacheFileSystem,
)

from ._helpers import make_cache, make_s3fs, put_object

_plain_ids = itertools.count()


def _table_bytes(value: int, rows: int = 2000) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"v": [value] * rows, "i": list(range(rows))}), sink)
    return sink.getvalue()


@pytest.fixture
def plain_bucket(s3_endpoint: str) -> str:
    """A bucket without versioning: listings and HEADs carry the same identity."""
    import boto3

    name = f"plain-{os.getpid()}-{next(_plain_ids)}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


class _Sent(dict):  # type: ignore[type-arg]
    """Requests by operation name; ``objects[name]`` lists the object keys they named."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[str, list[str]] = {}

    def clear(self) -> None:
        super().clear()
        self.objects.clear()


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> _Sent:
    """Every S3 request s3fs sends from now on, by operation name."""
    import s3fs

    counts = _Sent()
    original = s3fs.S3FileSystem._call_s3

    async def counting(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        counts[method] = counts.get(method, 0) + 1
        counts.objects.setdefault(method, []).append(kwargs.get("Key", ""))
        return await original(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    return counts


def _dataset(endpoint: str, bucket: str, files: int, value: int = 1) -> list[str]:
    keys = [f"t/part-{i}.parquet" for i in range(files)]
    for key in keys:
        put_object(endpoint, bucket, key, _table_bytes(value))
    return keys


def _hits(cache: Any) -> int:
    return sum(1 for d in cache.events.reads() if d.cache_status is CacheStatus.HIT)


@pytest.mark.parametrize("fresh_process", [False, True], ids=["same-cache", "new-cache"])
def test_warm_dataset_read_is_one_list_and_no_head(
    tmp_path: Path,
    s3_endpoint: str,
    plain_bucket: str,
    requests: _Sent,
    fresh_process: bool,
) -> None:
    import pyarrow.dataset as ds

    keys = _dataset(s3_endpoint, plain_bucket, 6)
    root = tmp_path / "c"
    cache = make_cache(root, policy="fill_before_read")
    for key in keys:
        assert cache.prefetch(f"{plain_bucket}/{key}", fs=make_s3fs(s3_endpoint))
    if fresh_process:  # nothing remembered: the listing alone proves the identities
        cache.close()
        cache = make_cache(root, policy="fill_before_read")
    nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
    ds.dataset(f"{plain_bucket}/t/", filesystem=nfs, format="parquet").to_table()  # dircache
    requests.clear()
    hits = _hits(cache)

    table = ds.dataset(f"{plain_bucket}/t/", filesystem=nfs, format="parquet").to_table()

    assert table.num_rows == 6 * 2000
    assert requests == {"list_objects_v2": 1}  # one LIST, no HEAD, no GET
    assert _hits(cache) - hits >= 6  # every file served from its entry
    cache.close()


def test_versioned_bucket_listing_proves_a_remembered_version(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, requests: _Sent
) -> None:
    import pyarrow.parquet as pq

    keys = _dataset(s3_endpoint, s3_bucket, 3)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        for key in keys:  # fills record the version id, which listings lack
            assert cache.prefetch(f"{s3_bucket}/{key}", fs=nfs.fs)
        pq.read_table(f"{s3_bucket}/t/", filesystem=nfs)
        requests.clear()
        assert pq.read_table(f"{s3_bucket}/t/", filesystem=nfs).num_rows == 3 * 2000
        assert requests == {"list_objects_v2": 1}


def test_a_new_listing_sees_an_overwrite(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str
) -> None:
    import pyarrow.parquet as pq

    keys = _dataset(s3_endpoint, plain_bucket, 3, value=1)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        assert set(pq.read_table(f"{plain_bucket}/t/", filesystem=nfs)["v"].to_pylist()) == {1}
        put_object(s3_endpoint, plain_bucket, keys[1], _table_bytes(2))
        values = pq.read_table(f"{plain_bucket}/t/", filesystem=nfs)["v"].to_pylist()
        assert sorted(set(values)) == [1, 2]  # the new listing proved the new object


def test_listed_object_whose_entry_vanished_reads_correct_bytes(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str
) -> None:
    (key,) = _dataset(s3_endpoint, plain_bucket, 1, value=7)
    path = f"{plain_bucket}/{key}"
    with make_cache(tmp_path / "c", policy="read_through") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        assert cache.prefetch(path, fs=nfs.fs)
        nfs.ls(f"{plain_bucket}/t/")  # the listing proves the identity...
        cache.clear()  # ...but the entry is gone: planned as a miss, read remotely
        with nfs.open(path, "rb") as f:
            assert f.read() == _table_bytes(7)
            assert f.diagnostics.cache_status is CacheStatus.MISS


def test_single_file_warm_read_table_sends_one_head(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, requests: _Sent
) -> None:
    import pyarrow.parquet as pq

    (key,) = _dataset(s3_endpoint, plain_bucket, 1)
    path = f"{plain_bucket}/{key}"
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        pq.read_table(path, filesystem=nfs)
        requests.clear()
        hits = _hits(cache)
        assert pq.read_table(path, filesystem=nfs).num_rows == 2000
        # pyarrow asks info once and opens twice: the info's HEAD proves both opens
        assert requests == {"head_object": 1}
        assert _hits(cache) - hits == 2


def test_a_proof_expires(
    tmp_path: Path,
    s3_endpoint: str,
    plain_bucket: str,
    requests: _Sent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_cache.lakehouse.identity import _proofs

    (key,) = _dataset(s3_endpoint, plain_bucket, 1, value=3)
    path = f"{plain_bucket}/{key}"
    monkeypatch.setattr(_proofs, "PROOF_WINDOW_S", 0.2)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        assert cache.prefetch(path, fs=nfs.fs)
        nfs.info(path)
        put_object(s3_endpoint, plain_bucket, key, _table_bytes(4))
        time.sleep(0.3)
        requests.clear()
        with nfs.open(path, "rb") as f:  # the old proof no longer counts:
            assert f.read() == _table_bytes(4)  # the open's own probe refutes it
        assert requests.get("head_object", 0) >= 1


# -- the opt-in identity TTL ---------------------------------------------------------


@pytest.mark.parametrize("bad", ["nan", "inf", "-1", "-0.5", "soon", float("nan"), -3])
def test_identity_ttl_refuses_bad_values(bad: Any) -> None:
    with pytest.raises(ConfigError, match="NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL"):
        LakehouseCacheConfig(identity_ttl_s=bad)
    if isinstance(bad, str):
        env = {"NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL": bad}
        with pytest.raises(ConfigError, match="NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL"):
            LakehouseCacheConfig.from_env(env)


def test_identity_ttl_default_and_env() -> None:
    assert LakehouseCacheConfig().identity_ttl_s == 0.0
    env = {"NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL": " 2.5 "}
    assert LakehouseCacheConfig.from_env(env).identity_ttl_s == 2.5


@pytest.mark.parametrize("ttl", [0.0, 60.0])
def test_identity_ttl_decides_whether_a_warm_open_asks(
    tmp_path: Path,
    s3_endpoint: str,
    plain_bucket: str,
    requests: _Sent,
    ttl: float,
) -> None:
    (key,) = _dataset(s3_endpoint, plain_bucket, 1, value=5)
    source = f"s3://{plain_bucket}/{key}"
    fs = make_s3fs(s3_endpoint)
    with make_cache(tmp_path / "c", policy="fill_before_read", identity_ttl_s=ttl) as cache:
        assert cache.prefetch(source, fs=fs)
        requests.clear()
        assert cache.read(source, fs=fs) == _table_bytes(5)
        assert requests == ({} if ttl else {"head_object": 1})


def test_identity_ttl_bounds_the_staleness(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse.identity import _known

    (key,) = _dataset(s3_endpoint, plain_bucket, 1, value=5)
    source = f"s3://{plain_bucket}/{key}"
    fs = make_s3fs(s3_endpoint)
    with make_cache(tmp_path / "c", policy="fill_before_read", identity_ttl_s=30.0) as cache:
        assert cache.prefetch(source, fs=fs)
        put_object(s3_endpoint, plain_bucket, key, _table_bytes(6))
        # the documented risk: within the window the old entry still serves
        assert cache.read(source, fs=fs) == _table_bytes(5)

        class _Later:  # the clock the TTL is judged by, 31 s on
            @staticmethod
            def monotonic() -> float:
                return time.monotonic() + 31.0

        monkeypatch.setattr(_known, "time", _Later)
        assert cache.read(source, fs=fs) == _table_bytes(6)


# -- cold reads: the plan's HEAD is the only one --------------------------------------


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_cold_read_is_one_head_and_one_get(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, requests: _Sent, policy: str
) -> None:
    (key,) = _dataset(s3_endpoint, plain_bucket, 1, value=8)
    source = f"s3://{plain_bucket}/{key}"
    fs = make_s3fs(s3_endpoint)
    with make_cache(tmp_path / "c", policy=policy) as cache:
        requests.clear()
        with cache.open(source, fs=fs) as f:
            assert f.read() == _table_bytes(8)
            assert f.diagnostics.cache_status is CacheStatus.MISS
            # (before close, which starts read_through's background fill)
            # s3fs opens the object on the plan's identity: no HEAD of its own,
            # every GET pinned by If-Match on the planned ETag
            assert requests == {"head_object": 1, "get_object": 1}


def _forgotten_entry(cache: Any, endpoint: str, bucket: str) -> tuple[str, Any, str]:
    """``(source, fs, key)`` of an object whose identity ``cache`` proved (a
    prefetch) and whose entry is gone since (cleared)."""
    (key,) = _dataset(endpoint, bucket, 1, value=8)
    source, fs = f"s3://{bucket}/{key}", make_s3fs(endpoint)
    assert cache.prefetch(source, fs=fs)
    cache.clear()
    return source, fs, key


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_a_cold_read_of_an_object_planned_before_sends_no_head(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, requests: _Sent, policy: str
) -> None:
    with make_cache(tmp_path / "c", policy=policy) as cache:
        source, fs, _ = _forgotten_entry(cache, s3_endpoint, plain_bucket)
        requests.clear()
        with cache.open(source, fs=fs) as f:
            assert f.read() == _table_bytes(8)
            assert f.diagnostics.cache_status is CacheStatus.MISS
            # the remembered identity plans the miss; the GET, pinned by
            # If-Match on its ETag, proves it: no HEAD
            assert requests == {"get_object": 1}


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_a_planned_miss_whose_object_changed_serves_the_new_object(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, requests: _Sent, policy: str
) -> None:
    with make_cache(tmp_path / "c", policy=policy) as cache:
        source, fs, key = _forgotten_entry(cache, s3_endpoint, plain_bucket)
        put_object(s3_endpoint, plain_bucket, key, _table_bytes(9))  # overwritten meanwhile
        requests.clear()
        assert cache.read(source, fs=fs) == _table_bytes(9)
        # the GET pinned to the remembered ETag was refused (412), reported, and
        # the read planned again with a request before any byte was handed out
        assert len(cache.events.events(EventKind.STALE_PLAN)) == 1
        assert requests.get("head_object", 0) >= 1
        cache.wait_for_fills(60)
        with cache.open(source, fs=fs) as f:  # and the entry holds the new object
            assert f.read() == _table_bytes(9)
            assert f.diagnostics.cache_status is CacheStatus.HIT


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_a_planned_miss_of_a_deleted_object_raises_file_not_found(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, policy: str
) -> None:
    import boto3

    with make_cache(tmp_path / "c", policy=policy) as cache:
        source, fs, key = _forgotten_entry(cache, s3_endpoint, plain_bucket)
        boto3.client("s3", endpoint_url=s3_endpoint).delete_object(Bucket=plain_bucket, Key=key)
        with pytest.raises(FileNotFoundError):
            cache.read(source, fs=fs)
        cache.wait_for_fills(60)
        assert cache.stats()["entries"] == 0
        assert cache.events.events(EventKind.STALE_PLAN)  # found gone at the pinned GET
        # no fill of the gone object failed as an I/O error (a read_through
        # read's after-read fill is not even attempted)
        failed = cache.events.events(EventKind.FILL_FAILED)
        assert [e.reason for e in failed] == ([] if policy == "read_through" else ["stale"])


def test_a_cold_dataset_read_proves_every_file_by_its_listing(
    tmp_path: Path, s3_endpoint: str, plain_bucket: str, requests: _Sent
) -> None:
    import pyarrow.parquet as pq

    keys = _dataset(s3_endpoint, plain_bucket, 4, value=3)
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        nfs = NexusCacheFileSystem(fs=make_s3fs(s3_endpoint), cache=cache)
        requests.clear()
        table = pq.read_table(f"{plain_bucket}/t/", filesystem=nfs)
        assert table.num_rows == 4 * 2000
    # the listing's ETags plan the misses and pin each fill's GET: no file is
    # HEADed (pyarrow's own probes of the prefix "t" are not ours), one GET each
    assert set(requests.objects.get("head_object", [])).isdisjoint(keys)
    assert sorted(requests.objects["get_object"]) == sorted(keys)
