"""The NumPy reference of the GPU page decoder: one column chunk to frame buffers.

It runs the same steps, on the same layouts, as the CUDA kernels of
:mod:`.kernels`, so it documents and tests their algorithm on any machine:

1. **Decompress** every page (pyarrow's codecs here, nvCOMP on the GPU):
   for a v1 data page the whole page, for a v2 data page only its values
   (its levels are stored uncompressed), each to exactly the size its
   header says, as the codec itself counts it (:mod:`._inflated`). The values of all pages, the
   dictionary first, form one buffer (the *heap*), each page at its base.
2. **Levels** (``hybrid_runs`` + ``hybrid_expand``): each data page's
   definition levels become one validity flag per row.
3. **Dense values** per page, one per non-null row: a PLAIN fixed-width
   page is its bytes; booleans are one bit-packed run (PLAIN) or a hybrid
   stream (RLE); dictionary pages' indices are unpacked and gathered from
   the dictionary (``dict_gather``, bounds-checked); PLAIN strings are
   walked once per page into (start in the heap, length) pairs
   (``plain_lengths``).
4. **Scatter** by a prefix sum: ``position = cumsum(valid) - 1``, and row
   *r* takes dense value ``position[r]`` when valid, else zero
   (``scatter_fixed``). Strings scatter their lengths the same way, an
   exclusive prefix sum of the lengths gives the offsets, and each row's
   bytes are copied from the heap (``copy_strings``). A chunk read as a
   dictionary keeps its indices (scattered as int32) and makes its
   dictionary page's strings the dictionary.

The result is a :class:`~nexus_cache.frames._host.HostPiece`: what the host
path produces for the same column chunk (values in the storage dtype, one
``bool`` per row for booleans and validity, offsets + bytes for strings,
indices and a dictionary for a dictionary; no validity when the chunk has
no nulls), so it is a drop-in for one chunk.
Malformed data raises :class:`~nexus_cache.errors.SourceFormatError`
naming the file, column and page offset. Pure host code, thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames._host import HostPiece, arrow_array
from nexus_cache.frames.column import storage_dtype
from nexus_cache.frames.gpudecode._hybrid import (
    HybridError,
    hybrid_expand,
    hybrid_runs,
    packed_run,
)
from nexus_cache.frames.gpudecode._inflated import inflated_size
from nexus_cache.frames.gpudecode.pages import (
    ChunkSpec,
    Encoding,
    Page,
    PageType,
    read_pages,
)
from nexus_cache.frames.gpudecode.support import (
    CODECS,
    is_dictionary_of_bytes,
    unsupported_reason,
)

__all__ = ["chunk_sections", "decode_chunk", "decompress_section", "page_sections"]

_PLAIN_DTYPES: dict[str, np.dtype[Any]] = {
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FLOAT": np.dtype("<f4"),
    "DOUBLE": np.dtype("<f8"),
}
_DICTIONARY = (Encoding.PLAIN_DICTIONARY, Encoding.RLE_DICTIONARY)
_INT32_MAX = (1 << 31) - 1


class _Bad(ValueError):
    """Malformed page data; turned into SourceFormatError with the page's place."""


