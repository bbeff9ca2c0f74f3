"""Fixtures of the lakehouse tests: buckets and s3fs on the moto endpoint
(``s3_endpoint``, in the top-level conftest)."""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

import pytest

from . import _helpers
from ._helpers import make_s3fs

# test_lakehouse_device.py leaves with the device read; until then it imports the
# helpers by their former top-level name.
sys.modules.setdefault("lakehouse_helpers", _helpers)

_bucket_ids = itertools.count()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh versioned bucket."""
    import boto3

    name = f"lake-{os.getpid()}-{next(_bucket_ids)}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=name)
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    """An s3fs filesystem on the moto endpoint."""
    return make_s3fs(s3_endpoint)
