"""Fixtures of the lakehouse tests: a real S3 API on loopback (moto server mode)."""

from __future__ import annotations

import itertools
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from . import _helpers
from ._helpers import make_s3fs

# test_lakehouse_device.py leaves with the device read; until then it imports the
# helpers by their former top-level name.
sys.modules.setdefault("lakehouse_helpers", _helpers)

_DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_bucket_ids = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Endpoint URL of a moto S3 server for the whole session (dummy credentials)."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in _DUMMY_AWS}
    os.environ.update(_DUMMY_AWS)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
