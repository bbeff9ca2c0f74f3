"""Helpers shared by the lakehouse tests (importable by spawned processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def make_s3fs(endpoint: str, **kwargs: Any) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True, **kwargs
    )


def put_object(endpoint: str, bucket: str, key: str, data: bytes) -> dict[str, Any]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    return dict(client.put_object(Bucket=bucket, Key=key, Body=data))


def write_old_file(path: Path, data: bytes, age_s: float = 60.0) -> Path:
    """Write ``data`` and backdate its mtime so its local identity is trusted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path
