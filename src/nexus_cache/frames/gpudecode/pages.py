"""Column chunks of a Parquet file as tables of pages, read on the host.

:func:`chunk_spec` (:func:`chunk_specs`: a column's, in several row groups)
takes what the footer says about one column chunk (where it starts, how
long it is, its codec, physical type and levels) and :func:`read_pages`
walks the chunk's bytes into pages: each page's Thrift header decoded
straight into the chunk's :class:`PageTable` (one int64 array a field, what
the support check, the heap layout and the decode steps read), its payload
a slice of the chunk. A :class:`PageList` holds the table and makes a
:class:`Page` only when one is asked for (the refusal messages, the
reference decoder), so the walk makes no Python object a page. A header is
read by the first of three readers that takes it (:mod:`._page_headers`,
which also defines :class:`PageHeader`, :class:`PageType` and
:class:`Encoding`, exported here): one regular expression matching the
shapes PyArrow writes whole (:mod:`._header_shapes`, whose row the walk
records as it is), one loop over local variables for the common shape, and
the general reader, whose complaint the walk names here; all give the same
header. Nothing is decompressed or decoded here. Malformed bytes raise
:class:`~nexus_cache.errors.SourceFormatError` naming the file, the column
and the byte offset in the file; the walk reads each byte at most four
times (the two matches, the common reader, the general one), each in one
pass, and always advances, so hostile input cannot make it loop. Stateless
and thread-safe.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode._header_shapes import shape_row
from nexus_cache.frames.gpudecode._page_headers import (
    _DATA_PAGE,
    _DATA_PAGE_V2,
    Encoding,
    PageHeader,
    PageType,
    common_header,
    encoding_name,
    general_header,
)
from nexus_cache.frames.gpudecode._thrift import ThriftError

__all__ = [
    "ChunkSpec",
    "Encoding",
    "Page",
    "PageHeader",
    "PageList",
    "PageTable",
    "PageType",
    "chunk_spec",
    "chunk_specs",
    "encoding_name",
    "page_table",
    "read_pages",
]


class Page(NamedTuple):
    """A page: its header, where the header starts in the file, and its payload."""

    header: PageHeader
    offset: int
    payload: memoryview


class PageTable(NamedTuple):
    """A chunk's page headers as arrays (int64, one entry a page, in page order):
    what the heap layout, the support check and the decode steps read of
    every page, taken out of the headers once per chunk. ``nulls``: a v2
    page's ``num_nulls``, -1 for other pages; ``offset``: where the page's
    header starts in the file; ``def_encoding`` / ``rep_encoding``: a v1 data
    page's level encodings, ``num_rows``: a v2 page's, -1 for other pages
    (where its :class:`PageHeader` has None)."""

    type: np.ndarray
    uncompressed_size: np.ndarray
    compressed_size: np.ndarray
    num_values: np.ndarray
    encoding: np.ndarray
    def_bytes: np.ndarray
    rep_bytes: np.ndarray
    is_compressed: np.ndarray
    nulls: np.ndarray
    offset: np.ndarray
    def_encoding: np.ndarray
    rep_encoding: np.ndarray
    num_rows: np.ndarray


#: A page as :func:`read_pages` records it, a *row*: its type, sizes, number of
#: values, encoding, level encodings (-1: none), and where its header and its
#: payload start (offsets from the chunk's start). The fields a v2 page adds
#: (:data:`_EXTRA`) are kept apart, for the few pages that have them.
_ROW = 9
#: a page's ``def_bytes``, ``rep_bytes``, ``is_compressed``, ``nulls`` and
#: ``num_rows``, as most pages have them (v1 and dictionary pages)
_EXTRA = (0, 0, 1, -1, -1)
_EXTRA_COLUMN = np.array(_EXTRA, np.int64)[:, None]


def _header_row(
    header: PageHeader, offset: int, payload: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The row of ``header`` (of a page whose header starts at ``offset`` and
    whose payload at ``payload``) and its :data:`_EXTRA` fields, None as -1."""
    kind, usize, csize, values, encoding, def_encoding, rep_encoding, nulls, rows = header[:9]
    row = (
        kind,
        usize,
        csize,
        values,
        encoding,
        -1 if def_encoding is None else def_encoding,
        -1 if rep_encoding is None else rep_encoding,
        offset,
        payload,
    )
    extra = (
        header.def_bytes,
        header.rep_bytes,
        int(header.is_compressed),
        -1 if nulls is None or kind != _DATA_PAGE_V2 else nulls,
        -1 if rows is None else rows,
    )
    return row, extra


