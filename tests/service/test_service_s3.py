"""A directory of Parquet objects on S3 (moto server on loopback, through s3fs)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nexus_cache.service import Count, GraphQuery, Scan
from nexus_cache.service.datagen import fact_table, rmat_edges

from ._helpers import make_service

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def endpoint(s3_endpoint: str) -> str:
    return s3_endpoint


def _put(endpoint: str, bucket: str, key: str, table) -> None:  # type: ignore[no-untyped-def]
    import boto3

    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=max(1, table.num_rows // 4))
    boto3.client("s3", endpoint_url=endpoint).put_object(
        Bucket=bucket, Key=key, Body=sink.getvalue()
    )


def test_scan_count_and_graph_of_an_s3_directory(tmp_path: Path, endpoint: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="lake")
    _put(endpoint, "lake", "facts/part-0.parquet", fact_table(1000))
    _put(endpoint, "lake", "facts/part-1.parquet", fact_table(500, seed=5))
    edges = rmat_edges(7)
    _put(endpoint, "lake", "edges/part-0.parquet", edges)
    options = {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}
    with make_service(tmp_path, storage_options=options) as service:
        cold = service.execute(Scan("s3://lake/facts/", columns=("order_id", "region")))
        warm = service.execute(Scan("s3://lake/facts/", columns=("order_id", "region")))
        count = service.execute(Count("s3://lake/facts"))
        ranks = service.execute(GraphQuery(Scan("s3://lake/edges"), "src", "dst", "pagerank"))
    assert cold.table.num_rows == 1500
    assert cold.table.equals(warm.table)
    assert cold.diagnostics.lakehouse["objects"] == 2
    assert cold.diagnostics.lakehouse["status"] == "miss"
    assert cold.diagnostics.source_cache["status"] == "miss-led"
    assert warm.diagnostics.source_cache["status"] == "hit"
    assert warm.diagnostics.lakehouse["read"] is False
    assert count.table["rows"].to_pylist() == [1500]
    assert count.diagnostics.lakehouse["status"] == "hit"  # the footers come from the cache
    assert ranks.diagnostics.graph_cache["status"] == "miss"
    assert abs(sum(ranks.table["pagerank"].to_pylist()) - 1.0) < 1e-6


def test_without_a_lakehouse_root_s3_objects_hit_the_device_caches(
    tmp_path: Path, endpoint: str
) -> None:
    """ETag and size prove an S3 object's identity with no root; an overwrite
    (a new ETag) is a miss."""
    import boto3

    from nexus_cache.lakehouse import LakehouseCacheConfig

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="noroot")
    _put(endpoint, "noroot", "facts/part-0.parquet", fact_table(800))
    options = {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}
    scan = Scan("s3://noroot/facts/", columns=("order_id",))
    with make_service(
        tmp_path, storage_options=options, lakehouse=LakehouseCacheConfig()
    ) as service:
        cold, warm = service.execute(scan), service.execute(scan)
        _put(endpoint, "noroot", "facts/part-0.parquet", fact_table(300, seed=2))
        rewritten = service.execute(scan)
    assert cold.diagnostics.lakehouse["reason"] == "no_root"
    assert cold.diagnostics.source_cache["status"] == "miss-led"
    assert warm.diagnostics.source_cache["status"] == "hit"
    assert warm.table.equals(cold.table)
    assert rewritten.diagnostics.source_cache["status"] == "miss-led"
    assert rewritten.table.num_rows == 300
