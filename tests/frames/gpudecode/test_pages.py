"""Page headers and column chunk walks: exact on good bytes, SourceFormatError on bad ones."""

from __future__ import annotations

import dataclasses
import importlib
import io
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames.gpudecode import (
    ChunkSpec,
    PageType,
    chunk_spec,
    decode_chunk,
    read_pages,
)
from nexus_cache.frames.gpudecode._thrift import MAX_DEPTH, ThriftError, read_fields, read_struct

_readers = importlib.import_module("nexus_cache.frames.gpudecode._page_headers")

# A compact-protocol writer for the tests' own headers.
I32, BINARY, LIST, MAP, STRUCT, TRUE, FALSE = 5, 8, 9, 11, 12, 1, 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            return bytes(out + bytes([n]))
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zz(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _struct(*fields: tuple[int, int, bytes]) -> bytes:
    out, last = bytearray(), 0
    for fid, kind, payload in fields:
        if 0 < fid - last <= 15:
            out.append(((fid - last) << 4) | kind)
        else:  # the long form: type byte, then the id
            out += bytes([kind]) + _zz(fid)
        out += payload
        last = fid
    return bytes(out + b"\x00")


def _i32(fid: int, v: int) -> tuple[int, int, bytes]:
    return (fid, I32, _zz(v))


def _v2_header(values: int, nulls: int, size: int, def_bytes: int, compressed: bool) -> bytes:
    stats = _struct((1, BINARY, _varint(3) + b"max"), (2, BINARY, _varint(3) + b"min"))
    v2 = _struct(
        _i32(1, values),
        _i32(2, nulls),
        _i32(3, values),
        _i32(4, 0),
        _i32(5, def_bytes),
        _i32(6, 0),
        (7, TRUE if compressed else FALSE, b""),
        (8, STRUCT, stats),
    )
    return _struct(
        _i32(1, PageType.DATA_PAGE_V2),
        _i32(2, size),
        _i32(3, size),
        _i32(4, 12345),  # crc
        (32, LIST, bytes([0x25]) + _zz(1) + _zz(2)),  # an unknown list, long-form id
        (33, MAP, _varint(1) + bytes([0x55]) + _zz(1) + _zz(2)),  # an unknown map
        (34, STRUCT, v2),  # long-form id 34: not field 8, so it is skipped
        (8, STRUCT, v2),  # ids may go down again (the long form)
    )


def _spec(size: int, values: int, inflated: int = 1 << 20) -> ChunkSpec:
    return ChunkSpec(
        source="hand.parquet",
        column="x",
        row_group=0,
        start=1000,
        size=size,
        num_values=values,
        uncompressed_size=inflated,
        codec="UNCOMPRESSED",
        physical_type="INT32",
        logical={"Type": "None"},
        max_def=1,
        max_rep=0,
        arrow_type=pa.int32(),
    )


def test_hand_written_v2_header_is_read_and_unknown_fields_skipped() -> None:
    # levels 1,0,1,1: one bit-packed group (header 0x03), bits LSB first 0b1101
    payload = b"\x03\x0d" + np.array([10, 20, 30], dtype="<i4").tobytes()
    chunk = _v2_header(4, 1, len(payload), 2, compressed=False) + payload
    (page,) = read_pages(chunk, _spec(len(chunk), 4))
    h = page.header
    assert (h.type, h.num_values, h.num_nulls, h.num_rows, h.def_bytes) == (3, 4, 1, 4, 2)
    assert (h.compressed_size, h.is_compressed, page.offset) == (len(payload), False, 1000)
    assert bytes(page.payload) == payload
    piece = decode_chunk(chunk, _spec(len(chunk), 4))
    assert piece.data.tolist() == [10, 0, 20, 30]
    assert piece.validity is not None
    assert piece.validity.tolist() == [True, False, True, True]


def test_real_pages_carry_their_headers() -> None:
    out = io.BytesIO()
    table = pa.table({"x": pa.array([1, None, 3] * 1000, pa.int64())})
    pq.write_table(table, out, data_page_version="2.0", data_page_size=1000)
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "f.parquet")
    pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
    assert pages[0].header.type == PageType.DICTIONARY_PAGE
    assert pages[0].header.num_values == 2
    data = pages[1:]
    assert all(p.header.type == PageType.DATA_PAGE_V2 for p in data)
    assert sum(p.header.num_values for p in data) == 3000
    assert sum(p.header.num_nulls or 0 for p in data) == 1000
    assert [p.offset for p in pages] == sorted(p.offset for p in pages)


