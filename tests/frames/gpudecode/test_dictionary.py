"""Columns read as dictionaries of strings or binaries, decoded by the page
decoder: the chunk's dictionary page becomes the column's dictionary and its
indices are kept. On the emulated device (``_emulator``) through the GPU
engine's plan and assembly, and by the NumPy reference; equal to PyArrow's
decode and to the host engine's frame. (On a GPU: tests/gpu.)"""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames._tables import assert_same_table
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import check_file, device_piece

from nexus_cache.backends import HostBackend
from nexus_cache.errors import SourceFormatError
from nexus_cache.frames import decode_parquet
from nexus_cache.frames._host import arrow_array
from nexus_cache.frames.column import DeviceColumn
from nexus_cache.frames.gpudecode import ChunkSpec, Page, chunk_spec, decode_chunk, read_pages

_engine = importlib.import_module("nexus_cache.frames._page_engine")
_device = importlib.import_module("nexus_cache.frames.gpudecode.device")

#: (PyArrow reads a dictionary of large strings or binaries back as one of
#: strings or binaries)
VALUE_TYPES = [pa.string(), pa.binary()]


def _words(k: int, value_type: pa.DataType, tag: str = "w") -> pa.Array:
    values = [f"{tag}{i}-{'x' * (i % 5)}" for i in range(k)]
    if pa.types.is_binary(value_type):
        return pa.array([v.encode() for v in values], value_type)
    return pa.array(values, value_type)


def _group(n: int, words: pa.Array, seed: int, nulls: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed)
    mask = (rng.random(n) < 0.2) if nulls else None
    indices = pa.array(rng.integers(0, len(words), n, dtype=np.int32), mask=mask)
    return pa.table({"c": pa.DictionaryArray.from_arrays(indices, words)})


def write_groups(groups: list[pa.Table], **options: Any) -> bytes:
    """One row group per table (an empty table: an empty row group)."""
    out = io.BytesIO()
    with pq.ParquetWriter(out, groups[0].schema, **options) as writer:
        for table in groups:
            writer.write_table(table)
    return out.getvalue()


def equal_dictionaries(value_type: pa.DataType) -> bytes:
    """Four row groups of one dictionary (the column's type a dictionary), nulls
    in each, two pages a group."""
    words = _words(300, value_type)
    return write_groups([_group(2000, words, seed) for seed in range(4)], data_page_size=4096)


def different_dictionaries(value_type: pa.DataType) -> bytes:
    """Row groups of different dictionaries, an empty row group between them,
    one that repeats the one before it, and one without nulls."""
    a, b = _words(50, value_type, "a"), _words(7, value_type, "b")
    groups = [
        _group(500, a, 1),
        _group(0, a, 2),
        _group(400, b, 3),
        _group(300, b, 4, nulls=False),
        _group(200, a, 5),
    ]
    return write_groups(groups, compression="zstd", data_page_version="2.0")


def plain_file(fallback: bool) -> bytes:
    """A string column (read as a dictionary below): few distinct values, or so
    many that the writer gives up on the dictionary partway through."""
    n = 20000
    values = [f"value-{i if fallback else i % 40}" for i in range(n)]
    table = pa.table({"c": pa.array(values, mask=np.arange(n) % 11 == 0)})
    out = io.BytesIO()
    pq.write_table(
        table,
        out,
        row_group_size=8000,
        dictionary_pagesize_limit=4096,
        data_page_size=4096,
        compression="snappy",
    )
    return out.getvalue()


def _to_arrow(column: DeviceColumn) -> pa.Array:
    dictionary = None if column.dictionary is None else _to_arrow(column.dictionary)

    def host(a: Any) -> Any:
        return None if a is None else np.asarray(a)

    return arrow_array(
        column.type,
        column.length,
        host(column.data),
        host(column.offsets),
        host(column.validity),
        dictionary,
    )


def on_emulated_device(raw: bytes, read_dictionary: list[str] | None = None) -> Any:
    """The GPU engine's plan of ``raw`` and its page columns, decoded on the
    emulated device: (the columns it took as a table, every column's path)."""
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=read_dictionary)
    schema = pf.schema_arrow
    groups = list(range(pf.metadata.num_row_groups))
    domain = _emulator.Domain()
    plan = _engine.plan_page_columns("gpu", domain, pf, raw, groups, schema, "t.parquet")
    columns = _engine.decode_page_columns(plan, schema, domain)
    taken = [f for f in schema if f.name in columns]
    table = pa.Table.from_arrays(
        [_to_arrow(columns[f.name]) for f in taken], schema=pa.schema(taken)
    )
    return table, plan.paths


def on_the_host(raw: bytes, tmp_path: Path, read_dictionary: list[str] | None = None) -> Any:
    path = tmp_path / "host.parquet"
    path.write_bytes(raw)
    domain = HostBackend(device_total_bytes=1 << 30).create_domain(0)
    frame = decode_parquet(path, domain=domain, engine="host", read_dictionary=read_dictionary)
    return frame.to_arrow()


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize("value_type", VALUE_TYPES, ids=str)
@pytest.mark.parametrize("make", [equal_dictionaries, different_dictionaries])
def test_a_dictionary_column_is_decoded_on_the_device(
    value_type: pa.DataType, make: Any, tmp_path: Path
) -> None:
    raw = make(value_type)
    got, paths = on_emulated_device(raw)
    assert paths == {"c": "gpu"}
    assert got.schema.field("c").type == pa.dictionary(pa.int32(), value_type)
    assert_same_table(got, pq.read_table(io.BytesIO(raw)))
    # the host engine's frame, dictionaries joined the same way
    assert got.equals(on_the_host(raw, tmp_path))


