"""Which column chunks the page decoder handles, decided before decoding.

:func:`footer_reason` looks at the footer alone (codec, physical and
logical type, levels, the Arrow type the chunk reads as);
:func:`pages_reason` then at the page headers (page types and encodings).
Each returns None when the chunk is supported, else a short reason
(``"codec BROTLI"``), so the caller sends that chunk to the host decoder
and can report why. Supported: flat columns (no repetition, definition
level at most 1), codecs UNCOMPRESSED / SNAPPY / GZIP / ZSTD / LZ4_RAW,
data pages v1 and v2, PLAIN and dictionary encodings (RLE as well for
booleans; a chunk read as a dictionary only when every data page is
dictionary-encoded), and these Arrow types from these physical types:

==================================  ==============
Arrow type                          physical type
==================================  ==============
int32, date32                       INT32
int64, timestamp (unit as stored)   INT64
float32 / float64                   FLOAT / DOUBLE
bool                                BOOLEAN
string, large_string, binary,       BYTE_ARRAY
large_binary
dictionary of those, int32 indices  BYTE_ARRAY, every data page
                                    dictionary-encoded
==================================  ==============

Stateless and thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.types as pat

from nexus_cache.frames.gpudecode.pages import (
    ChunkSpec,
    Encoding,
    Page,
    PageType,
    encoding_name,
    page_table,
)

__all__ = [
    "CODECS",
    "footer_reason",
    "is_dictionary_of_bytes",
    "pages_reason",
    "unsupported_reason",
]

#: codec names (as PyArrow reports them) -> ``pyarrow.decompress`` codec.
#: PyArrow reports Parquet's LZ4_RAW as "LZ4" (the Hadoop-framed LZ4 is not).
CODECS = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "ZSTD": "zstd",
    "LZ4": "lz4_raw",
    "LZ4_RAW": "lz4_raw",
}

_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}


def _type_reason(spec: ChunkSpec) -> str | None:
    t, physical, logical = spec.arrow_type, spec.physical_type, spec.logical.get("Type")
    if physical == "INT32" and (pat.is_int32(t) or (pat.is_date32(t) and logical == "Date")):
        return None
    if physical == "INT64" and pat.is_int64(t) and logical in ("None", "Int"):
        return None
    if physical == "INT64" and pat.is_timestamp(t) and logical == "Timestamp":
        stored = _UNITS.get(str(spec.logical.get("timeUnit")))
        if stored == t.unit:
            return None
        return f"timestamp stored in {spec.logical.get('timeUnit')} read as {t}"
    if (physical, t) in (("FLOAT", pa.float32()), ("DOUBLE", pa.float64())):
        return None
    if physical == "BOOLEAN" and pat.is_boolean(t):
        return None
    if physical == "BYTE_ARRAY" and _is_bytes(t):
        return None
    if physical == "BYTE_ARRAY" and is_dictionary_of_bytes(t):
        return None
    return f"type {t} from physical type {physical}"


def _is_bytes(t: pa.DataType) -> bool:
    return bool(
        pat.is_string(t) or pat.is_large_string(t) or pat.is_binary(t) or pat.is_large_binary(t)
    )


def is_dictionary_of_bytes(t: pa.DataType) -> bool:
    """Whether ``t`` is a dictionary of (large) strings or binaries with int32
    indices: the dictionary type the decoder builds from a chunk's dictionary page."""
    return bool(pat.is_dictionary(t) and pat.is_int32(t.index_type) and _is_bytes(t.value_type))


def footer_reason(spec: ChunkSpec) -> str | None:
    """Why the footer alone rules the chunk out, or None."""
    if "." in spec.column or spec.max_rep > 0 or spec.max_def > 1:
        return "nested column"
    if spec.codec not in CODECS:
        return f"codec {spec.codec}"
    return _type_reason(spec)


_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3  # PageType's, as plain ints


