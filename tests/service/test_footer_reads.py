"""A filtered scan of a remote object reads its Parquet footer once.

The footer read to prune row groups by their statistics is the one the decode
uses: it is not fetched from the store again. The store is a real fsspec
filesystem (in memory) that records every read; the decode window is set
below the object's size, so the decode reads the object as a stream, as it
does a large remote object.
"""

from __future__ import annotations

import io
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec import register_implementation
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from tests.service._helpers import make_service

from nexus_cache.service import Scan

ROWS, GROUP = 80_000, 10_000  # 8 row groups of 80 KiB a column; ts rising: a ts window prunes


class _CountingFile(MemoryFile):
    """A memory file that records the byte range of every read."""

    reads: list[tuple[int, int]]

    def read(self, size: int | None = -1) -> bytes:
        start = self.tell()
        data = super().read(size)
        self.reads.append((start, start + len(data)))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _CountingFS(MemoryFileSystem):
    """An in-memory store whose opened files record their reads (one list per path)."""

    protocol = "nexus-counting-test"
    root_marker = "/"
    reads: ClassVar[dict[str, list[tuple[int, int]]]] = {}

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(str(path).removeprefix(f"{cls.protocol}://")))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" not in mode:
            return super()._open(path, mode, **kwargs)
        path = self._strip_protocol(path)
        opened = _CountingFile(self, path, self.store[path].getvalue())
        opened.reads = self.reads.setdefault(path, [])
        return opened


register_implementation(_CountingFS.protocol, _CountingFS, clobber=True)


@pytest.fixture
def remote_table() -> Iterator[tuple[str, str]]:
    """``(source URL, object path)``: a Hive table of one partition in the counting store."""
    fs = _CountingFS()
    base = f"/t-{uuid.uuid4().hex}"
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "src": pa.array(rng.integers(0, 30, ROWS), pa.int64()),
            "ts": pa.array(np.arange(ROWS), pa.int64()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=GROUP)
    path = f"{base}/day=0/part-0.parquet"
    fs.pipe(path, sink.getvalue())
    try:
        yield f"{_CountingFS.protocol}://{base}", path
    finally:
        fs.rm(base, recursive=True)
        _CountingFS.reads.pop(path, None)