def _rows_table(rows: list[int], extras: dict[int, tuple[int, ...]], start: int) -> PageTable:
    """The PageTable of ``rows`` (:data:`_ROW` integers a page, one page after
    another; ``extras``: the :data:`_EXTRA` fields of the pages, by index,
    whose fields differ), offsets made file offsets by adding ``start``."""
    n = len(rows) // _ROW
    flat = np.frombuffer(array("q", rows), np.int64) if n else np.zeros(0, np.int64)
    # one contiguous row a field (the payloads' starts stay in the rows)
    columns = flat.reshape(n, _ROW)[:, : _ROW - 1].T.copy()
    kind, usize, csize, values, encoding, def_encoding, rep_encoding, offset = columns
    offset += start
    extra = np.empty((len(_EXTRA), n), np.int64)
    extra[:] = _EXTRA_COLUMN
    if extras:
        index = np.fromiter(extras, np.int64, len(extras))
        extra[:, index] = np.array(list(extras.values()), np.int64).reshape(-1, 5).T
    def_bytes, rep_bytes, compressed, nulls, num_rows = extra
    table = PageTable(
        kind,
        usize,
        csize,
        values,
        encoding,
        def_bytes,
        rep_bytes,
        compressed,
        nulls,
        offset,
        def_encoding,
        rep_encoding,
        num_rows,
    )
    return table


def page_table(pages: Sequence[Page]) -> PageTable:
    """The :class:`PageTable` of ``pages`` (a :class:`PageList`'s own table, or
    one built from the headers of a list of pages)."""
    if type(pages) is PageList:
        return pages.table
    rows: list[int] = []
    extras: dict[int, tuple[int, ...]] = {}
    for i, page in enumerate(pages):
        row, extra = _header_row(page.header, page.offset, -1)
        rows += row
        if extra != _EXTRA:
            extras[i] = extra
    return _rows_table(rows, extras, 0)


