"""Unsupported column chunks are named, with a reason, before any decoding."""

from __future__ import annotations

import decimal
import importlib
import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_cache.errors import FrameTypeError
from nexus_cache.frames.gpudecode import (
    ChunkSpec,
    Page,
    PageHeader,
    chunk_spec,
    decode_chunk,
    footer_reason,
    read_pages,
    unsupported_reason,
)
from nexus_cache.frames.gpudecode.support import pages_reason

_support = importlib.import_module("nexus_cache.frames.gpudecode.support")


def _reason(table: pa.Table, **options: Any) -> tuple[str | None, str | None]:
    out = io.BytesIO()
    pq.write_table(table, out, **options)
    raw = out.getvalue()
    pf = pq.ParquetFile(io.BytesIO(raw))
    spec = chunk_spec(pf, 0, 0, "t.parquet")
    pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
    return footer_reason(spec), unsupported_reason(spec, pages)


INTS = pa.table({"x": pa.array(range(100), pa.int64())})


@pytest.mark.parametrize(
    ("table", "options", "footer", "reason"),
    [
        (INTS, {"compression": "brotli"}, "codec BROTLI", "codec BROTLI"),
        (
            INTS,
            {"use_dictionary": False, "column_encoding": "DELTA_BINARY_PACKED"},
            None,
            "encoding DELTA_BINARY_PACKED",
        ),
        (
            pa.table({"x": pa.array([1.5, 2.5], pa.float64())}),
            {"use_dictionary": False, "column_encoding": "BYTE_STREAM_SPLIT"},
            None,
            "encoding BYTE_STREAM_SPLIT",
        ),
        (
            pa.table({"x": ["a", "bb"]}),
            {"use_dictionary": False, "column_encoding": "DELTA_LENGTH_BYTE_ARRAY"},
            None,
            "encoding DELTA_LENGTH_BYTE_ARRAY",
        ),
        (
            pa.table({"x": pa.array([decimal.Decimal("1.5")], pa.decimal128(10, 2))}),
            {},
            "type decimal128(10, 2) from physical type",
            None,
        ),
        (
            pa.table({"x": pa.array([b"ab"], pa.binary(2))}),
            {},
            "type fixed_size_binary[2] from physical type FIXED_LEN_BYTE_ARRAY",
            None,
        ),
        (
            pa.table({"x": pa.array([1], pa.timestamp("ns"))}),
            {"use_deprecated_int96_timestamps": True},
            "type timestamp[ns] from physical type INT96",
            None,
        ),
        (
            pa.table({"x": pa.array([1000], pa.time32("ms"))}),
            {},
            "type time32[ms] from physical type INT32",
            None,
        ),
        (pa.table({"x": pa.array([1], pa.uint32())}), {}, "type uint32 from physical type", None),
        (
            pa.table(
                {
                    "x": pa.array(["a", "b"])
                    .dictionary_encode()
                    .cast(pa.dictionary(pa.int8(), pa.string()))
                }
            ),
            {},
            "type dictionary<values=string, indices=int8, ordered=0> from physical type",
            None,
        ),
        (pa.table({"x": [[1, 2]]}), {}, "nested column", None),
        (pa.table({"x": [{"a": 1}]}), {}, "nested column", None),
    ],
)
def test_unsupported_chunks_are_named(
    table: pa.Table, options: dict[str, Any], footer: str, reason: str | None
) -> None:
    got_footer, got = _reason(table, **options)
    if footer is None:
        assert got_footer is None
    else:
        assert got_footer is not None
        assert got_footer.startswith(footer)
    assert got is not None
    assert got.startswith(reason or footer)


def test_supported_chunk_has_no_reason() -> None:
    assert _reason(INTS, compression="zstd") == (None, None)


@pytest.mark.parametrize("values", [["a", "bb", None], [b"\x00", b"", b"zz"]])
def test_a_dictionary_of_strings_or_binaries_is_supported(values: list[Any]) -> None:
    table = pa.table({"x": pa.array(values).dictionary_encode()})
    assert _reason(table, data_page_version="2.0") == (None, None)


def test_decoding_an_unsupported_chunk_is_refused_with_its_reason() -> None:
    out = io.BytesIO()
    pq.write_table(INTS, out, compression="brotli")
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "t.parquet")
    with pytest.raises(FrameTypeError, match="codec BROTLI is decoded on the host only"):
        decode_chunk(raw[spec.start : spec.start + spec.size], spec)


_PAGE_SHAPES = [
    (0, 0, 3),  # v1 PLAIN, levels RLE
    (0, 8, 3),  # v1 RLE_DICTIONARY
    (0, 2, 3),  # v1 PLAIN_DICTIONARY
    (0, 3, 3),  # v1 RLE (booleans only)
    (0, 0, 4),  # v1 PLAIN, levels BIT_PACKED
    (0, 5, 3),  # v1 DELTA_BINARY_PACKED
    (3, 0, None),  # v2 PLAIN
    (3, 8, None),  # v2 RLE_DICTIONARY
    (2, 0, None),  # dictionary page PLAIN
    (2, 2, None),  # dictionary page PLAIN_DICTIONARY
    (2, 8, None),  # dictionary page RLE_DICTIONARY
    (1, 0, None),  # index page
]


@settings(max_examples=600, deadline=None)
@given(
    shapes=st.lists(st.sampled_from(_PAGE_SHAPES), max_size=8),
    rep_bytes=st.lists(st.sampled_from([0, 0, 0, 2]), min_size=8, max_size=8),
    physical=st.sampled_from(
        [
            ("INT64", pa.int64()),
            ("BOOLEAN", pa.bool_()),
            ("BYTE_ARRAY", pa.string()),
            ("BYTE_ARRAY", pa.dictionary(pa.int32(), pa.string())),
        ]
    ),
    max_def=st.sampled_from([0, 1]),
)
def test_the_page_check_by_shapes_gives_the_reason_the_walk_gives(
    shapes: list[tuple[int, int, int | None]],
    rep_bytes: list[int],
    physical: tuple[str, pa.DataType],
    max_def: int,
) -> None:
    # pages_reason checks each distinct page shape once: it must name the
    # same first reason as walking the pages in order (dictionary pages
    # second, late, or missing included)
    spec = ChunkSpec(
        "t.parquet", "x", 0, 4, 100, 10, 100, "SNAPPY", physical[0], {}, max_def, 0, physical[1]
    )
    pages = [
        Page(
            PageHeader(kind, 10, 10, 1, encoding, level, level, rep_bytes=rep_bytes[i]),
            4 + 10 * i,
            memoryview(b""),
        )
        for i, (kind, encoding, level) in enumerate(shapes)
    ]
    assert pages_reason(spec, pages) == _support._first_reason(spec, pages)