def pages_reason(spec: ChunkSpec, pages: Sequence[Page]) -> str | None:
    """Why the page headers rule the chunk out, or None.

    A chunk's pages have few distinct shapes (type and encodings): each is
    checked once, from the pages' table (:func:`.pages.page_table`), and
    only where one fails, or the dictionary page is not the first and only
    one, are the pages walked in order for the first reason."""
    table = page_table(pages)
    kinds = table.type.tolist()
    dictionaries = kinds.count(_DICTIONARY_PAGE)
    if dictionaries == 0 or (dictionaries == 1 and kinds[0] == _DICTIONARY_PAGE):
        shapes = set(
            zip(
                kinds,
                table.encoding.tolist(),
                table.def_encoding.tolist(),
                table.rep_bytes.tolist(),
                strict=True,
            )
        )
        if all(_shape_fits(spec, shape, dictionaries == 1) for shape in shapes):
            return None
    return _first_reason(spec, pages)


def _shape_fits(spec: ChunkSpec, shape: tuple[int, int, int, int], dictionary: bool) -> bool:
    """Whether a page of ``shape`` (its type, encoding, definition level
    encoding, -1 for none, and repetition levels' length) passes every check of
    :func:`_first_reason` that does not depend on the pages before it, in a
    chunk whose first page is its one dictionary page (``dictionary``) or
    that has none."""
    kind, encoding, def_encoding, rep_bytes = shape
    if kind == _DICTIONARY_PAGE:
        return encoding in (Encoding.PLAIN, Encoding.PLAIN_DICTIONARY)
    if kind not in (_DATA_PAGE, _DATA_PAGE_V2):
        return False
    keyed = encoding in (Encoding.PLAIN_DICTIONARY, Encoding.RLE_DICTIONARY)
    if keyed:
        if not dictionary:
            return False
    elif encoding != Encoding.PLAIN and not (
        encoding == Encoding.RLE and spec.physical_type == "BOOLEAN"
    ):
        return False
    if not keyed and is_dictionary_of_bytes(spec.arrow_type):
        return False
    if kind == _DATA_PAGE:
        return not spec.max_def or def_encoding == Encoding.RLE
    return not rep_bytes


def _first_reason(spec: ChunkSpec, pages: Sequence[Page]) -> str | None:
    """:func:`pages_reason` by walking the pages in order: the first reason."""
    values_encodings = {Encoding.PLAIN, Encoding.PLAIN_DICTIONARY, Encoding.RLE_DICTIONARY}
    if spec.physical_type == "BOOLEAN":
        values_encodings.add(Encoding.RLE)
    dictionary = False
    # read as a dictionary: the chunk's dictionary page is the column's, so
    # every data page must index it
    as_dictionary = is_dictionary_of_bytes(spec.arrow_type)
    for page in pages:
        h = page.header
        if h.type == PageType.DICTIONARY_PAGE:
            if dictionary:
                return "a second dictionary page"
            if h.encoding not in (Encoding.PLAIN, Encoding.PLAIN_DICTIONARY):
                return f"dictionary page {encoding_name(h.encoding)}"
            dictionary = True
            continue
        if h.type not in (PageType.DATA_PAGE, PageType.DATA_PAGE_V2):
            return f"page type {h.type}"
        if h.encoding not in values_encodings:
            return f"encoding {encoding_name(h.encoding)}"
        if h.encoding in (Encoding.PLAIN_DICTIONARY, Encoding.RLE_DICTIONARY) and not dictionary:
            return "dictionary-encoded page without a dictionary page"
        if as_dictionary and h.encoding not in (
            Encoding.PLAIN_DICTIONARY,
            Encoding.RLE_DICTIONARY,
        ):
            return (
                f"{encoding_name(h.encoding)} data pages (the writer gave up on the dictionary) "
                f"read as {spec.arrow_type}"
            )
        if h.type == PageType.DATA_PAGE and spec.max_def and h.def_encoding != Encoding.RLE:
            return f"definition levels {encoding_name(h.def_encoding or 0)}"
        if h.type == PageType.DATA_PAGE_V2 and h.rep_bytes:
            return "repetition levels"
    return None


def unsupported_reason(spec: ChunkSpec, pages: Sequence[Page] | None = None) -> str | None:
    """:func:`footer_reason`, then (when ``pages`` are given) :func:`pages_reason`."""
    reason = footer_reason(spec)
    if reason is None and pages is not None:
        reason = pages_reason(spec, pages)
    return reason
