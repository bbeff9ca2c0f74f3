"""Page headers of the shapes writers such as PyArrow write, matched whole.

A v1 data page header or a dictionary page header as PyArrow writes it
(statistics included) is read by one regular expression instead of a loop
over its bytes: every field's head decides how the field is read, so a
header matches in one way or none, and the patterns check the fields'
ranges (a non-negative 32-bit size, a one-byte encoding) as
:func:`._page_headers.common_header` does. :func:`shape_row` gives the page's row
as :func:`.pages.read_pages` records it, or None for any other header (the
readers in :mod:`._page_headers` read it then, and name what is wrong). Stateless
and thread-safe (the varint cache only ever stores the value its key gives).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["shape_row"]

#: the page types the patterns match (their type bytes 0x00 and 0x04 are the
#: zigzag of parquet.thrift's DATA_PAGE and DICTIONARY_PAGE)
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2

#: A varint of one to five bytes whose zigzag value is a non-negative 32-bit
#: integer (the check :func:`._page_headers.common_header` makes): an even first
#: byte (not negative), and a fifth byte, if any, below 16 (below 2**31).
_EVEN_LOW = b"[" + b"".join(b"\\x%02x" % b for b in range(0, 0x80, 2)) + b"]"
_EVEN_HIGH = b"[" + b"".join(b"\\x%02x" % b for b in range(0x80, 0x100, 2)) + b"]"
_VARINT = (
    b"(" + _EVEN_LOW
    + b"|" + _EVEN_HIGH + rb"(?:[\x80-\xff]{0,2}[\x00-\x7f]|[\x80-\xff]{3}[\x00-\x0f]))"
)  # fmt: skip
_SMALL = b"(" + _EVEN_LOW + b")"  # a one-byte varint, not negative


def _heads(kinds: Sequence[int]) -> bytes:
    """A character class of the short-form field heads (id delta 1..15) of ``kinds``."""
    return b"[" + b"".join(b"\\x%02x" % (d << 4 | k) for d in range(1, 16) for k in kinds) + b"]"


#: a binary's lengths, the usual ones first (the order of alternatives)
_LENGTHS = [8, 4, 1, 12, 16, 2] + [n for n in range(128) if n not in (8, 4, 1, 12, 16, 2)]
#: One field of a statistics struct as :func:`._thrift._skip_struct` reads
#: it, of the kinds writers put there, short-form ids: a binary of fewer than
#: 128 bytes (one alternative a length, so the length byte picks the bytes
#: skipped), an integer (a varint of at most ten bytes), a boolean.
_STATISTICS_FIELD = (
    b"(?:" + _heads([8]) + b"(?:" + b"|".join(b"\\x%02x.{%d}" % (n, n) for n in _LENGTHS) + b")"
    + b"|" + _heads([4, 5, 6]) + rb"[\x80-\xff]{0,9}[\x00-\x7f]"
    + b"|" + _heads([1, 2]) + b")"
)  # fmt: skip
#: The data page header (v1) PyArrow and most writers write, whole: type 0,
#: the two sizes, a ``crc`` if any, then the v1 header's number of values and three encodings
#: (short-form field ids, in order), its statistics if any (of
#: :data:`_STATISTICS_FIELD`), and the two struct ends. Each field's head
#: decides how it is read, so a header matches in one way or none.
#: A page header's ``crc`` (field 4, read past: at most five bytes, as
#: :func:`._page_headers.common_header` reads it), then the nested header's field head
#: (field 5 or 7, a struct); without the ``crc``, the nested header's head alone.
_CRC = rb"\x15[\x80-\xff]{0,4}[\x00-\x7f]"
_DATA_V1_SHAPE = re.compile(
    rb"\x15\x00\x15" + _VARINT + rb"\x15" + _VARINT
    + rb"(?:\x2c|" + _CRC + rb"\x1c)\x15" + _VARINT
    + (rb"\x15" + _SMALL) * 3
    + rb"(?:\x1c" + _STATISTICS_FIELD + rb"*+\x00)?\x00\x00",
    re.DOTALL,
)  # fmt: skip
#: The dictionary page header PyArrow writes, whole: type 2, the two sizes,
#: a ``crc`` if any, then the dictionary header's number of values, encoding and ``is_sorted``
#: (if there), and the two struct ends.
_DICTIONARY_SHAPE = re.compile(
    rb"\x15\x04\x15" + _VARINT + rb"\x15" + _VARINT
    + rb"(?:\x4c|" + _CRC + rb"\x3c)\x15" + _VARINT
    + rb"\x15" + _SMALL + rb"[\x11\x12]?\x00\x00",
    re.DOTALL,
)  # fmt: skip


def _unzigzag(raw: bytes) -> int:
    """The compact-protocol integer whose varint (one to five bytes) is ``raw``."""
    x = int.from_bytes(raw, "little")
    u = (
        (x & 0x7F)
        | (x >> 1 & 0x3F80)
        | (x >> 2 & 0x1FC000)
        | (x >> 3 & 0xFE00000)
        | (x >> 4 & 0x7F0000000)
    )
    return (u >> 1) ^ -(u & 1)


class _Varints(dict[bytes, int]):
    """Varint bytes -> their integer (:func:`_unzigzag`'s), for the values pages
    share: a bounded cache (a race only stores the same value twice)."""

    def __missing__(self, raw: bytes) -> int:
        value = _unzigzag(raw)
        if len(self) < _KNOWN_MAX:
            self[raw] = value
        return value


_KNOWN_MAX = 1 << 12
_KNOWN = _Varints()


def shape_row(buf: Any, pos: int) -> tuple[int, ...] | None:
    """The row (as :func:`.pages.read_pages` records a
    page: type, sizes, number of values, encoding, level encodings (-1:
    none), where the header and the payload start) of the page header at ``buf[pos]`` when it has
    :data:`_DATA_V1_SHAPE` or :data:`_DICTIONARY_SHAPE` (the patterns check
    its fields' ranges too); else None."""
    m = _DATA_V1_SHAPE.match(buf, pos)
    known = _KNOWN
    if m is not None:
        usize, csize, values, encoding, def_encoding, rep_encoding = m.groups()
        return (
            _DATA_PAGE,
            known[usize],
            known[csize],
            known[values],
            encoding[0] >> 1,
            def_encoding[0] >> 1,
            rep_encoding[0] >> 1,
            pos,
            m.end(),
        )
    m = _DICTIONARY_SHAPE.match(buf, pos)
    if m is None:
        return None
    usize, csize, values, encoding = m.groups()
    return (
        _DICTIONARY_PAGE,
        known[usize],
        known[csize],
        known[values],
        encoding[0] >> 1,
        -1,
        -1,
        pos,
        m.end(),
    )