@pytest.mark.usefixtures("emulated_device")
def test_equal_dictionaries_are_kept_once_and_different_ones_joined() -> None:
    got, _ = on_emulated_device(equal_dictionaries(pa.string()))
    assert len(got.column("c").chunk(0).dictionary) == 300
    got, _ = on_emulated_device(different_dictionaries(pa.string()))
    column = got.column("c").chunk(0)
    # a, (empty), b, (b again: kept once), a
    assert len(column.dictionary) == 50 + 0 + 7 + 50
    assert column.indices[900:1200].to_numpy(zero_copy_only=False).min() >= 50


@pytest.mark.usefixtures("emulated_device")
def test_a_string_column_read_as_a_dictionary(tmp_path: Path) -> None:
    raw = plain_file(fallback=False)
    got, paths = on_emulated_device(raw, read_dictionary=["c"])
    assert paths == {"c": "gpu"}
    assert_same_table(got, pq.read_table(io.BytesIO(raw), read_dictionary=["c"]))
    assert got.equals(on_the_host(raw, tmp_path, read_dictionary=["c"]))


@pytest.mark.usefixtures("emulated_device")
def test_a_chunk_the_writer_fell_back_to_plain_stays_on_the_host() -> None:
    raw = plain_file(fallback=True)
    _, paths = on_emulated_device(raw, read_dictionary=["c"])
    assert paths["c"] == (
        "host: PLAIN data pages (the writer gave up on the dictionary) read as "
        "dictionary<values=string, indices=int32, ordered=0> in row group 0"
    )
    # read as strings, the same chunks go to the device
    _, paths = on_emulated_device(raw)
    assert paths == {"c": "gpu"}


def _emulated_chunk(chunk: bytes, spec: ChunkSpec, pages: list[Page]) -> Any:
    domain = _emulator.Domain()
    (got,) = _device.decode_chunks_on_device([(chunk, spec, pages)], domain)
    piece = device_piece(got, spec.arrow_type)
    del got
    assert domain.used_bytes() == 0
    return piece


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize("value_type", VALUE_TYPES, ids=str)
def test_each_chunk_equals_pyarrow_on_the_device_and_by_the_reference(
    value_type: pa.DataType,
) -> None:
    for raw in (equal_dictionaries(value_type), different_dictionaries(value_type)):
        assert check_file(raw, decode=_emulated_chunk) == {}
        assert check_file(raw) == {}  # the NumPy reference
    raw = plain_file(fallback=False)
    assert check_file(raw, decode=_emulated_chunk, read_dictionary=["c"]) == {}
    assert check_file(raw, read_dictionary=["c"]) == {}


def corrupt_dictionary_index_chunk() -> tuple[bytes, ChunkSpec]:
    """A chunk read as a dictionary whose data page's indices claim 8 bits each,
    for a 2-entry dictionary: indices past the dictionary."""
    table = pa.table({"x": pa.array(["a", "b"] * 20)})
    out = io.BytesIO()
    pq.write_table(table, out, compression="none", data_page_version="1.0")
    raw = out.getvalue()
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=["x"])
    spec = chunk_spec(pf, 0, 0, "bad.parquet")
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    _, data_page = read_pages(bytes(chunk), spec)
    payload_at = len(chunk) - len(data_page.payload)  # the data page is the last
    levels = int.from_bytes(chunk[payload_at : payload_at + 4], "little")
    assert chunk[payload_at + 4 + levels] == 1
    chunk[payload_at + 4 + levels] = 8  # the bit width byte of the index stream
    return bytes(chunk), spec


@pytest.mark.usefixtures("emulated_device")
def test_an_index_past_the_dictionary_is_refused() -> None:
    chunk, spec = corrupt_dictionary_index_chunk()
    with pytest.raises(SourceFormatError, match="the file is corrupt"):
        decode_chunk(chunk, spec)
    domain = _emulator.Domain()
    with pytest.raises(SourceFormatError, match="malformed"):
        _device.decode_chunks_on_device([(chunk, spec, None)], domain)
    assert domain.used_bytes() == 0


@pytest.mark.usefixtures("emulated_device")
def test_the_cold_read_benchmarks_cat_column_is_decoded_on_the_device(tmp_path: Path) -> None:
    """The dictionary column of the cold-read benchmark's file (its other
    columns left out: the emulator is slow)."""
    from benchmarks.source_cache import make_parquet

    path = tmp_path / "bench.parquet"
    make_parquet(path, 60_000, group_rows=1000)
    raw = path.read_bytes()
    pf = pq.ParquetFile(io.BytesIO(raw))
    assert pf.metadata.num_row_groups >= 2
    schema = pa.schema([pf.schema_arrow.field("cat")])
    domain = _emulator.Domain()
    groups = list(range(pf.metadata.num_row_groups))
    plan = _engine.plan_page_columns("gpu", domain, pf, raw, groups, schema, "bench.parquet")
    assert plan.paths == {"cat": "gpu"}
    column = _engine.decode_page_columns(plan, schema, domain)["cat"]
    got = pa.Table.from_arrays([_to_arrow(column)], schema=schema)
    assert len(column.dictionary.data) > 0
    assert_same_table(got, pq.read_table(io.BytesIO(raw), columns=["cat"]))
    assert got.equals(on_the_host(raw, tmp_path).select(["cat"]))
