"""A frames user's mistakes get named errors: not Parquet, columns as one string."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("row_groups", [[0.7], [1.0], ["1"], "10", [True], [None], 1, b"\x01"])
def test_row_groups_that_are_not_indices_are_refused(tmp_path: Path, row_groups: object) -> None:
    """A float, a string, a bool or a lone number is no row group index: it must not
    read some row group ([0.7] was row group 0, "10" row groups 1 and 0)."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": list(range(6))}), path, row_group_size=2)
    domain = _domain()
    with pytest.raises(ConfigError, match="row_groups") as caught:
        decode_parquet(str(path), domain=domain, row_groups=row_groups)  # type: ignore[arg-type]
    assert "the file has 3" in str(caught.value)
    assert domain.counters().used_bytes == 0
    frame = decode_parquet(str(path), domain=domain, row_groups=(2, np.int64(0)))
    assert frame.to_arrow().column("a").to_pylist() == [4, 5, 0, 1]


def test_read_dictionary_names_that_are_no_column_are_refused(tmp_path: Path) -> None:
    """An unknown read_dictionary name raised a bare ``KeyError: b'nope'``, and one
    string was read as its characters ("ab" as ['a', 'b'])."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": ["x", "y"], "b": ["z", "z"], "ab": ["u", "v"]}), path)
    domain = _domain()
    with pytest.raises(ConfigError, match=r"read_dictionary.*'nope'.*t\.parquet"):
        decode_parquet(str(path), domain=domain, read_dictionary=["a", "nope"])
    with pytest.raises(ConfigError, match="use a list of names"):
        decode_parquet(str(path), domain=domain, read_dictionary="ab")
    assert domain.counters().used_bytes == 0
    frame = decode_parquet(str(path), domain=domain, read_dictionary=["ab"])
    assert [pa.types.is_dictionary(f.type) for f in frame.schema] == [False, False, True]
