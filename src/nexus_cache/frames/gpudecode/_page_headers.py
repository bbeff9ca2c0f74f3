"""A Parquet page header: its record, its enums and the three readers of its bytes.

:class:`PageHeader` is one decoded page header; :class:`PageType` and
:class:`Encoding` name its fields' values (:func:`encoding_name`). A header
is read by the first of three readers that takes it, all giving the same
header: a v1 data page or dictionary page header as PyArrow writes it is
matched whole, statistics included, by one regular expression
(:mod:`._header_shapes`: every field's head decides how it is read, and the
patterns check the fields' ranges too; :func:`_shaped_header` makes its
header); a header of the common shape (short-form field ids, 32-bit
integers, one nested header) by one loop over local variables
(:func:`common_header`); any other, and any these find wrong, by the general
reader (:func:`general_header`, over :mod:`._thrift`), which names what is
wrong as a :class:`~._thrift.ThriftError`. Each reads its bytes in one pass
and never loops on hostile input. :mod:`.pages` walks a column chunk's
pages with them. Stateless and thread-safe.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from nexus_cache.frames.gpudecode._header_shapes import shape_row
from nexus_cache.frames.gpudecode._thrift import (
    BOOL,
    I32,
    ThriftError,
    _skip_struct,
    compile_schema,
    read_fields,
)

__all__ = [
    "Encoding",
    "PageHeader",
    "PageType",
    "common_header",
    "encoding_name",
    "general_header",
]


class PageType(enum.IntEnum):
    DATA_PAGE = 0
    INDEX_PAGE = 1
    DICTIONARY_PAGE = 2
    DATA_PAGE_V2 = 3


class Encoding(enum.IntEnum):
    PLAIN = 0
    PLAIN_DICTIONARY = 2
    RLE = 3
    BIT_PACKED = 4
    DELTA_BINARY_PACKED = 5
    DELTA_LENGTH_BYTE_ARRAY = 6
    DELTA_BYTE_ARRAY = 7
    RLE_DICTIONARY = 8
    BYTE_STREAM_SPLIT = 9


def encoding_name(value: int) -> str:
    """The Parquet name of encoding ``value`` (``"encoding 42"`` for an unknown one)."""
    try:
        return Encoding(value).name
    except ValueError:
        return f"encoding {value}"


# Field ids of parquet.thrift's PageHeader and the nested headers we read.
# A field of another type than parquet.thrift's is skipped (Thrift does so).
_DATA_V1 = {1: I32, 2: I32, 3: I32, 4: I32}
_DICT = {1: I32, 2: I32}
_DATA_V2 = {1: I32, 2: I32, 3: I32, 4: I32, 5: I32, 6: I32, 7: BOOL}
_HEADER = compile_schema({1: I32, 2: I32, 3: I32, 5: _DATA_V1, 7: _DICT, 8: _DATA_V2})


class PageHeader(NamedTuple):
    """One decoded page header. For a dictionary page ``num_values`` is the
    dictionary's size; for v1 data pages ``num_nulls``/``num_rows`` are None
    and ``def_bytes``/``rep_bytes`` are 0 (the levels carry their own length).
    Immutable (a named tuple: a row group has thousands, made fast)."""

    type: int
    uncompressed_size: int
    compressed_size: int
    num_values: int
    encoding: int
    def_encoding: int | None = None
    rep_encoding: int | None = None
    num_nulls: int | None = None
    num_rows: int | None = None
    def_bytes: int = 0
    rep_bytes: int = 0
    is_compressed: bool = True


_I32_END = 1 << 31
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3  # PageType's, as plain ints


def _int(value: Any, what: str, offset: int) -> int:
    """A required field's ``value`` (an int, or None: absent): a non-negative 32-bit integer."""
    if value is not None and 0 <= value < _I32_END:
        return value  # type: ignore[no-any-return]
    if value is None:
        raise ThriftError(f"page header lacks its {what}", offset)
    raise ThriftError(f"page header has {what} {value!r}", offset)


def _header(fields: list[Any], offset: int) -> PageHeader:
    kind = _int(fields[1], "type", offset)
    usize = _int(fields[2], "uncompressed_page_size", offset)
    csize = _int(fields[3], "compressed_page_size", offset)
    if kind == _DATA_PAGE:
        sub = _sub(fields[5], "data_page_header", offset)
        return PageHeader(
            kind,
            usize,
            csize,
            _int(sub[1], "num_values", offset),
            _int(sub[2], "encoding", offset),
            _int(sub[3], "definition_level_encoding", offset),
            _int(sub[4], "repetition_level_encoding", offset),
        )
    if kind == _DICTIONARY_PAGE:
        sub = _sub(fields[7], "dictionary_page_header", offset)
        return PageHeader(
            kind,
            usize,
            csize,
            _int(sub[1], "num_values", offset),
            _int(sub[2], "encoding", offset),
        )
    if kind == _DATA_PAGE_V2:
        sub = _sub(fields[8], "data_page_header_v2", offset)
        header = PageHeader(
            kind,
            usize,
            csize,
            num_values=_int(sub[1], "num_values", offset),
            num_nulls=_int(sub[2], "num_nulls", offset),
            num_rows=_int(sub[3], "num_rows", offset),
            encoding=_int(sub[4], "encoding", offset),
            def_bytes=_int(sub[5], "definition_levels_byte_length", offset),
            rep_bytes=_int(sub[6], "repetition_levels_byte_length", offset),
            is_compressed=True if sub[7] is None else sub[7],
        )
        levels = header.def_bytes + header.rep_bytes
        if levels > csize or levels > usize:
            raise ThriftError(f"page levels ({levels} bytes) exceed the page", offset)
        return header
    # Index pages (and page types this reader does not know) carry no values.
    return PageHeader(kind, usize, csize, 0, Encoding.PLAIN)