def decompress_section(data: memoryview, size: int, codec: str | None) -> bytes:
    """``data`` decompressed by ``codec`` (a ``pyarrow.decompress`` name; None:
    stored as is) to exactly ``size`` bytes; ValueError when it is not."""
    if codec is None:
        if len(data) != size:
            raise _Bad(f"an uncompressed page holds {len(data)} bytes, its header says {size}")
        return bytes(data)
    if size == 0:  # nothing to inflate: PyArrow's reader does not read the stream either
        return b""
    try:
        out = pa.decompress(data, decompressed_size=size, codec=codec, asbytes=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise _Bad(f"{codec} decompression failed ({' '.join(str(exc).split())})") from exc
    # pa.decompress returns ``size`` bytes however many the codec wrote: the
    # stream's own size is what must match the header
    got = inflated_size(memoryview(data).cast("B"), size, codec)
    if got != size:
        got_text = f"{got} bytes" if got >= 0 else "fewer bytes"
        raise _Bad(f"{codec} data decompressed to {got_text}, the header says {size}")
    return bytes(out)


def page_sections(page: Page, spec: ChunkSpec) -> tuple[bytes, bytes]:
    """``(definition levels, values)`` of a page, decompressed; the levels of a
    v1 page without its 4-byte length, of a dictionary page empty."""
    h, codec = page.header, CODECS[spec.codec]
    if h.type == PageType.DATA_PAGE_V2:
        levels = bytes(page.payload[h.rep_bytes : h.rep_bytes + h.def_bytes])
        rest = page.payload[h.rep_bytes + h.def_bytes :]
        size = h.uncompressed_size - h.rep_bytes - h.def_bytes
        return levels, decompress_section(rest, size, codec if h.is_compressed else None)
    whole = decompress_section(page.payload, h.uncompressed_size, codec)
    if h.type != PageType.DATA_PAGE or not spec.max_def:
        return b"", whole
    if len(whole) < 4:
        raise _Bad("a data page ends before its definition levels")
    length = int.from_bytes(whole[:4], "little")
    if 4 + length > len(whole):
        raise _Bad(f"definition levels of {length} bytes run past the page")
    return whole[4 : 4 + length], whole[4 + length :]


def chunk_sections(pages: Sequence[Page], spec: ChunkSpec) -> list[tuple[bytes, bytes]]:
    """:func:`page_sections` of every page; SourceFormatError names the bad page."""
    out = []
    for page in pages:
        try:
            out.append(page_sections(page, spec))
        except _Bad as exc:
            raise SourceFormatError(
                f"{spec.where(page.offset)}: {exc}; the file is corrupt"
            ) from exc
    return out


def _validity(levels: bytes, count: int, spec: ChunkSpec) -> np.ndarray:
    """One flag per row of a data page: its definition level is the maximum."""
    if not spec.max_def:
        return np.ones(count, np.bool_)
    expanded = hybrid_expand(levels, hybrid_runs(levels, 1, count))
    if (expanded > spec.max_def).any():
        raise _Bad(f"a definition level exceeds the column's maximum {spec.max_def}")
    return expanded == spec.max_def


def _plain_fixed(values: bytes, count: int, dtype: np.dtype[Any]) -> np.ndarray:
    if count * dtype.itemsize > len(values):
        raise _Bad(
            f"{count} PLAIN values need {count * dtype.itemsize} bytes, the page has {len(values)}"
        )
    return np.frombuffer(values, dtype, count=count)


def _plain_strings(values: bytes, count: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(start in the heap, length) of ``count`` length-prefixed values (``plain_lengths``)."""
    starts = np.zeros(count, np.int64)
    lengths = np.zeros(count, np.int64)
    pos, end = 0, len(values)
    for k in range(count):
        if pos + 4 > end:
            raise _Bad(f"string value {k} runs past the page")
        length = int.from_bytes(values[pos : pos + 4], "little")
        if pos + 4 + length > end:
            raise _Bad(f"string value {k} of {length} bytes runs past the page")
        starts[k], lengths[k] = base + pos + 4, length
        pos += 4 + length
    return starts, lengths


def _plain(values: bytes, count: int, spec: ChunkSpec, base: int) -> Any:
    """Dense values of a PLAIN section: an array, or (starts, lengths) for strings."""
    if spec.physical_type == "BYTE_ARRAY":
        return _plain_strings(values, count, base)
    if spec.physical_type == "BOOLEAN":
        if (count + 7) // 8 > len(values):
            raise _Bad(f"{count} PLAIN booleans run past the page")
        return hybrid_expand(values, packed_run(count)).astype(np.bool_)
    return _plain_fixed(values, count, _PLAIN_DTYPES[spec.physical_type])


def _indices(values: bytes, count: int, size: int) -> np.ndarray:
    if not values:
        if not count:
            return np.zeros(0, np.int64)
        raise _Bad("a dictionary-encoded page lacks its bit width")
    # the bit width is checked even where no index follows (a page of nulls), as
    # PyArrow checks it
    indices = hybrid_expand(values[1:], hybrid_runs(values[1:], values[0], count))
    if indices.size and int(indices.max()) >= size:
        raise _Bad(f"a dictionary index {int(indices.max())} is past the {size} entries")
    return indices.astype(np.int64)


def _dense(
    page: Page, values: bytes, count: int, spec: ChunkSpec, base: int, dictionary: Any
) -> Any:
    h = page.header
    if h.encoding in _DICTIONARY and is_dictionary_of_bytes(spec.arrow_type):
        return _indices(values, count, len(dictionary[0]))  # read as a dictionary: kept
    if h.encoding in _DICTIONARY:  # dict_gather
        if isinstance(dictionary, tuple):
            idx = _indices(values, count, len(dictionary[0]))
            return dictionary[0][idx], dictionary[1][idx]
        return dictionary[_indices(values, count, len(dictionary))]
    if h.encoding == Encoding.RLE:  # booleans: a length-prefixed hybrid stream
        if len(values) < 4 or 4 + int.from_bytes(values[:4], "little") > len(values):
            raise _Bad("an RLE boolean stream runs past the page")
        stream = values[4 : 4 + int.from_bytes(values[:4], "little")]
        return hybrid_expand(stream, hybrid_runs(stream, 1, count)).astype(np.bool_)
    return _plain(values, count, spec, base)


def _scatter(valid: np.ndarray, dense: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``scatter_fixed``: row r takes dense[cumsum(valid)[r] - 1] when valid, else 0."""
    position = np.cumsum(valid, dtype=np.int64) - 1
    values = dense.view(dtype) if dense.dtype.itemsize == dtype.itemsize else dense
    out = np.zeros(len(valid), dtype)
    out[valid] = values[position[valid]]
    return out


def decode_chunk(chunk: Any, spec: ChunkSpec, pages: Sequence[Page] | None = None) -> HostPiece:
    """Decode the column chunk whose bytes are ``chunk`` (``spec.size`` bytes at
    ``spec.start``) into host buffers laid out as a frame column's.

    ``pages``: the chunk's pages when already read. Raises FrameTypeError
    when the chunk is not supported (check :func:`.unsupported_reason`
    first) and SourceFormatError for malformed data."""
    pages = read_pages(chunk, spec) if pages is None else pages
    reason = unsupported_reason(spec, pages)
    if reason is not None:
        raise FrameTypeError(f"{spec.where(spec.start)}: {reason} is decoded on the host only")
    heap: list[bytes] = []
    base = 0
    dictionary: Any = None
    valids: list[np.ndarray] = []
    denses: list[Any] = []
    for page in pages:
        try:
            levels, values = page_sections(page, spec)
            h = page.header
            if h.type == PageType.DICTIONARY_PAGE:
                dictionary = _plain(values, h.num_values, spec, base)
            else:
                valid = _validity(levels, h.num_values, spec)
                nulls = h.num_values - int(valid.sum())
                if h.num_nulls is not None and nulls != h.num_nulls:
                    raise _Bad(f"the levels hold {nulls} nulls, the header says {h.num_nulls}")
                valids.append(valid)
                denses.append(_dense(page, values, int(valid.sum()), spec, base, dictionary))
        except (_Bad, HybridError) as exc:
            raise SourceFormatError(
                f"{spec.where(page.offset)}: {exc}; the file is corrupt"
            ) from exc
        heap.append(values)
        base += len(values)
    valid = np.concatenate(valids) if valids else np.zeros(0, np.bool_)
    rows = len(valid)
    validity = None if valid.all() else valid
    if is_dictionary_of_bytes(spec.arrow_type):
        return _dictionary(valid, denses, dictionary, b"".join(heap), spec, validity)
    if spec.physical_type == "BYTE_ARRAY":
        starts = np.concatenate([d[0] for d in denses]) if denses else np.zeros(0, np.int64)
        lengths = np.concatenate([d[1] for d in denses]) if denses else np.zeros(0, np.int64)
        return _strings(valid, starts, lengths, b"".join(heap), spec.arrow_type, spec, validity)
    dtype = storage_dtype(spec.arrow_type)
    dense = np.concatenate(denses) if denses else np.zeros(0, dtype)
    return HostPiece(rows, _scatter(valid, dense, dtype), None, validity)


def _dictionary(
    valid: np.ndarray,
    indices: list[Any],
    dictionary: Any,
    heap: bytes,
    spec: ChunkSpec,
    validity: np.ndarray | None,
) -> HostPiece:
    """A chunk read as a dictionary (every data page dictionary-encoded): its
    indices scattered to rows as int32 (``dict_gather`` from the identity, so
    each is checked against the dictionary), and the dictionary page's values
    as the dictionary (``plain_lengths``, offsets, ``copy_strings``)."""
    value_type = spec.arrow_type.value_type
    starts, lengths = (np.zeros(0, np.int64),) * 2 if dictionary is None else dictionary
    dense = np.concatenate(indices) if indices else np.zeros(0, np.int64)
    data = _scatter(valid, dense.astype(np.int32), np.dtype(np.int32))
    every = np.ones(len(starts), np.bool_)
    values = _strings(every, starts, lengths, heap, value_type, spec, None)
    array = arrow_array(value_type, values.length, values.data, values.offsets, None, None)
    return HostPiece(len(valid), data, None, validity, array)


def _strings(
    valid: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    heap: bytes,
    arrow_type: pa.DataType,
    spec: ChunkSpec,
    validity: np.ndarray | None,
) -> HostPiece:
    row_lengths = _scatter(valid, lengths, np.dtype(np.int64))
    row_starts = _scatter(valid, starts, np.dtype(np.int64))
    offsets = np.zeros(len(valid) + 1, np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    total = int(offsets[-1])
    dtype = storage_dtype(arrow_type)
    if dtype == np.int32 and total > _INT32_MAX:
        raise FrameTypeError(
            f"{spec.where(spec.start)}: more than 2 GiB of string bytes in one chunk; "
            "read the column as large_string / large_binary"
        )
    # copy_strings: byte j of row r comes from heap[row_starts[r] + j - offsets[r]]
    source = np.repeat(row_starts - offsets[:-1], row_lengths) + np.arange(total, dtype=np.int64)
    data = np.frombuffer(heap, np.uint8)[source] if total else np.zeros(0, np.uint8)
    return HostPiece(len(valid), data, offsets.astype(dtype), validity)
