"""Partition columns of a table read hold their partition's value on every row.

A number partition value is filled in place in the attempt's domain; a string
one (or a null) goes through Arrow. The reference is ``pyarrow.dataset``,
rows compared without order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from tests.service._helpers import age_files, make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.service import Scan


def test_number_and_string_partition_columns_match_pyarrow_dataset(tmp_path: Path) -> None:
    root = tmp_path / "t"
    rng = np.random.default_rng(3)
    for day in (-7, 0, 2_000_000_000):
        for region in ("eu", "us"):
            part = root / f"day={day}" / f"region={region}"
            part.mkdir(parents=True)
            table = pa.table({"v": pa.array(rng.random(300)), "k": pa.array(np.arange(300))})
            pq.write_table(table, part / "part-0.parquet", row_group_size=100)
    age_files(root)
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    flt = [("k", ">=", 150), ("day", "!=", 0)]
    columns = ["day", "region", "v", "k"]
    want = dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)
    with make_service(tmp_path) as service:
        got = service.execute(Scan(str(root), columns, filter=flt))
        whole = service.execute(Scan(str(root), columns))
    assert want.num_rows == 4 * 150
    assert got.table.schema.field("day").type == want.schema.field("day").type
    assert_same_rows(got.table, want)
    assert_same_rows(whole.table, dataset.to_table(columns=columns))