class PageList(Sequence[Page]):
    """A chunk's pages, as :func:`read_pages` reads them: their headers as a
    :class:`PageTable` (``table``), each :class:`Page` (header and payload
    view) made only when one is asked for (the refusal messages, the
    reference decoder, a page laid out on its own), so a walk makes no Python
    object a page. Immutable; thread-safe."""

    __slots__ = ("_data", "_extras", "_rows", "_start", "table")

    def __init__(
        self,
        table: PageTable,
        rows: list[int],
        extras: dict[int, tuple[int, ...]],
        data: Any,
        start: int,
    ) -> None:
        self.table = table
        # the walk's rows (:data:`_ROW` integers a page, offsets from the
        # chunk's start) and the v2 pages' :data:`_EXTRA` fields, by index
        self._rows, self._extras = rows, extras
        self._data = data  # the chunk's bytes, from file offset ``start``
        self._start = start

    def __len__(self) -> int:
        return len(self._rows) // _ROW

    @overload
    def __getitem__(self, index: int) -> Page: ...

    @overload
    def __getitem__(self, index: slice) -> list[Page]: ...

    def __getitem__(self, index: int | slice) -> Page | list[Page]:
        if isinstance(index, slice):
            return [self._page(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"page {index} of {n}")
        return self._page(index % n)

    def __iter__(self) -> Iterator[Page]:
        for i in range(len(self)):
            yield self._page(i)

    def _page(self, i: int) -> Page:
        kind, usize, csize, values, encoding, def_encoding, rep_encoding, offset, payload = (
            self._rows[i * _ROW : i * _ROW + _ROW]
        )
        def_bytes, rep_bytes, compressed, nulls, rows = self._extras.get(i, _EXTRA)
        header = PageHeader(
            kind,
            usize,
            csize,
            values,
            encoding,
            None if def_encoding < 0 else def_encoding,
            None if rep_encoding < 0 else rep_encoding,
            None if nulls < 0 else nulls,
            None if rows < 0 else rows,
            def_bytes,
            rep_bytes,
            bool(compressed),
        )
        return Page(header, self._start + offset, self._data[payload : payload + csize])


@dataclass(frozen=True)
class ChunkSpec:
    """What the footer says about one column chunk, and the Arrow type it reads as.

    ``start``/``size``: the chunk's byte range in the file (dictionary page
    first, when it has one). ``codec`` and ``physical_type`` are the names
    PyArrow gives (``"SNAPPY"``, ``"INT64"``). ``logical`` is the Parquet
    logical type as PyArrow's JSON. ``source`` names the file in messages.
    """

    source: str
    column: str
    row_group: int
    start: int
    size: int
    num_values: int
    uncompressed_size: int
    codec: str
    physical_type: str
    logical: dict[str, Any]
    max_def: int
    max_rep: int
    arrow_type: pa.DataType

    def where(self, offset: int) -> str:
        return (
            f"{self.source!r}, column {self.column!r} of row group {self.row_group}, byte {offset}"
        )


def chunk_spec(pf: pq.ParquetFile, row_group: int, column: int, source: str) -> ChunkSpec:
    """The :class:`ChunkSpec` of leaf column ``column`` of ``row_group`` of ``pf``."""
    return chunk_specs(pf, [row_group], column, source)[0]


def chunk_specs(
    pf: pq.ParquetFile, row_groups: Sequence[int], column: int, source: str
) -> list[ChunkSpec]:
    """The :class:`ChunkSpec` of leaf column ``column`` in each of ``row_groups``
    of ``pf``: what the column's chunks share (its type, levels, the Arrow
    type it reads as) looked up once."""
    import json

    leaf = pf.schema.column(column)
    logical = leaf.logical_type.to_json()
    max_def, max_rep = int(leaf.max_definition_level), int(leaf.max_repetition_level)
    arrow_schema = pf.schema_arrow
    metadata = pf.metadata
    out = []
    for row_group in row_groups:
        meta = metadata.row_group(row_group).column(column)
        start = int(meta.data_page_offset)
        dict_offset = meta.dictionary_page_offset
        if meta.has_dictionary_page and dict_offset is not None and 0 < dict_offset < start:
            start = int(dict_offset)
        name = str(meta.path_in_schema)
        top = name.split(".")[0]
        arrow_type = arrow_schema.field(top).type if top in arrow_schema.names else pa.null()
        num_values = int(meta.num_values)
        spec = ChunkSpec(
            source=source,
            column=name,
            row_group=row_group,
            start=start,
            # A chunk of no values needs no pages (writers leave odd offsets there).
            size=int(meta.total_compressed_size) if num_values else 0,
            num_values=num_values,
            uncompressed_size=int(meta.total_uncompressed_size),
            codec=str(meta.compression),
            physical_type=str(meta.physical_type),
            logical=json.loads(logical),
            max_def=max_def,
            max_rep=max_rep,
            arrow_type=arrow_type,
        )
        out.append(spec)
    return out


_DATA_TYPES = frozenset((_DATA_PAGE, _DATA_PAGE_V2))


def read_pages(chunk: Any, spec: ChunkSpec) -> PageList:
    """Every page of the column chunk whose bytes are ``chunk`` (exactly
    ``spec.size`` bytes from ``spec.start`` of the file), in order, as a
    :class:`PageList` (the headers read straight into its table).

    Raises SourceFormatError naming the file, column and file offset when a
    header is malformed, a payload runs past the chunk, or the data pages
    hold other than the footer's ``num_values``, or the pages' uncompressed
    sizes exceed the footer's: so decoding a chunk allocates no more than
    its footer states."""
    data = memoryview(chunk).cast("B")
    if len(data) != spec.size:
        raise SourceFormatError(
            f"{spec.where(spec.start)}: the column chunk is {len(data)} bytes, "
            f"the footer says {spec.size}; the file is truncated or corrupt"
        )
    rows: list[int] = []
    extras: dict[int, tuple[int, ...]] = {}  # the v2 pages' fields (_EXTRA)
    shaped = shape_row
    pos = values = inflated = 0
    size, start, limit = len(data), spec.start, spec.uncompressed_size
    while pos < size:
        row = shaped(data, pos)
        if row is None:
            common = common_header(data, pos)
            header, body = common if common is not None else _general_header(data, pos, size, spec)
            row, extra = _header_row(header, pos, body)
            if extra != _EXTRA:
                extras[len(rows) // _ROW] = extra
        kind, usize, csize, count = row[:4]
        end = row[8] + csize
        if end > size:
            raise SourceFormatError(
                f"{spec.where(start + pos)}: a page of {csize} bytes "
                "runs past the column chunk; the file is truncated or corrupt"
            )
        # The footer's sizes bound what decompression may allocate.
        inflated += usize
        if inflated > limit:
            raise SourceFormatError(
                f"{spec.where(start + pos)}: the pages inflate past the "
                f"{spec.uncompressed_size} bytes the footer states; the file is corrupt"
            )
        rows += row
        if kind in _DATA_TYPES:
            values += count
        pos = end  # a header is at least one byte, so every step advances
    if values != spec.num_values:
        raise SourceFormatError(
            f"{spec.where(start)}: the pages hold {values} values, the footer says "
            f"{spec.num_values}; the file is corrupt"
        )
    return PageList(_rows_table(rows, extras, start), rows, extras, data, start)


def _general_header(data: Any, pos: int, size: int, spec: ChunkSpec) -> tuple[PageHeader, int]:
    """The page header at ``data[pos]`` by the general reader; SourceFormatError
    naming where and what when it is malformed."""
    try:
        return general_header(data, pos, size)
    except ThriftError as exc:
        raise SourceFormatError(
            f"{spec.where(spec.start + pos)}: unreadable page header ({exc} of the "
            "column chunk); the file is truncated or corrupt"
        ) from exc
