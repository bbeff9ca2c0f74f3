"""A Hive partition directory whose %-escapes do not decode to UTF-8 is refused by name,
as ``pyarrow.dataset`` refuses it, rather than read as a replacement character."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service

from nexus_cache.errors import SourceFormatError
from nexus_cache.service import Count, Scan
from nexus_cache.tables import read_table, resolve_table


def test_two_undecodable_partition_values_are_refused_not_read_as_one(tmp_path: Path) -> None:
    root = tmp_path / "lake" / "t"
    for i, segment in enumerate(["k=ok", "k=%E9", "k=%E8"]):
        (root / segment).mkdir(parents=True)
        pq.write_table(pa.table({"x": [i]}), root / segment / "f.parquet")
    age_files(tmp_path / "lake")
    with pytest.raises(pa.ArrowInvalid, match="not valid UTF-8"):
        ds.dataset(root, partitioning="hive").to_table()
    words = rf"partition directory '{root}/k=%E[89]' is not UTF-8 text.*rename it"
    with pytest.raises(SourceFormatError, match=words):
        read_table(resolve_table(str(root)))
    with make_service(tmp_path / "svc") as service:
        queries = [
            Scan(str(root), ["x", "k"]),
            Scan(str(root), ["x"], filter=[("k", "=", "ok")]),  # the pruned listing
            Count(str(root), filter=[("k", "in", ["ok"])]),
        ]
        for query in queries:
            with pytest.raises(SourceFormatError, match=words):
                service.execute(query)