@pytest.mark.parametrize("field", [1, 2, 3])
def test_a_required_field_of_the_wrong_type_is_refused(field: int) -> None:
    fields = [_i32(1, PageType.DATA_PAGE_V2), _i32(2, 10), _i32(3, 10)]
    fields[field - 1] = (field, BINARY, _varint(2) + b"ab")
    chunk = _struct(*fields) + bytes(10)
    with pytest.raises(SourceFormatError, match="unreadable page header"):
        read_pages(chunk, _spec(len(chunk), 0))


def test_thrift_limits() -> None:
    deep = bytes([0x1C]) * (MAX_DEPTH + 2)  # field 1, a struct, nested over and over
    with pytest.raises(ThriftError, match="nesting deeper"):
        read_struct(memoryview(deep), 0, len(deep), {})
    long_varint = bytes([0x15]) + b"\xff" * 11
    with pytest.raises(ThriftError, match="longer than 10 bytes"):
        read_struct(memoryview(long_varint), 0, len(long_varint), {1: None})
    huge_list = bytes([0x19, 0xF5]) + _varint(1 << 40)
    with pytest.raises(ThriftError, match="runs past the data"):
        read_struct(memoryview(huge_list), 0, len(huge_list), {})


def _good_chunk(version: str = "1.0") -> tuple[bytes, ChunkSpec]:
    out = io.BytesIO()
    rng = np.random.default_rng(3)
    mask = rng.random(300) < 0.2
    table = pa.table({"s": pa.array([f"s{i % 9}" for i in range(300)], mask=mask)})
    pq.write_table(table, out, data_page_version=version, data_page_size=256, compression="snappy")
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "good.parquet")
    return raw[spec.start : spec.start + spec.size], spec


def test_truncated_chunk_names_file_column_and_offset() -> None:
    chunk, spec = _good_chunk()
    short = dataclasses.replace(spec, size=len(chunk) - 3)
    with pytest.raises(
        SourceFormatError, match=r"'good.parquet', column 's' of row group 0, byte"
    ):
        read_pages(chunk[:-3], short)


def test_values_other_than_the_footers_are_refused() -> None:
    chunk, spec = _good_chunk()
    with pytest.raises(SourceFormatError, match="the footer says 301"):
        read_pages(chunk, dataclasses.replace(spec, num_values=301))


def test_pages_inflating_past_the_footer_are_refused() -> None:
    chunk, spec = _good_chunk()
    with pytest.raises(SourceFormatError, match="inflate past"):
        read_pages(chunk, dataclasses.replace(spec, uncompressed_size=10))


def _fuzz_chunks() -> list[tuple[bytes, ChunkSpec]]:
    n = np.arange(300)
    columns = [
        pa.array([f"s{i % 9}" for i in n], mask=n % 5 == 0),
        pa.array(n % 7, pa.int64(), mask=n % 4 == 0),
        pa.array(n % 3 == 0, mask=n % 4 == 0),
    ]
    chunks = []
    for version in ("1.0", "2.0"):
        for dictionary in (True, False):
            for column in columns:
                out = io.BytesIO()
                pq.write_table(
                    pa.table({"s": column}),
                    out,
                    data_page_version=version,
                    data_page_size=256,
                    compression="snappy",
                    use_dictionary=dictionary,
                )
                raw = out.getvalue()
                spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "fuzz.parquet")
                chunks.append((raw[spec.start : spec.start + spec.size], spec))
    return chunks


