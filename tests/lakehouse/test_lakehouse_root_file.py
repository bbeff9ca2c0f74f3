"""A cache root replaced by a regular file while a process uses it: every read
goes to its source (as when the root is removed), the diagnostics, the events
and one warning in the log say why, and the cache works again once the file
is gone."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.lakehouse import CacheStatus, EventKind, ReadMode

from ._helpers import make_cache, write_old_file

_WARNING = "is not a directory (a file is in its place)"


def _parquet(path: Path, n: int) -> pa.Table:
    table = pa.table({"id": pa.array(range(n), pa.int64()), "v": [i % 7 for i in range(n)]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    write_old_file(path, sink.getvalue())
    return table


def _replace_by_file(root: Path) -> None:
    shutil.rmtree(root)
    root.write_bytes(b"not a cache root\n")


@pytest.mark.parametrize("policy", ["fill_before_read", "read_through"])
def test_pandas_reads_the_source_while_the_root_is_a_file(
    tmp_path: Path, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    import pandas as pd

    tables = {
        name: _parquet(tmp_path / "lake" / f"{name}.parquet", n)
        for name, n in (("a", 3000), ("b", 4000), ("c", 5000))
    }
    root = tmp_path / "cache"
    caplog.set_level(logging.WARNING, logger="nexus_cache.lakehouse")
    with make_cache(root, policy=policy) as cache:
        opts = {"nexus": {"cache": cache}}

        def read(name: str) -> pd.DataFrame:
            url = f"nexus::file://{tmp_path / 'lake' / name}.parquet"
            return pd.read_parquet(url, storage_options=opts)

        assert read("a").equals(tables["a"].to_pandas())
        assert cache.wait_for_fills(30)
        _replace_by_file(root)
        before = len(cache.events.reads())
        # uncached sources, twice each: never "Not a directory"
        for name in ("b", "c", "b"):
            assert read(name).equals(tables[name].to_pandas())
        assert cache.wait_for_fills(30)
        reads = cache.events.reads()[before:]
        assert len(reads) >= 3  # pandas may open a file more than once
        assert all(d.read_mode is ReadMode.REMOTE for d in reads)
        if policy == "fill_before_read":
            assert {d.reason for d in reads} == {"fill_failed:root_not_a_directory"}
        unavailable = cache.events.events(EventKind.ROOT_UNAVAILABLE)
        assert unavailable
        assert {e.reason for e in unavailable} == {"not_a_directory"}
        assert root.read_bytes() == b"not a cache root\n"  # left alone
        warnings = [r for r in caplog.records if _WARNING in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert str(root) in warnings[0].getMessage()
        # the file removed: the next fill makes the root again (as after a
        # removal: that read goes remote), the one after fills, then a hit
        root.unlink()
        for _ in range(3):
            assert read("b").equals(tables["b"].to_pandas())
            assert cache.wait_for_fills(30)
        assert cache.events.reads()[-1].cache_status is CacheStatus.HIT
        assert [e.reason for e in cache.events.events(EventKind.ROOT_UNAVAILABLE)][-1] == (
            "removed"
        )
        assert (root / "layout.json").is_file()


def test_a_service_scan_reads_the_source_while_the_root_is_a_file(tmp_path: Path) -> None:
    from tests.service._helpers import make_lake, make_service

    lake = make_lake(tmp_path)
    with make_service(tmp_path) as service:
        service.execute({"type": "count", "source": lake.facts})
        _replace_by_file(tmp_path / "cache")
        result = service.execute({"type": "scan", "source": lake.edges})
        assert result.table.equals(pq.read_table(lake.edges))
        lakehouse = result.diagnostics.lakehouse
        assert lakehouse["read_mode"] == "remote"
        assert lakehouse["reason"] == "fill_failed:root_not_a_directory"
