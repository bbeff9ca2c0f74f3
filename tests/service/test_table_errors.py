"""What a query of a damaged or misnamed table says: the table, the version, what to do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from tests.service._helpers import age_files, make_service

from nexus_cache.errors import ConfigError
from nexus_cache.service import Count, Scan
from nexus_cache.tables import read_table, resolve_table


def test_a_delta_data_file_removed_from_under_its_log_names_the_table_and_version(
    tmp_path: Path,
) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), pa.table({"id": [1, 2]}))
    deltalake.write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    age_files(tmp_path / "lake")
    added = deltalake.DeltaTable(str(table)).file_uris()
    removed = Path(sorted(added)[0].removeprefix("file://"))
    removed.unlink()
    words = rf"{removed.name}.*table '{table}', version 1\) does not exist; the snapshot may"
    queries = [
        Scan(str(table), ["id"]),
        Scan(str(table), ["id"], filter=[("id", ">", 0)]),
        Count(str(table), filter=[("id", ">", 0)]),
    ]
    with make_service(tmp_path / "svc") as service:
        for query in queries:
            with pytest.raises(FileNotFoundError, match=words):
                service.execute(query)
    with pytest.raises(FileNotFoundError, match=words):
        read_table(resolve_table(str(table)), ["id"])


@pytest.mark.parametrize("as_of", [10**12, 1 << 63, 1 << 70])
def test_a_delta_version_beyond_the_latest_is_refused_at_once(tmp_path: Path, as_of: int) -> None:
    """deltalake walks every version up to the one asked for (a second per ten
    million): a version far beyond the latest is refused from the log's listing,
    at once, naming the latest, never left to spin, nor blamed on the log."""
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), pa.table({"id": [1, 2]}))
    deltalake.write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    age_files(tmp_path / "lake")
    env = {
        **os.environ,
        "NEXUS_DEVICE_BACKEND": "host",
        "NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "cache"),
        "NEXUS_HOST_DEVICE_TOTAL_BYTES": str(1 << 30),
    }
    command = [sys.executable, "-m", "nexus_cache.cli.main", "scan", str(table)]
    run = subprocess.run(
        [*command, "--as-of", str(as_of)], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2, run.stderr
    assert f"as_of={as_of}" in run.stderr
    assert "name an existing version" in run.stderr
    assert "log cannot be read" not in run.stderr
    if as_of < 1 << 63:
        assert "its latest is 1" in run.stderr
    with make_service(tmp_path / "svc") as service:
        with pytest.raises(ConfigError, match=rf"as_of={as_of}: .*name an existing version"):
            service.execute(Scan(str(table), ["id"], as_of=as_of))
        assert service.execute(Scan(str(table), ["id"], as_of=1)).table.num_rows == 3


def test_a_delta_version_beyond_the_latest_is_refused_at_once_where_the_log_listing_is_not_trusted(
    tmp_path: Path,
) -> None:
    """A log the listing cannot vouch for (a ``_commits`` directory: commits not in
    the log yet) is read by deltalake alone: there too a version beyond the latest is
    refused at once, naming the latest, and an existing one reads as deltalake does."""
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), pa.table({"id": [1, 2]}))
    deltalake.write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    (table / "_delta_log" / "_commits").mkdir()
    age_files(tmp_path / "lake")
    with make_service(tmp_path / "svc") as service:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"as_of=1000000000: .*its latest is 1"):
            service.execute(Scan(str(table), ["id"], as_of=10**9))
        assert time.monotonic() - started < 20  # deltalake's own walk took about a minute
        for version in (0, 1):
            got = service.execute(Scan(str(table), ["id"], as_of=version)).table
            want = deltalake.DeltaTable(str(table), version=version).to_pyarrow_table()
            assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())