def corrupted(
    chunk: bytes, headers: list[int], edits: list[tuple[int, int, int]], cut: int
) -> bytes:
    """``chunk`` with each ``(where, into_header, value)`` of ``edits`` written
    (``into_header`` -1: byte ``where`` of the chunk; else that byte of the page
    header at ``headers[where]``, both wrapped around) and its last ``cut``
    bytes dropped."""
    data = bytearray(chunk)
    for where, into_header, value in edits:
        at = where if into_header < 0 else headers[where % len(headers)] + into_header
        data[at % len(data)] = value
    return bytes(data[: len(data) - cut])


_CHUNKS = _fuzz_chunks()
# Where each chunk's page headers start: most edits land in a header.
_HEADERS = [[p.offset - spec.start for p in read_pages(c, spec)] for c, spec in _CHUNKS]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(_CHUNKS) - 1),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(-1, 30), st.integers(0, 255)),
        min_size=1,
        max_size=4,
    ),
    cut=st.integers(0, 40),
)
def test_corrupted_chunks_raise_source_format_error_only(
    which: int, edits: list[tuple[int, int, int]], cut: int
) -> None:
    chunk, spec = _CHUNKS[which]
    data = corrupted(chunk, _HEADERS[which], edits, cut)
    spec = dataclasses.replace(spec, size=len(data))
    started = time.monotonic()
    try:
        decode_chunk(bytes(data), spec)
    except (SourceFormatError, FrameTypeError):
        pass
    assert time.monotonic() - started < 5


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=200), values=st.integers(0, 1000))
def test_random_bytes_raise_source_format_error_only(data: bytes, values: int) -> None:
    try:
        read_pages(data, _spec(len(data), values, inflated=4096))
    except SourceFormatError:
        pass


def _general(buf: bytes) -> tuple[Any, int] | None:
    """The general reader's ``(header, offset past it)``, None where it refuses."""
    try:
        fields, body = read_fields(memoryview(buf), 0, len(buf), _readers._HEADER)
        return _readers._header(fields, body), body
    except ThriftError:
        return None


def test_pyarrow_page_headers_take_the_common_path_and_read_the_same() -> None:
    # every page header pyarrow writes (v1, v2, dictionary; statistics): the
    # common reader reads it, exactly as the general one does
    for chunk, spec in _CHUNKS:
        data = memoryview(chunk)
        for page in read_pages(chunk, spec):
            at = page.offset - spec.start
            common = _readers.common_header(data, at)
            assert common is not None
            header, body = common
            assert header == page.header
            assert (header, body - at) == _general(chunk[at:])


