"""A Parquet file served over plain HTTP (fsspec's ``http`` filesystem) reads
through the lakehouse and the service: its identity lookup must not pass
keywords the HTTP client does not take."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import QueryService, Scan, ServiceConfig


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, pa.Table]]:
    """A directory served by ``python -m http.server`` on loopback (a real
    process), holding one Parquet file; yields its URL and table."""
    table = pa.table({"a": list(range(100)), "s": [f"v{i}" for i in range(100)]})
    pq.write_table(table, tmp_path / "t.parquet")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        port = re.search(r"port (\d+)", line)
        assert port, line
        yield f"http://127.0.0.1:{port.group(1)}/t.parquet", table
    finally:
        proc.kill()
        proc.wait(30)


def test_a_parquet_file_over_http_scans_like_pyarrow(
    served: tuple[str, pa.Table], tmp_path: Path
) -> None:
    url, table = served
    config = ServiceConfig(backend="host", lakehouse=LakehouseCacheConfig(root=tmp_path / "cache"))
    with QueryService(config) as service:
        for _ in range(2):  # the second read asks the server about the file again
            result = service.execute(Scan(url))
            assert result.table.equals(table)
            # http.server sends no ETag: the read bypasses the cache and says why
            assert result.diagnostics.lakehouse["reason"] == "no_content_identity"


def test_a_missing_file_over_http_is_named(served: tuple[str, pa.Table], tmp_path: Path) -> None:
    url, _ = served
    config = ServiceConfig(backend="host", lakehouse=LakehouseCacheConfig(root=tmp_path / "cache"))
    missing = url.replace("t.parquet", "absent.parquet")
    with (
        QueryService(config) as service,
        pytest.raises(FileNotFoundError, match=r"absent\.parquet"),
    ):
        service.execute(Scan(missing))
