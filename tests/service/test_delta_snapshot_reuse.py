"""A Delta snapshot reused across queries (and across services of one process) is
still checked against each service's ``allowed_roots``, and a commit between two
queries is read by the second."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tests.service._helpers import age_files, make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.errors import ConfigError
from nexus_cache.service import Scan
from nexus_cache.tables._delta_snapshots import DELTA_SNAPSHOTS

deltalake = pytest.importorskip("deltalake")


def _edges(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "dst": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array(rng.random(n)),
        }
    )


def test_a_cached_snapshot_is_still_checked_against_allowed_roots(tmp_path: Path) -> None:
    table = tmp_path / "lake" / "t"
    deltalake.write_deltalake(str(table), _edges(50, 1))
    outside = tmp_path / "outside"
    outside.mkdir()
    (data,) = table.glob("*.parquet")
    os.replace(data, outside / "secret.parquet")
    os.symlink(outside / "secret.parquet", data)
    age_files(tmp_path)
    DELTA_SNAPSHOTS.clear()
    with make_service(tmp_path / "open") as service:  # no roots: read, and its snapshot kept
        assert service.execute(Scan(str(table))).table.num_rows == 50
        assert service.execute(Scan(str(table))).table.num_rows == 50
    assert DELTA_SNAPSHOTS.hits >= 1
    hits = DELTA_SNAPSHOTS.hits
    with (
        make_service(tmp_path / "closed", allowed_roots=[str(tmp_path / "lake")]) as service,
        pytest.raises(ConfigError, match="outside allowed_roots"),
    ):
        service.execute(Scan(str(table), filter=[("w", "<", 0.5)]))
    assert DELTA_SNAPSHOTS.hits == hits + 1  # the reused snapshot was refused


def test_a_commit_between_two_queries_is_read_by_the_second(tmp_path: Path) -> None:
    table = tmp_path / "lake" / "t"
    deltalake.write_deltalake(str(table), _edges(40, 1))
    age_files(tmp_path)
    flt = [("w", "<", 0.5)]
    with make_service(tmp_path / "svc") as service:
        first = service.execute(Scan(str(table), filter=flt))
        assert first.diagnostics.table["version"] == 0
        deltalake.write_deltalake(str(table), _edges(30, 2), mode="overwrite")
        second = service.execute(Scan(str(table), filter=flt))
    assert second.diagnostics.table["version"] == 1
    want = deltalake.DeltaTable(str(table)).to_pyarrow_table()
    want = want.filter(pa.compute.less(want["w"], 0.5))
    assert_same_rows(second.table, want.select(second.table.column_names))