_GOOD = [0, 1, 2, 3, 300, 1 << 20, (1 << 31) - 1]
_BAD = [1 << 31, -1, -(1 << 31)]


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    """Page headers of the common shape, and near it: a field absent, out of
    range, of the wrong type or in the long form; unknown fields; nested
    headers for another page type, twice, or with statistics; cut or with a
    byte changed (each flaw now and then, so most headers are good)."""

    def flaw() -> bool:
        return draw(st.integers(0, 15)) == 7

    def field(fid: int) -> list[tuple[int, int, bytes]]:
        if not flaw():
            return [_i32(fid, draw(st.sampled_from(_GOOD)))]
        how = draw(st.sampled_from(["absent", "binary", "true", "struct", "bad"]))
        if how == "absent":
            return []
        if how == "binary":
            return [(fid, BINARY, _varint(2) + b"ab")]
        if how == "true":
            return [(fid, TRUE, b"")]
        if how == "struct":
            return [(fid, STRUCT, _struct())]
        return [_i32(fid, draw(st.sampled_from(_BAD)))]

    kind = draw(st.sampled_from([0, 2, 3])) if not flaw() else draw(st.sampled_from([1, 7, -1]))
    stats = _struct((1, BINARY, _varint(3) + b"max"), (3, 6, _zz(7)), (7, TRUE, b""))
    sub: list[tuple[int, int, bytes]] = []
    for fid in range(1, 7):
        sub += field(fid)
    sub += draw(st.sampled_from([[], [(7, TRUE, b"")], [(7, FALSE, b"")], [_i32(7, 1)]]))
    if draw(st.booleans()):
        sub.append((8, STRUCT, stats))
    elif flaw():
        sub.append((9, 6, _zz(3)))  # an i64
    if draw(st.booleans()):
        sub.insert(0, (5, STRUCT, stats))
        sub.sort(key=lambda f: f[0])
    top = [_i32(1, kind), *field(2), *field(3)]
    if draw(st.booleans()):
        top.append(_i32(4, draw(st.sampled_from(_GOOD + _BAD))))  # a crc
    nested = [{0: 5, 2: 7, 3: 8}.get(kind, 6)]
    if flaw():
        nested = draw(st.lists(st.sampled_from([5, 6, 7, 8, 40]), max_size=2, unique=True))
    top += [(fid, STRUCT, _struct(*sub)) for fid in sorted(nested)]
    raw = bytearray(_struct(*top))
    if flaw():  # a long-form id: the general reader's
        raw[0] = I32
        raw[1:1] = _zz(1)
    if flaw():
        raw = raw[: draw(st.integers(0, len(raw)))]
    if raw and flaw():
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw) + bytes(draw(st.integers(0, 3)))


@settings(max_examples=1500, deadline=None)
@given(raw=_headers())
def test_the_common_header_reader_agrees_with_the_general_one(raw: bytes) -> None:
    common = _readers.common_header(memoryview(raw), 0)
    if common is not None:  # where it reads one, it is the general reader's
        assert common == _general(raw)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_common_page_headers_take_a_few_calls_a_page(version: str) -> None:
    # pyarrow's headers (statistics in them): a few calls a header (a v1 data
    # page's: one match, its groups, three lookups of known varints, one skip
    # of the statistics), not a call per field or per nested struct
    out = io.BytesIO()
    rng = np.random.default_rng(5)
    values = pa.array(rng.integers(0, 100, 20_000), mask=rng.random(20_000) < 0.1)
    pq.write_table(
        pa.table({"i": values}),
        out,
        data_page_size=1024,
        data_page_version=version,
        compression="snappy",
    )
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "calls.parquet")
    chunk = raw[spec.start : spec.start + spec.size]
    calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(count)
    try:
        pages = read_pages(chunk, spec)
    finally:
        sys.setprofile(None)
    assert len(pages) > 10
    assert calls[0] / len(pages) <= 20, f"{calls[0] / len(pages):.1f} calls a page"


def test_pyarrow_v1_data_page_headers_take_the_one_match_path_and_read_the_same() -> None:
    # every v1 data and dictionary page header pyarrow writes (statistics or
    # not) is read by the one-match reader, exactly as the general reader
    # reads it; any other page header (v2) is left to the common reader
    seen = 0
    for chunk, spec in _CHUNKS:
        data = memoryview(chunk)
        for page in read_pages(chunk, spec):
            at = page.offset - spec.start
            fast = _readers._shaped_header(data, at)
            if page.header.type not in (PageType.DATA_PAGE, PageType.DICTIONARY_PAGE):
                assert fast is None
                continue
            seen += 1
            assert fast is not None
            header, body = fast
            assert header == page.header
            assert (header, body - at) == _general(chunk[at:])
    assert seen >= 5


