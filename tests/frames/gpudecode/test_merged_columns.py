"""One column's chunks of several row groups decoded as one chunk (``columns=``
of ``decode_chunks_on_device``, what the GPU engine does for a heap of row
groups): equal to PyArrow, one round of launches a column however many row
groups, and every dictionary index checked against its own row group's
dictionary. On the emulated device."""

from __future__ import annotations

import importlib
import io
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, device_piece, file_chunks
from tests.frames.gpudecode.test_device_plan import _mixed_table
from tests.frames.gpudecode.test_reference import WRITE_OPTIONS, tables, write

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import chunk_spec, read_pages

_device = importlib.import_module("nexus_cache.frames.gpudecode.device")
_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")


def _items(raw: bytes) -> tuple[pq.ParquetFile, list[Any]]:
    """Every chunk of ``raw``, row group by row group."""
    return pq.ParquetFile(io.BytesIO(raw)), file_chunks(raw)


def _by_column(pf: pq.ParquetFile) -> list[list[int]]:
    columns = pf.metadata.num_columns
    return [[g * columns + j for g in range(pf.metadata.num_row_groups)] for j in range(columns)]


def _launches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counts: Counter[str] = Counter()
    real = _heap.kernel_function

    def counted(name: str, element_bytes: int | None = None) -> Any:
        counts[name] += 1
        return real(name, element_bytes)

    monkeypatch.setattr(_heap, "kernel_function", counted)
    return counts


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_merged_columns_equal_pyarrow_with_a_round_of_launches_a_column(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 6 row groups, each with its own dictionaries; "wide" falls back from the
    # dictionary to PLAIN in every row group
    raw = write(_mixed_table(3000), row_group_size=500, compression=compression)
    pf, items = _items(raw)
    columns = _by_column(pf)
    counts = _launches(monkeypatch)
    domain = _emulator.Domain()
    got = _device.decode_chunks_on_device(items, domain, columns=columns)
    assert len(got) == len(columns)
    expected = pf.read()
    for j, piece in enumerate(got):
        name = pf.schema_arrow.names[j]
        assert_same(device_piece(piece), expected.column(name).combine_chunks(), name)
    merged = sum(counts.values())
    counts.clear()
    _device.decode_chunks_on_device(items, domain)  # chunk by chunk
    assert counts["plain_lengths"] >= 12, counts
    assert counts["dict_strings"] >= 6, counts
    # the launches of a column's chunks, not one round per column chunk: at
    # most one launch per kernel per page group (a writer's fall back from
    # the dictionary to PLAIN in each row group makes two groups of each)
    assert merged * 3 <= sum(counts.values()), (merged, counts)
    del got, piece
    assert domain.used_bytes() == 0


@pytest.mark.usefixtures("emulated_device")
def test_the_results_are_one_per_group_in_group_order() -> None:
    raw = write(_mixed_table(2000), row_group_size=500)
    pf, items = _items(raw)
    merged = _by_column(pf)
    # column 0 merged, column 1 chunk by chunk
    groups = [merged[0], *([i] for i in merged[1])]
    got = _device.decode_chunks_on_device(items, _emulator.Domain(), columns=groups)
    assert len(got) == 1 + pf.metadata.num_row_groups
    assert got[0].length == 2000
    table = pf.read()
    first = pf.schema_arrow.names[0]
    assert_same(device_piece(got[0]), table.column(first).combine_chunks(), first)
    second = pf.schema_arrow.names[1]
    for g, piece in enumerate(got[1:]):
        assert_same(device_piece(piece), pf.read_row_group(g).column(second).combine_chunks(), "")


def _with_index_past_its_dictionary(value_type: pa.DataType) -> bytes:
    """Two row groups of one non-null column: the first with a dictionary of 200
    entries, the second of 2 (indices one bit wide, two RLE runs), whose
    second run's value is then set to 7: past its own dictionary, inside the
    200 of the first."""
    first = np.arange(1000) % 200
    second = np.repeat([0, 1], 500)
    values = np.concatenate([first, second])
    array = pa.array(values if pa.types.is_integer(value_type) else [f"v{v}" for v in values])
    schema = pa.schema([pa.field("k", value_type, nullable=False)])
    raw = bytearray(
        write(
            pa.table({"k": array}, schema=schema),
            row_group_size=1000,
            compression="none",
            use_dictionary=True,
            data_page_version="1.0",
        )
    )
    pf = pq.ParquetFile(io.BytesIO(bytes(raw)))
    spec = chunk_spec(pf, 1, 0, "t.parquet")
    data = bytes(raw[spec.start : spec.start + spec.size])
    (page,) = [p for p in read_pages(data, spec) if p.header.type == 0]  # the data page
    payload = bytes(page.payload)
    # bit width 1; run of 500 zeros: varint 1000 (0xE8 0x07), value 0; then ones
    assert payload == bytes([1, 0xE8, 0x07, 0, 0xE8, 0x07, 1]), payload
    at = raw.find(payload, page.offset)
    raw[at + 6] = 7
    return bytes(raw)


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize("value_type", [pa.int64(), pa.string()], ids=str)
def test_an_index_past_its_own_row_groups_dictionary_is_refused(value_type: pa.DataType) -> None:
    raw = _with_index_past_its_dictionary(value_type)
    _, items = _items(raw)
    domain = _emulator.Domain()
    with pytest.raises(SourceFormatError, match=r"column 'k' of one of row groups 0, 1"):
        _device.decode_chunks_on_device(items, domain, columns=[[0, 1]])
    assert domain.used_bytes() == 0
    # chunk by chunk, the same page is refused, naming its row group
    with pytest.raises(SourceFormatError, match="row group 1"):
        _device.decode_chunks_on_device(items[1:], domain)


@pytest.mark.parametrize(
    ("value_type", "sizes", "merged"),
    [
        (pa.int64(), [100, 100], True),
        (pa.string(), [1 << 30, (1 << 30) - 1], True),
        (pa.binary(), [1 << 30, 1 << 30], False),  # past 2 GiB - 1: 32-bit offsets
        (pa.large_string(), [1 << 31, 1 << 31], True),
        (pa.dictionary(pa.int32(), pa.string()), [100, 100], False),  # joined as the host
        (pa.float64(), [], False),
    ],
    ids=str,
)
def test_which_columns_are_merged(value_type: pa.DataType, sizes: list[int], merged: bool) -> None:
    from types import SimpleNamespace

    specs = [SimpleNamespace(arrow_type=value_type, uncompressed_size=n) for n in sizes]
    assert _device.mergeable(specs) is merged


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(), options=WRITE_OPTIONS)
def test_merged_columns_of_generated_tables_equal_pyarrow(
    emulated_device: Any, table: pa.Table, options: dict[str, Any]
) -> None:
    # row groups of 50 rows where the options ask for them: many chunks a column
    raw = write(table, **options)
    pf, items = _items(raw)
    if not items:
        return
    got = _device.decode_chunks_on_device(items, _emulator.Domain(), columns=_by_column(pf))
    expected = pf.read()
    for j, piece in enumerate(got):
        name = pf.schema_arrow.names[j]
        assert_same(device_piece(piece), expected.column(name).combine_chunks(), name)