def test_a_cold_filtered_read_of_a_remote_object_reads_its_footer_once(
    remote_table: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, path = remote_table
    monkeypatch.setenv("NEXUS_DECODE_WINDOW_BYTES", "1KiB")  # the object is a stream
    size = _CountingFS().size(path)
    flt = [("day", "=", 0), ("ts", ">=", 20_000), ("ts", "<", 40_000)]
    query = Scan(source, ["src", "ts"], filter=flt)
    reads = _CountingFS.reads.setdefault(path, [])
    with make_service(tmp_path) as service:
        service.plan(query)  # what planning reads (the table's schema) is not the decode's
        planned = len(_tail_reads(reads, size))
        result = service.execute(query)
    assert sorted(result.table["ts"].to_pylist()) == list(range(20_000, 40_000))
    assert result.diagnostics.table["entries"][0]["row_groups"] == [2, 3]
    assert result.diagnostics.source_cache["status"] == "bypass"  # no proven identity: no cache
    # execute plans again, then prunes with the footer and decodes with the same one
    assert len(_tail_reads(reads, size)) == 2 * planned + 1, reads


def _tail_reads(reads: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The reads that reach the object's end, where its footer is."""
    return [r for r in reads if r[1] == size]


def _local_table(root: Path) -> None:
    """One partition of ``ROWS`` rows under ``root``, old enough for the lakehouse to
    prove its identity."""
    part = root / "day=0"
    part.mkdir(parents=True)
    table = pa.table({"src": np.arange(ROWS) % 30, "ts": np.arange(ROWS)})
    pq.write_table(table, part / "part-0.parquet", row_group_size=GROUP)
    past = time.time() - 60
    os.utime(part / "part-0.parquet", (past, past))


def _lakehouse_readers(monkeypatch: pytest.MonkeyPatch, *, parsing: bool) -> list[object]:
    """The lakehouse files an Arrow ``ParquetFile`` is opened over from now on (with
    ``parsing``: only those opened without a known footer, which parse it)."""
    from nexus_cache.lakehouse import LakehouseFile

    opened: list[object] = []
    original = pq.ParquetFile

    class _Spy(original):  # type: ignore[misc, valid-type]
        def __init__(self, source: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(source, LakehouseFile) and not (
                parsing and kwargs.get("metadata") is not None
            ):
                opened.append(source)
            super().__init__(source, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", _Spy)
    return opened


def test_a_footer_known_for_the_object_is_not_parsed_again_by_the_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold filtered read of a local object whose footer an earlier query parsed
    (same proven identity) prunes with that footer and decodes with it: no parse of
    the object's footer through the lakehouse file."""
    _local_table(tmp_path / "t")
    query = Scan(str(tmp_path / "t"), ["src", "ts"], filter=[("ts", "<", 15_000)])
    with make_service(tmp_path / "a") as service:
        first = service.execute(query)
    parses = _lakehouse_readers(monkeypatch, parsing=True)
    with make_service(tmp_path / "b") as service:  # an empty source cache: a cold decode
        second = service.execute(query)
    assert second.diagnostics.source_cache["status"] == "miss-led"
    assert second.diagnostics.table["entries"][0]["row_groups"] == [0, 1]
    assert second.table.equals(first.table)
    assert sorted(second.table["ts"].to_pylist()) == list(range(15_000))
    assert parses == []


def test_a_decode_with_a_known_footer_opens_no_reader_over_the_lakehouse_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold filtered read of a local object whose footer is known takes the object's
    Arrow schema from that footer and reads its bytes through the entry's memory map:
    no Arrow reader over the Python file object, with or without the footer."""
    _local_table(tmp_path / "t")
    query = Scan(str(tmp_path / "t"), ["ts"], filter=[("ts", ">=", 65_000)])
    with make_service(tmp_path / "a") as service:
        first = service.execute(query)
    readers = _lakehouse_readers(monkeypatch, parsing=False)
    with make_service(tmp_path / "b") as service:  # an empty source cache: a cold decode
        second = service.execute(query)
    assert second.diagnostics.source_cache["status"] == "miss-led"
    assert second.diagnostics.table["entries"][0]["row_groups"] == [6, 7]
    assert second.table.equals(first.table)
    assert second.table["ts"].to_pylist() == list(range(65_000, ROWS))
    assert readers == []


def test_a_footers_arrow_schema_is_the_one_its_reader_gives(tmp_path: Path) -> None:
    """The schema a decode with a known footer picks its columns from (the footer's,
    no reader opened) is the schema an Arrow reader of the file gives: types, time
    zones, dictionary columns, nesting and metadata alike."""
    import datetime
    import decimal

    table = pa.table(
        {
            "i8": pa.array([1, None, 3], pa.int8()),
            "u64": pa.array([1, 2, 3], pa.uint64()),
            "f16": pa.array(np.array([1, 2, 3], np.float16)),
            "ts": pa.array([1, 2, 3], pa.timestamp("ms", tz="Europe/Paris")),
            "ns": pa.array([1, 2, 3], pa.timestamp("ns")),
            "day": pa.array([datetime.date(2026, 12, d) for d in (1, 2, 3)]),
            "dec": pa.array([decimal.Decimal("1.25")] * 3, pa.decimal128(9, 2)),
            "s": pa.array(["a", None, "c"], pa.large_string()),
            "cat": pa.array(["x", "y", "x"]).dictionary_encode(),
            "l": pa.array([[1], [], None], pa.list_(pa.int32())),
            "st": pa.array([{"a": 1}, {"a": 2}, None]),
        }
    ).replace_schema_metadata({"owner": "tests"})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    footer = pq.ParquetFile(path).metadata
    assert footer.schema.to_arrow_schema().equals(
        pq.ParquetFile(path, metadata=footer).schema_arrow, check_metadata=True
    )