def _page_header(draw: st.DrawFn, types: list[int], field: int, sub: list[Any]) -> bytes:
    """A page header of one of ``types`` whose ``field`` is the struct of ``sub``:
    sizes in or out of range, sometimes a crc or a v2 struct added, the bytes
    sometimes cut or one changed, and up to three bytes after it."""
    value = st.sampled_from([*_GOOD, *_BAD, 1 << 34, -(1 << 34)])
    top = [_i32(1, draw(st.sampled_from(types))), _i32(2, draw(value))]
    top += [_i32(3, draw(value))]
    if draw(st.integers(0, 3)) == 0:  # a crc, any value (of up to six bytes)
        top.append(_i32(4, draw(st.sampled_from([*_GOOD, *_BAD, 1 << 34]))))
    top += [(field, STRUCT, _struct(*sub))]
    if draw(st.integers(0, 7)) == 0:
        top.append((8, STRUCT, _struct()))
    raw = bytearray(_struct(*top))
    if draw(st.integers(0, 5)) == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    if raw and draw(st.integers(0, 5)) == 0:
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw) + bytes(draw(st.integers(0, 3)))


@st.composite
def _v1_headers(draw: st.DrawFn) -> bytes:
    """v1 data page headers of the shape pyarrow writes, and near it: any
    value in or out of range (a varint of up to six bytes), statistics or
    none (their own fields of any type), fields added after them, cut, or a
    byte changed."""
    value = st.sampled_from([*_GOOD, *_BAD, 1 << 34, -(1 << 34)])
    stats = draw(
        st.sampled_from(
            [
                None,
                _struct((1, BINARY, _varint(3) + b"max"), (3, 6, _zz(7)), (7, TRUE, b"")),
                _struct((5, BINARY, _varint(8) + bytes(8)), (6, BINARY, _varint(0))),
                _struct((2, LIST, bytes([0x15]) + _zz(4))),
            ]
        )
    )
    sub = [_i32(fid, draw(value)) for fid in range(1, 5)]
    if stats is not None:
        sub.append((5, STRUCT, stats))
    if draw(st.integers(0, 7)) == 0:
        sub.append(_i32(draw(st.sampled_from([6, 7, 9])), 1))
    return _page_header(draw, [0, 0, 0, 2, 3], 5, sub)


@settings(max_examples=1500, deadline=None)
@given(raw=_v1_headers())
def test_the_one_match_reader_agrees_with_the_common_and_general_ones(raw: bytes) -> None:
    # where it reads a header it is exactly the general reader's (and the
    # common reader's); what either refuses or leaves, it leaves too
    fast = _readers._shaped_header(memoryview(raw), 0)
    if fast is not None:
        assert fast == _general(raw)
        assert fast == _readers.common_header(memoryview(raw), 0)


@st.composite
def _dictionary_headers(draw: st.DrawFn) -> bytes:
    """Dictionary page headers of the shape pyarrow writes, and near it: any
    value in or out of range, ``is_sorted`` true, false or absent (or an
    integer), fields added, cut, or a byte changed."""
    value = st.sampled_from([*_GOOD, *_BAD, 1 << 34, -(1 << 34)])
    sub = [_i32(1, draw(value)), _i32(2, draw(st.sampled_from([0, 2, 8, -1, 1 << 20])))]
    sub += draw(st.sampled_from([[], [(3, TRUE, b"")], [(3, FALSE, b"")], [_i32(3, 1)]]))
    if draw(st.integers(0, 7)) == 0:
        sub.append(_i32(draw(st.sampled_from([4, 9])), 1))
    return _page_header(draw, [2, 2, 2, 0, 3], 7, sub)


@settings(max_examples=1000, deadline=None)
@given(raw=_dictionary_headers())
def test_the_one_match_reader_reads_dictionary_headers_as_the_general_one(raw: bytes) -> None:
    fast = _readers._shaped_header(memoryview(raw), 0)
    if fast is not None:
        assert fast == _general(raw)
        assert fast == _readers.common_header(memoryview(raw), 0)
