"""How many bytes a compressed page section really inflates to.

``pyarrow.decompress(data, decompressed_size=n)`` returns a buffer of ``n``
bytes whatever the codec wrote: a stream that inflates to fewer bytes
leaves the buffer's tail as it was allocated. Parquet readers compare the
codec's own output size with the page header's (PyArrow: "Page didn't
decompress to expected size"), so :func:`inflated_size` gives that size,
from the stream itself, for a stream ``pyarrow.decompress`` has read into
``n`` bytes without an error:

* Snappy: the stream's length preamble (Snappy's decoder checks that the
  tags produce exactly it);
* LZ4_RAW: exactly ``n`` when the block does not fit in ``n - 1`` bytes
  (-1, fewer, where it does);
* Zstd: the frames' content sizes from their headers (a frame without one
  is counted by decompressing the stream again, as a stream; -1 where that
  fails);
* Gzip: the members' output, inflated by zlib (PyArrow inflates every
  member until the input ends; with ``n`` 0 it reads nothing).

Pure host code, thread-safe.
"""

from __future__ import annotations

import zlib

import pyarrow as pa

__all__ = ["inflated_size"]

_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = 0x184D2A50  # the top 28 bits; the low 4 are any


class _Unknown(Exception):
    """A Zstd frame that does not state its content size."""


def _snappy(data: memoryview) -> int:
    length = shift = pos = 0
    while pos < len(data) and shift <= 28:  # a varint of at most 5 bytes
        b = data[pos]
        length |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return length
        shift += 7
    return -1


def _lz4_raw(data: memoryview, size: int) -> int:
    """``size`` where the block inflates to exactly ``size`` (>= 1) bytes, else -1
    (fewer). LZ4's safe decoder refuses to write past its capacity, so a block
    that fits in ``size`` bytes but not in ``size - 1`` inflates to exactly
    ``size``: a second run of the C decoder costs about what the first did,
    where walking the block's sequences in Python cost 50-150 times that."""
    try:
        pa.decompress(data, decompressed_size=size - 1, codec="lz4_raw")
    except (pa.ArrowException, OSError, ValueError):
        return size
    return -1


def _zstd_frame(data: memoryview, pos: int) -> tuple[int, int]:
    """(content size, the offset past the frame) of the frame at ``pos``."""
    magic = int.from_bytes(data[pos : pos + 4], "little")
    if magic & 0xFFFFFFF0 == _ZSTD_SKIPPABLE:
        return 0, pos + 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
    if magic != _ZSTD_MAGIC:
        raise _Unknown
    descriptor = data[pos + 4]
    single = descriptor >> 5 & 1
    fcs_bytes = (0 if not single else 1, 2, 4, 8)[descriptor >> 6]
    pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    if not fcs_bytes:
        raise _Unknown
    size = int.from_bytes(data[pos : pos + fcs_bytes], "little") + (256 if fcs_bytes == 2 else 0)
    pos += fcs_bytes
    while True:  # the blocks: a 3-byte header each
        header = int.from_bytes(data[pos : pos + 3], "little")
        kind, block = header >> 1 & 3, header >> 3
        pos += 3 + (1 if kind == 1 else block)
        if header & 1:
            break
    return size, pos + (4 if descriptor & 4 else 0)


def _zstd(data: memoryview) -> int:
    total = pos = 0
    try:
        while pos < len(data):
            size, pos = _zstd_frame(data, pos)
            total += size
    except (_Unknown, IndexError):
        try:
            return len(pa.CompressedInputStream(pa.py_buffer(data), "zstd").read())
        except (pa.ArrowException, OSError, ValueError):
            return -1  # not countable as a stream (a window past the stream decoder's)
    return total


def _gzip(data: memoryview, size: int) -> int:
    if size == 0:
        return 0
    total, rest = 0, bytes(data)
    while rest:
        member = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
        total += len(member.decompress(rest, size + 1 - total))
        if not member.eof or total > size:
            return total
        rest = member.unused_data
    return total


def inflated_size(data: memoryview, size: int, codec: str) -> int:
    """The bytes the ``codec`` stream ``data`` inflates to (``codec``: a
    ``pyarrow.decompress`` name), where ``pyarrow.decompress(data, size)``
    succeeded."""
    if codec == "snappy":
        return _snappy(data)
    if codec == "lz4_raw":
        return _lz4_raw(data, size)
    if codec == "zstd":
        return _zstd(data)
    if codec == "gzip":
        return _gzip(data, size)
    raise ValueError(f"no inflated size for codec {codec!r}")