def _sub(value: Any, what: str, offset: int) -> list[Any]:
    if value is None:
        raise ThriftError(f"page header lacks its {what}", offset)
    return value  # type: ignore[no-any-return]


def common_header(buf: Any, pos: int) -> tuple[PageHeader, int] | None:
    """The page header at ``buf[pos]`` and the offset past it, when it has the
    common shape (short-form field ids; 32-bit integers, one nested header
    for the page's type, statistics and booleans in it) and every field
    :func:`_header` checks is valid; else None, and the general reader
    (:func:`general_header`) reads it (and names what is wrong).
    The same header as the general reader's, in one loop over local variables
    without a call per field."""
    kind_ = usize = csize = None
    which = 0  # the nested header's field id
    s1 = s2 = s3 = s4 = s5 = s6 = s7 = None
    fid = 0
    try:
        while True:  # the PageHeader
            head = buf[pos]
            pos += 1
            kind = head & 0x0F
            if kind == 0:
                break
            if head < 0x10:
                return None
            fid += head >> 4
            if kind == 5:  # an i32: a zigzag varint (crc and unknown ones read past)
                b = buf[pos]
                pos += 1
                v = b & 0x7F
                shift = 7
                while b >= 0x80:
                    if shift >= 35:
                        return None
                    b = buf[pos]
                    pos += 1
                    v |= (b & 0x7F) << shift
                    shift += 7
                v = (v >> 1) ^ -(v & 1)
                if fid == 1:
                    kind_ = v
                elif fid == 2:
                    usize = v
                elif fid == 3:
                    csize = v
                continue
            if kind != 12 or which or fid not in (5, 7, 8):
                return None
            which, sub = fid, 0
            while True:  # the nested header
                head = buf[pos]
                pos += 1
                kind = head & 0x0F
                if kind == 0:
                    break
                if head < 0x10:
                    return None
                sub += head >> 4
                if kind == 5:  # the varint read inline, as above: no call per field
                    b = buf[pos]
                    pos += 1
                    v = b & 0x7F
                    shift = 7
                    while b >= 0x80:
                        if shift >= 35:
                            return None
                        b = buf[pos]
                        pos += 1
                        v |= (b & 0x7F) << shift
                        shift += 7
                    v = (v >> 1) ^ -(v & 1)
                    if sub == 1:
                        s1 = v
                    elif sub == 2:
                        s2 = v
                    elif sub == 3:
                        s3 = v
                    elif sub == 4:
                        s4 = v
                    elif sub == 5:
                        s5 = v
                    elif sub == 6:
                        s6 = v
                elif kind == 1 or kind == 2:  # a boolean's value is its type
                    if sub == 7:
                        s7 = kind == 1
                elif kind == 12:  # statistics
                    pos = _skip_struct(buf, pos, len(buf), 3)
                else:
                    return None
    except (IndexError, ThriftError):
        return None
    if (
        kind_ is None
        or usize is None
        or csize is None
        or not (0 <= usize < _I32_END and 0 <= csize < _I32_END and s1 is not None)
        or not (0 <= s1 < _I32_END and s2 is not None and 0 <= s2 < _I32_END)
    ):
        return None
    if kind_ == _DATA_PAGE and which == 5:
        if s3 is None or s4 is None or not (0 <= s3 < _I32_END and 0 <= s4 < _I32_END):
            return None
        return PageHeader(kind_, usize, csize, s1, s2, s3, s4), pos
    if kind_ == _DICTIONARY_PAGE and which == 7:
        return PageHeader(kind_, usize, csize, s1, s2), pos
    if (
        kind_ != _DATA_PAGE_V2
        or which != 8
        or s3 is None
        or s4 is None
        or s5 is None
        or s6 is None
        or not (0 <= s3 < _I32_END and 0 <= s4 < _I32_END)
        or not (0 <= s5 < _I32_END and 0 <= s6 < _I32_END)
        or s5 + s6 > csize
        or s5 + s6 > usize
    ):
        return None
    compressed = True if s7 is None else s7
    return PageHeader(kind_, usize, csize, s1, s4, None, None, s2, s3, s5, s6, compressed), pos


def _shaped_header(buf: Any, pos: int) -> tuple[PageHeader, int] | None:
    """:func:`common_header` of a header of one of the shapes
    :func:`._header_shapes.shape_row` matches, by one regular expression instead of a
    loop over its bytes (what :func:`.pages.read_pages` reads first); else None
    (and :func:`common_header` reads it). The same header, or None, as
    :func:`common_header` gives."""
    row = shape_row(buf, pos)
    if row is None:
        return None
    kind, usize, csize, values, encoding, def_encoding, rep_encoding, _, body = row
    if kind == _DATA_PAGE:
        return PageHeader(kind, usize, csize, values, encoding, def_encoding, rep_encoding), body
    return PageHeader(kind, usize, csize, values, encoding), body


def general_header(data: Any, pos: int, size: int) -> tuple[PageHeader, int]:
    """The page header at ``data[pos]`` (``size``: where the bytes end) and the
    offset past it, by the general reader: any header the Thrift compact
    protocol allows. :class:`ThriftError` naming what is wrong and where when
    it is malformed."""
    fields, body = read_fields(data, pos, size, _HEADER)
    return _header(fields, body), body
