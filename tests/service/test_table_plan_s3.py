"""Tables on S3 (a moto server on loopback): the plan takes identities from the
snapshot, with no HEAD per data file, and the service's reads equal the local
reference."""

from __future__ import annotations

import io
import logging
import pathlib
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.errors import StalePlanError
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.service import Scan
from nexus_cache.service._table_scan import plan_table

pytest.importorskip("s3fs")
pytest.importorskip("moto")


class _Requests(logging.Handler):
    """The moto server's request log: one line per HTTP request it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.lines.append(record.getMessage())

    def heads(self, prefix: str) -> int:
        with self._lock:
            return sum(f'"HEAD /{prefix}' in line for line in self.lines)

    def clear(self) -> None:
        with self._lock:
            self.lines.clear()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Requests]:
    """The moto endpoint for s3fs and deltalake alike (their environment variables),
    and its request log."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    requests = _Requests()
    logger = logging.getLogger("werkzeug")
    logger.addHandler(requests)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield requests
    finally:
        logger.removeHandler(requests)
        logger.setLevel(old_level)
        s3fs.S3FileSystem.clear_instance_cache()


def _edges(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "dst": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array(rng.random(n)),
        }
    )


def _upload(endpoint_bucket: str, local: Path, prefix: str) -> None:
    import boto3

    client = boto3.client("s3")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), endpoint_bucket, f"{prefix}/{path.relative_to(local)}")


def _bucket(name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return name


def _delta(tmp_path: Path, files: int) -> Path:
    deltalake = pytest.importorskip("deltalake")
    local = tmp_path / "delta"
    for i in range(files):
        deltalake.write_deltalake(str(local), _edges(40, i), mode="append")
    return local


def _cache(tmp_path: Path) -> LakehouseCache:
    return LakehouseCache(
        LakehouseCacheConfig(root=tmp_path / "cache", policy="fill_before_read", max_bytes="1GiB")
    )


def test_a_delta_plan_sends_no_head_per_data_file_and_a_truncated_file_is_stale(
    tmp_path: Path, s3: _Requests
) -> None:
    bucket = _bucket("plan-delta")
    local = _delta(tmp_path, 20)
    _upload(bucket, local, "t")
    scan = Scan(f"s3://{bucket}/t", columns=("src", "dst"), filter=[("w", ">=", 0.0)])
    with _cache(tmp_path) as cache:
        s3.clear()
        plan = plan_table(cache, scan)
        assert len(plan.plans) == 20
        assert s3.heads(f"{bucket}/t/part-") == 0  # the snapshot gave every identity
        assert all(p.key is not None for p in plan.plans)
        assert [p.size for p in plan.plans] == [f.size for f in plan.table.files]
        # one data file truncated after planning: its plan is refused as stale
        first = plan.plans[0]
        name = pathlib.PurePosixPath(first.path).name
        import boto3

        body = (local / name).read_bytes()
        boto3.client("s3").put_object(Bucket=bucket, Key=f"t/{name}", Body=body[:-100])
        with pytest.raises(StalePlanError, match="changed since it was planned"):
            cache.execute(first)
        with cache.execute(plan.plans[1]) as handle:  # an intact file reads
            assert pq.ParquetFile(io.BytesIO(handle.read())).metadata.num_rows == 40


def test_an_s3_delta_table_read_by_the_service_equals_deltalake(
    tmp_path: Path, s3: _Requests
) -> None:
    deltalake = pytest.importorskip("deltalake")
    bucket = _bucket("svc-delta")
    local = _delta(tmp_path, 3)
    _upload(bucket, local, "t")
    want = deltalake.DeltaTable(str(local)).to_pyarrow_table()
    scan = Scan(f"s3://{bucket}/t", filter=[("w", "<", 0.5)])
    with make_service(tmp_path / "svc") as service:
        cold = service.execute(scan)
        warm = service.execute(scan)
    expect = want.filter(pa.compute.less(want["w"], 0.5))
    assert_same_rows(cold.table, expect)
    assert_same_rows(warm.table, expect)
    assert warm.diagnostics.source_cache["status"] == "hit"


def test_an_s3_hive_table_read_by_the_service_equals_pyarrow_dataset(
    tmp_path: Path, s3: _Requests
) -> None:
    bucket = _bucket("svc-hive")
    local = tmp_path / "hive"
    for year in (2024, 2025):
        (local / f"year={year}").mkdir(parents=True)
        pq.write_table(_edges(60, year), local / f"year={year}" / "part-0.parquet")
    _upload(bucket, local, "edges")
    flt = [("year", "=", 2025), ("w", ">", 0.25)]
    want = ds.dataset(str(local), format="parquet", partitioning="hive").to_table(
        filter=pq.filters_to_expression(flt)
    )
    with make_service(tmp_path / "svc") as service:
        s3.clear()
        got = service.execute(Scan(f"s3://{bucket}/edges", filter=flt))
    assert_same_rows(got.table, want)
    # the listing's ETags and sizes are the identities: no HEAD per object
    assert s3.heads(f"{bucket}/edges/year=") == 0


def test_an_s3_delta_commit_after_a_cached_snapshot_is_seen(tmp_path: Path, s3: _Requests) -> None:
    """The snapshot of an unchanged S3 table is reused (one listing of its log, no
    log load); a commit uploaded after it is seen by the next read, though fsspec
    caches listings."""
    deltalake = pytest.importorskip("deltalake")
    from nexus_cache.tables import read_table, resolve_table
    from nexus_cache.tables._delta_snapshots import DELTA_SNAPSHOTS

    bucket = _bucket("cached-delta")
    local = _delta(tmp_path, 2)
    _upload(bucket, local, "t")
    source = f"s3://{bucket}/t"
    first = resolve_table(source)
    hits = DELTA_SNAPSHOTS.hits
    again = resolve_table(source)
    assert DELTA_SNAPSHOTS.hits == hits + 1
    assert again.files is first.files
    assert again.version == 1
    deltalake.write_deltalake(str(local), _edges(25, 9), mode="append")
    _upload(bucket, local, "t")  # the new data file and commit (the others again, unchanged)
    newer = resolve_table(source)
    assert newer.version == 2
    want = deltalake.DeltaTable(str(local)).to_pyarrow_table()
    assert_same_rows(read_table(newer), want.select(newer.schema.names))
