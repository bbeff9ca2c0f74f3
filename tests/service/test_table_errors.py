"""What a query of a damaged or misnamed table says: the table, the version, what to do."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from tests.service._helpers import age_files, make_service

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
