"""A frames user's mistakes get named errors: not Parquet, columns as one string."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.backends import HostBackend
from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.frames import decode_parquet


def _domain():  # type: ignore[no-untyped-def]
    return HostBackend(device_total_bytes=64 << 20).create_domain(0)


def test_not_parquet_is_a_source_format_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.parquet"
    path.write_text("these are notes, not Parquet")
    with pytest.raises(SourceFormatError, match=r"notes\.parquet.*not readable Parquet"):
        decode_parquet(str(path), domain=_domain())
    with open(path, "rb") as handle, pytest.raises(SourceFormatError, match=r"notes\.parquet"):
        decode_parquet(handle, domain=_domain())


def test_columns_as_one_string_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    # with columns 'i' and 'd' present, "id" must still not mean ['i', 'd']
    pq.write_table(pa.table({"i": [1], "d": [2], "id": [3]}), path)
    with pytest.raises(ConfigError, match="use a list of names"):
        decode_parquet(str(path), domain=_domain(), columns="id")
    frame = decode_parquet(str(path), domain=_domain(), columns=["id"])
    assert frame.to_arrow().column_names == ["id"]
