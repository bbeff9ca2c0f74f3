"""A FIFO (or another non-regular file) named ``*.parquet`` is refused, never opened:
opening a FIFO waits for a writer forever."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.cli.main import main
from nexus_cache.errors import SourceFormatError
from nexus_cache.service import Count, QueryService, Scan, ServiceConfig

pytestmark = pytest.mark.timeout(15)


@pytest.fixture
def default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default configuration: no NEXUS_* variable (no lakehouse root)."""
    for name in list(os.environ):
        if name.startswith("NEXUS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")


def _service() -> QueryService:
    return QueryService(ServiceConfig.from_env(), backend=HostBackend(device_total_bytes=1 << 30))


@pytest.mark.usefixtures("default_env")
def test_a_fifo_given_directly_is_refused_by_scan_and_count(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    with _service() as service:
        for query in (Scan(str(fifo)), Count(str(fifo))):
            with pytest.raises(SourceFormatError, match="FIFO") as info:
                service.execute(query)
            assert str(fifo) in str(info.value)


@pytest.mark.usefixtures("default_env")
def test_a_fifo_in_a_directory_refuses_the_listing(tmp_path: Path) -> None:
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), table / "part-0.parquet")
    os.mkfifo(table / "part-1.parquet")
    with _service() as service:
        for query in (Scan(str(table)), Count(str(table))):
            with pytest.raises(SourceFormatError, match=r"part-1\.parquet.*FIFO"):
                service.execute(query)


@pytest.mark.usefixtures("default_env")
def test_scan_command_exits_2_naming_the_fifo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    assert main(["scan", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert "FIFO" in err
    assert str(fifo) in err
    assert "Traceback" not in err
