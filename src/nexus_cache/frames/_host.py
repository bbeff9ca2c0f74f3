"""Host side of the Arrow <-> device conversion: NumPy views of Arrow buffers.

:func:`host_piece` turns an Arrow array into the NumPy buffers a column is
built from (zero-copy views where the layouts agree; bit-packed booleans and
validity bitmaps are unpacked to one byte per row, offsets rebased to 0).
:func:`arrow_array` is the inverse, from host copies of device buffers.
Runs on the host only; never allocates device memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache.frames.column import ColumnKind, column_kind, storage_dtype

__all__ = ["HostPiece", "arrow_array", "host_piece"]


@dataclass(frozen=True)
class HostPiece:
    """NumPy buffers of one column over a run of rows (one row group, say)."""

    length: int
    data: np.ndarray
    offsets: np.ndarray | None = None
    validity: np.ndarray | None = None
    dictionary: pa.Array | None = None

    @property
    def nbytes(self) -> int:
        return sum(
            int(a.nbytes) for a in (self.data, self.offsets, self.validity) if a is not None
        )


def _unpack_bits(buf: pa.Buffer | None, offset: int, length: int) -> np.ndarray:
    if buf is None or length == 0:
        return np.zeros(length, np.bool_)
    bits = np.frombuffer(buf, np.uint8)
    return np.unpackbits(bits, count=offset + length, bitorder="little")[offset:].view(np.bool_)


def _view(buf: pa.Buffer | None, dtype: np.dtype[Any], start: int, count: int) -> np.ndarray:
    if buf is None or count == 0:
        return np.zeros(count, dtype)
    return np.frombuffer(buf, dtype, count=count, offset=start * dtype.itemsize)


def host_piece(array: pa.Array | pa.ChunkedArray, name: str = "?") -> HostPiece:
    """NumPy buffers of ``array`` (a chunked array is combined first)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    kind = column_kind(array.type, name)
    n, offset = len(array), array.offset
    validity = None
    if array.null_count:
        validity = _unpack_bits(array.buffers()[0], offset, n)
    if kind is ColumnKind.DICTIONARY:
        indices = host_piece(array.indices, name)
        return HostPiece(n, indices.data, None, validity, array.dictionary)
    buffers = array.buffers()
    if kind is ColumnKind.BOOL:
        return HostPiece(n, _unpack_bits(buffers[1], offset, n), None, validity)
    dtype = storage_dtype(array.type)
    if kind is ColumnKind.FIXED:
        return HostPiece(n, _view(buffers[1], dtype, offset, n), None, validity)
    offsets = _view(buffers[1], dtype, offset, n + 1)
    start, stop = int(offsets[0]), int(offsets[-1])
    data = _view(buffers[2], np.dtype(np.uint8), 0, stop)[start:]
    if start:
        offsets = offsets - offsets.dtype.type(start)
    return HostPiece(n, data, offsets, validity)


def _bitmap(mask: np.ndarray) -> tuple[pa.Buffer, int]:
    return pa.py_buffer(np.packbits(mask, bitorder="little")), int(len(mask) - mask.sum())


def arrow_array(
    arrow_type: pa.DataType,
    length: int,
    data: np.ndarray,
    offsets: np.ndarray | None,
    validity: np.ndarray | None,
    dictionary: pa.Array | None,
) -> pa.Array:
    """An Arrow array of ``arrow_type`` from host buffers laid out as a column's."""
    null_buf, nulls = (None, 0) if validity is None else _bitmap(validity)
    if null_buf is not None and nulls == 0:
        null_buf = None
    kind = column_kind(arrow_type)
    if kind is ColumnKind.DICTIONARY:
        indices = pa.py_buffer(np.ascontiguousarray(data))
        return pa.DictionaryArray.from_buffers(
            arrow_type, length, [null_buf, indices], dictionary, null_count=nulls
        )
    if kind is ColumnKind.BOOL:
        values = pa.py_buffer(np.packbits(data, bitorder="little"))
        return pa.Array.from_buffers(arrow_type, length, [null_buf, values], null_count=nulls)
    if kind is ColumnKind.FIXED:
        values = pa.py_buffer(np.ascontiguousarray(data))
        return pa.Array.from_buffers(arrow_type, length, [null_buf, values], null_count=nulls)
    assert offsets is not None
    start, stop = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    if start:
        offsets = offsets - offsets.dtype.type(start)
    bufs = [null_buf, pa.py_buffer(np.ascontiguousarray(offsets)), pa.py_buffer(data[start:stop])]
    return pa.Array.from_buffers(arrow_type, length, bufs, null_count=nulls)
