"""The decode steps of a heap's chunks on the device (a merged chunk: one
column's chunks of several row groups), with as few reads back as the data
allows.

:func:`decode_all` decodes every chunk of a :class:`._heap._Heap` in three
phases, each ending in one read back for all the chunks together:

1. levels: each chunk's definition levels expanded to validity flags and
   positions (``cumsum(valid) - 1``); then one read of every chunk's
   positions at its page ends (so the non-null values of each page), its
   error flag, and the first bytes of the values of its pages that start
   with a header (an index stream's bit width, an RLE boolean stream's
   length);
2. values: each chunk's pages decoded in groups (the longest runs of
   pages of one encoding kind, one launch per kernel over a page table)
   and scattered to rows (where every row holds a value the dense values
   are the rows: no scatter); a string chunk up to its offsets (its
   lengths written after a zero, so one prefix sum gives them); then one
   read of every string chunk's byte count and error flag;
3. strings: each string chunk's bytes copied; then one read of every
   chunk's error flag.

A chunk read as a dictionary (``dictionary<string|binary, int32>``, every
data page dictionary-encoded) keeps its indices: they are gathered from the
identity (``dict_gather`` checks each against the dictionary's size) and
scattered to rows as int32, and its dictionary page's strings become the
chunk's dictionary, as a string chunk of one PLAIN page.

The steps are the NumPy reference's (:mod:`.reference`), kernel for step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames.column import storage_dtype
from nexus_cache.frames.gpudecode._heap import (
    DataPages,
    DeviceChunk,
    _Chunk,
    _i64,
    _launch,
    _upload,
)
from nexus_cache.frames.gpudecode._hybrid import MAX_BIT_WIDTH
from nexus_cache.frames.gpudecode.pages import Encoding
from nexus_cache.frames.gpudecode.support import is_dictionary_of_bytes

__all__ = ["decode_all"]

_PLAIN_DICTIONARY, _RLE_DICTIONARY = int(Encoding.PLAIN_DICTIONARY), int(Encoding.RLE_DICTIONARY)
_RLE = int(Encoding.RLE)
_PLAIN_BYTES = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}
_INT32_MAX = (1 << 31) - 1


def _keyed(encoding: np.ndarray) -> np.ndarray:
    """Which of the pages of ``encoding`` are dictionary-encoded (two compares,
    not ``np.isin``'s sort: a page table is small, and this runs per chunk)."""
    return (encoding == _RLE_DICTIONARY) | (encoding == _PLAIN_DICTIONARY)  # type: ignore[no-any-return]


@dataclass
class _Levels:
    """One chunk after phase 1: validity and positions on the device; which
    pages' first bytes it reads back (``headed``: their indices)."""

    valid: Any
    position: Any
    rows: int
    bounds: np.ndarray
    headed: np.ndarray


def _levels(c: _Chunk) -> tuple[_Levels, list[Any]]:
    """Phase 1 of a chunk: launches only; returns the device values to read back
    (page ends, the error flag, the heads), in that order."""
    cp, spec, pages = c.cp, c.spec, c.data_pages
    rows = int(pages.rows.sum())
    bounds = np.concatenate([[0], np.cumsum(pages.rows)]).astype(np.int64)
    if spec.max_def:
        ones = np.ones(len(pages), np.int32)
        levels = c.expand(pages.levels_start, pages.levels_end, ones, pages.rows)
        valid = cp.zeros(max(rows, 1), np.uint8)[:rows]
        _launch(
            "levels_validity",
            None,
            rows,
            (levels, np.uint32(spec.max_def), valid, c.error, np.int64(rows)),
        )
        del levels
    else:
        valid = cp.ones(max(rows, 1), np.uint8)[:rows]
    position = cp.cumsum(valid, dtype=np.int64)
    position -= 1  # in place: no second array of the rows' size
    # the positions at the page ends (a page of no rows ends where the one
    # before it ends; fixed on the host)
    last = cp.asarray(np.maximum(bounds[1:] - 1, 0))
    ends = position[last] + 1 if rows else cp.zeros(len(pages), np.int64)
    # the pages whose values start with a header read back (a bit width, a length)
    headed = np.flatnonzero(_keyed(pages.encoding) | (pages.encoding == _RLE))
    heads = c.gather(pages.values_start[headed])
    reads = [ends, c.error.astype(np.int64), heads.astype(np.int64)]
    return _Levels(valid, position, rows, bounds, headed), reads


def _read_back(cp: Any, parts: list[Any]) -> list[np.ndarray]:
    """Every device array of ``parts`` (int64), read back in one copy."""
    sizes = [int(p.size) for p in parts]
    flat = cp.concatenate(parts).get() if sum(sizes) else np.zeros(0, np.int64)
    out, at = [], 0
    for n in sizes:
        out.append(np.asarray(flat[at : at + n], np.int64))
        at += n
    return out


def decode_all(chunks: Sequence[_Chunk]) -> list[DeviceChunk]:
    """Every chunk decoded (see the module notes). SourceFormatError names the
    first chunk found malformed."""
    if not chunks:
        return []
    cp = chunks[0].cp
    staged, parts = [], []
    for c in chunks:
        levels, reads = _levels(c)
        staged.append(levels)
        parts.extend(reads)
    got = _read_back(cp, parts)
    results: list[Any] = []
    for k, (c, lv) in enumerate(zip(chunks, staged, strict=True)):
        ends, error, heads = got[3 * k : 3 * k + 3]
        if error[0]:
            raise c.malformed("a definition level")
        ends = np.where(lv.bounds[1:] > 0, ends, 0).astype(np.int64)
        head = np.zeros(len(c.data_pages), np.int64)
        head[lv.headed] = heads
        results.append(_values(c, lv, ends, head))
    strings = [k for k, r in enumerate(results) if isinstance(r, (_Strings, _Dictionary))]
    reads = []
    for k in strings:
        r = results[k]
        own = r.values if isinstance(r, _Dictionary) else r
        reads += [own.offsets[-1:], chunks[k].error.astype(np.int64)]
    got = _read_back(cp, reads)
    for j, k in enumerate(strings):
        total, error = int(got[2 * j][0]), got[2 * j + 1][0]
        if error:  # before the lengths size an allocation
            raise chunks[k].malformed("a string or index stream")
        r, arrow_type = results[k], chunks[k].spec.arrow_type
        if isinstance(r, _Dictionary):
            values = _string_bytes(chunks[k], r.values, total, arrow_type.value_type)
            results[k] = replace(r.indices, dictionary=values)
        else:
            results[k] = _string_bytes(chunks[k], r, total, arrow_type)
    errors = _read_back(cp, [cp.concatenate([c.error.astype(np.int64) for c in chunks])])[0]
    for c, error in zip(chunks, errors, strict=True):
        if error:
            raise c.malformed("a level, index or value stream")
    return results


def _groups(pages: DataPages, counts: np.ndarray) -> list[tuple[bool, np.ndarray]]:
    """The longest runs of consecutive pages with values that share an encoding
    kind: ``(dictionary-encoded, page indices)`` each."""
    with_values = np.flatnonzero(counts)
    if not with_values.size:
        return []
    kind = _keyed(pages.encoding[with_values])
    cuts = np.flatnonzero(kind[1:] != kind[:-1]) + 1
    if not cuts.size:  # one kind (the usual chunk): one group, no split
        return [(bool(kind[0]), with_values)]
    return [
        (bool(kind[at]), members)
        for at, members in zip([0, *cuts.tolist()], np.split(with_values, cuts), strict=True)
    ]


class _Rows(NamedTuple):
    """Some pages of a chunk (a group's, or its dictionary pages), as arrays:
    where each header starts in the file, its values ``[start, end)`` in the
    heap, its non-null values and their encoding."""

    offset: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nonnull: np.ndarray
    encoding: np.ndarray

    def __len__(self) -> int:  # the pages, not the fields
        return int(self.nonnull.size)

    def at(self, k: int) -> _Rows:
        """Page ``k`` alone."""
        return _Rows(*(f[k : k + 1] for f in self))


def _group_rows(pages: DataPages, members: np.ndarray, counts: np.ndarray) -> _Rows:
    return _Rows(
        pages.offset[members],
        pages.values_start[members],
        pages.values_end[members],
        counts[members],
        pages.encoding[members],
    )


def _dictionary_rows(c: _Chunk) -> _Rows:
    """The chunk's dictionary pages (their entries as the count)."""
    d = c.dictionaries
    return _Rows(
        _i64([page.offset for page, _, _ in d]),
        _i64([v0 for _, v0, _ in d]),
        _i64([v1 for _, _, v1 in d]),
        _i64([page.header.num_values for page, _, _ in d]),
        _i64([page.header.encoding for page, _, _ in d]),
    )


def _first_bad(c: _Chunk, rows: _Rows, bad: np.ndarray, what: Any) -> None:
    """SourceFormatError for the first page of ``rows`` where ``bad`` holds
    (``what(k)``: its message), if any."""
    found = np.flatnonzero(bad)
    if found.size:
        k = int(found[0])
        raise _bad(c, int(rows.offset[k]), what(k))


@dataclass
class _Strings:
    """A string chunk after phase 2: its rows' starts in the heap and offsets."""

    rows: int
    row_starts: Any
    offsets: Any
    validity: Any


@dataclass
class _Dictionary:
    """A chunk read as a dictionary after phase 2: its indices, done, and its
    dictionary page's strings (bytes still to copy)."""

    indices: DeviceChunk
    values: _Strings


def _values(c: _Chunk, lv: _Levels, ends: np.ndarray, heads: np.ndarray) -> Any:
    """Phase 2 of a chunk (``ends``: its positions at the page ends; ``heads``:
    its pages' first values bytes, 0 where not read): a DeviceChunk, or a
    :class:`_Strings`."""
    cp, spec, rows, pages = c.cp, c.spec, lv.rows, c.data_pages
    dense_base = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    counts = ends - dense_base
    nulls = pages.rows - counts
    wrong = np.flatnonzero((pages.nulls >= 0) & (nulls != pages.nulls))
    if wrong.size:
        k = int(wrong[0])
        raise SourceFormatError(
            f"{c.where(int(pages.offset[k]))}: the levels hold {int(nulls[k])} nulls, "
            f"the header says {int(pages.nulls[k])}; the file is corrupt"
        )
    widths = np.where(_keyed(pages.encoding), heads & 0xFF, 0)
    # every dictionary-encoded page's bit width, a page of nulls' too (PyArrow
    # refuses one past 32 where no index follows); ``heads``: 0 where not read
    wide = np.flatnonzero((widths > MAX_BIT_WIDTH) & (pages.values_end > pages.values_start))
    if wide.size:
        k = int(wide[0])
        raise _bad(
            c, int(pages.offset[k]), f"bit width {int(widths[k])} is outside 0..{MAX_BIT_WIDTH}"
        )
    nonnull = int(ends[-1]) if len(ends) else 0
    # no validity when every row holds a value (known from the counts)
    validity = None if nonnull == rows else lv.valid.astype(np.bool_)
    groups = _groups(pages, counts)
    as_dictionary = is_dictionary_of_bytes(spec.arrow_type)
    if spec.physical_type == "BYTE_ARRAY" and not as_dictionary:
        return _string_rows(c, lv, heads, groups, (dense_base, counts), nonnull, validity)
    dtype = np.dtype(np.int32) if as_dictionary else storage_dtype(spec.arrow_type)
    dense = cp.zeros(max(nonnull, 1), dtype)[:nonnull]
    dictionary = values = None
    entries = _dictionary_rows(c)
    sizes = entries.nonnull
    if as_dictionary:
        values = _dictionary_values(c)
        # the identity: the gather checks each index against the dictionary's size
        dictionary = cp.arange(max(values.rows, 1), dtype=np.int32)[: values.rows]
        sizes = _i64([values.rows] * len(c.dictionaries))
    elif c.dictionaries:
        # every row group's dictionary, one after another, in one launch
        total = int(sizes.sum())
        dictionary = cp.zeros(max(total, 1), dtype)[:total]
        if spec.physical_type == "BOOLEAN":
            _first_bad(
                c,
                entries,
                (entries.nonnull + 7) // 8 > entries.end - entries.start,
                lambda k: f"{int(entries.nonnull[k])} PLAIN booleans run past the page",
            )
            dictionary[...] = c.packed_runs(entries.start, entries.nonnull).astype(np.bool_)
        else:
            _plain_fixed(c, entries, dictionary)
    for is_dict, members in groups:
        g0 = int(dense_base[members[0]])
        g1 = int(dense_base[members[-1]] + counts[members[-1]])
        part = dense[g0:g1]
        table = _group_rows(pages, members, counts)
        if is_dict:
            indices = _indices(c, table, heads[members])
            dictionaries = _page_dictionaries(c, members, dense_base, sizes)
            _launch(
                "dict_gather",
                dtype.itemsize,
                g1 - g0,
                (indices, dictionary, *dictionaries, part, c.error, np.int64(g1 - g0)),
            )
        elif as_dictionary:  # the support check refuses this
            raise _bad(c, int(table.offset[0]), "a PLAIN page in a chunk read as a dictionary")
        elif spec.physical_type == "BOOLEAN":
            part[...] = _booleans(c, table, heads[members]).astype(np.bool_)
        else:
            _plain_fixed(c, table, part)
    out = dense  # every row holds a value: the dense values are the rows
    if nonnull != rows:
        out = cp.zeros(max(rows, 1), dtype)[:rows]
        _launch(
            "scatter_values",
            dtype.itemsize,
            rows,
            (lv.valid, lv.position, dense, out, np.int64(rows)),
        )
    if values is not None:
        return _Dictionary(DeviceChunk(rows, out, None, validity), values)
    return DeviceChunk(rows, out, None, validity)


def _bad(c: _Chunk, offset: int, what: str) -> SourceFormatError:
    return SourceFormatError(f"{c.where(offset)}: {what}; the file is corrupt")


def _page_dictionaries(
    c: _Chunk, members: np.ndarray, dense_base: np.ndarray, sizes: np.ndarray
) -> tuple[Any, Any, Any, np.int32]:
    """The page table of ``dict_gather`` / ``dict_strings`` for the data pages
    ``members`` of a group (their values one after another): each page's
    first value in the group, and its dictionary's first entry and size among
    the chunk's dictionaries (``sizes``: theirs, one after another), in one
    upload. SourceFormatError for a page whose row group has no dictionary."""
    bases = np.cumsum(sizes) - sizes
    which = c.data_pages.dictionary[members]
    missing = np.flatnonzero(which < 0)
    if missing.size:  # the support check refuses this
        offset = int(c.data_pages.offset[members[int(missing[0])]])
        raise _bad(c, offset, "a dictionary-encoded page without a dictionary")
    first = dense_base[members] - dense_base[members[0]]
    uploaded = _upload(c.cp, _i64(first), _i64(bases[which]), _i64(sizes[which]))
    return (*uploaded, np.int32(len(members)))


def _plain_fixed(c: _Chunk, table: _Rows, out: Any) -> None:
    """``plain_fixed`` over every page of ``table`` (their values one after
    another in ``out``), one launch."""
    width = _PLAIN_BYTES[c.spec.physical_type]
    counts = table.nonnull
    room = table.end - table.start
    _first_bad(
        c,
        table,
        counts * width > room,
        lambda k: (
            f"{int(counts[k])} PLAIN values need {int(counts[k]) * width} bytes, "
            f"the page has {int(room[k])}"
        ),
    )
    base = np.cumsum(counts) - counts
    total = int(counts.sum())
    starts, base_d = _upload(c.cp, _i64(table.start), _i64(base))  # one upload
    _launch(
        "plain_fixed",
        width,
        total,
        (
            c.heap,
            starts,
            base_d,
            np.int32(len(table)),
            out,
            np.int64(total),
        ),
    )


def _booleans(c: _Chunk, table: _Rows, heads: np.ndarray) -> Any:
    """Every page of ``table`` is PLAIN, or every one RLE (a group holds one encoding
    kind; booleans have two non-dictionary encodings, so split them here)."""
    rle = table.encoding == _RLE
    room = table.end - table.start
    if rle.all():
        _first_bad(
            c,
            table,
            (room < 4) | (4 + heads > room),
            lambda k: "an RLE boolean stream runs past the page",
        )
        start = table.start + 4
        return c.expand(start, start + heads, np.ones(len(table), np.int32), table.nonnull)
    if not rle.any():
        _first_bad(
            c,
            table,
            (table.nonnull + 7) // 8 > room,
            lambda k: f"{int(table.nonnull[k])} PLAIN booleans run past the page",
        )
        return c.packed_runs(table.start, table.nonnull)
    # PLAIN and RLE pages mixed in one run (no writer does this): one at a time
    return c.cp.concatenate(
        [_booleans(c, table.at(k), heads[k : k + 1]) for k in range(len(table))]
    )


def _indices(c: _Chunk, table: _Rows, heads: np.ndarray) -> Any:
    """The dictionary indices of every page of ``table``, one after another."""
    _first_bad(
        c,
        table,
        table.end <= table.start,
        lambda k: "a dictionary-encoded page lacks its bit width",
    )
    return c.expand(table.start + 1, table.end, heads & 0xFF, table.nonnull)


def _string_table(c: _Chunk, table: _Rows, starts: Any, lengths: Any) -> None:
    """``plain_lengths`` over every page of ``table``, one launch (one thread a page)."""
    counts = _i64(table.nonnull)
    base = np.cumsum(counts) - counts
    page_starts, page_ends, base_d, counts_d = _upload(  # one upload
        c.cp, _i64(table.start), _i64(table.end), base, counts
    )
    _launch(
        "plain_lengths",
        None,
        len(table),
        (
            c.heap,
            page_starts,
            page_ends,
            base_d,
            counts_d,
            starts,
            lengths,
            c.error,
            np.int32(len(table)),
        ),
    )


def _string_rows(
    c: _Chunk,
    lv: _Levels,
    heads: np.ndarray,
    groups: list[tuple[bool, np.ndarray]],
    pages: tuple[np.ndarray, np.ndarray],
    nonnull: int,
    validity: Any,
) -> _Strings:
    """Phase 2 of a string chunk: its rows' starts and offsets (``pages``: each
    page's first dense value and count)."""
    cp, rows = c.cp, lv.rows
    dense_base, counts = pages
    starts = cp.zeros(max(nonnull, 1), np.int64)[:nonnull]
    buffer, lengths = _lengths(cp, nonnull)
    dict_starts, dict_buffer = _dictionary_strings(c)
    dict_lengths = dict_buffer[1:]
    sizes = _dictionary_rows(c).nonnull
    for is_dict, members in groups:
        g0 = int(dense_base[members[0]])
        g1 = int(dense_base[members[-1]] + counts[members[-1]])
        table = _group_rows(c.data_pages, members, counts)
        if is_dict:
            indices = _indices(c, table, heads[members])
            _launch(
                "dict_strings",
                None,
                g1 - g0,
                (
                    indices,
                    dict_starts,
                    dict_lengths,
                    *_page_dictionaries(c, members, dense_base, sizes),
                    starts[g0:g1],
                    lengths[g0:g1],
                    c.error,
                    np.int64(g1 - g0),
                ),
            )
        else:
            _string_table(c, table, starts[g0:g1], lengths[g0:g1])
    if nonnull == rows:  # every row holds a value: the dense strings are the rows
        return _Strings(rows, starts, _offsets(cp, buffer), validity)
    row_buffer, row_lengths = _lengths(cp, rows)
    row_starts = cp.zeros(max(rows, 1), np.int64)[:rows]
    valid, position = lv.valid, lv.position
    _launch("scatter_values", 8, rows, (valid, position, lengths, row_lengths, np.int64(rows)))
    _launch("scatter_values", 8, rows, (valid, position, starts, row_starts, np.int64(rows)))
    return _Strings(rows, row_starts, _offsets(cp, row_buffer), validity)


def _lengths(cp: Any, n: int) -> tuple[Any, Any]:
    """``(buffer, lengths)``: zeroed int64 room for ``n`` string lengths
    (``lengths``) after a zero, whose running sum is their offsets
    (:func:`_offsets`), with no copy of the lengths."""
    buffer = cp.zeros(n + 1, np.int64)
    return buffer, buffer[1:]


def _offsets(cp: Any, buffer: Any) -> Any:
    """The int64 offsets of the strings whose lengths ``buffer`` (from
    :func:`_lengths`) holds: 0, then their running sum."""
    return cp.cumsum(buffer, dtype=np.int64)


def _dictionary_strings(c: _Chunk) -> tuple[Any, Any]:
    """``plain_lengths`` of the chunk's dictionary pages (a merged chunk's, one
    after another, in one launch): each entry's start in the heap, and its
    length in a buffer of :func:`_lengths` (empty without a dictionary page)."""
    cp = c.cp
    table = _dictionary_rows(c)
    size = int(table.nonnull.sum())
    starts = cp.zeros(max(size, 1), np.int64)[:size]
    buffer, lengths = _lengths(cp, size)
    if len(table):
        _string_table(c, table, starts, lengths)
    return starts, buffer


def _dictionary_values(c: _Chunk) -> _Strings:
    """The dictionary of a chunk read as one (never merged: at most one
    dictionary page): its dictionary page's strings up to their offsets (none
    without a dictionary page: a chunk of no values)."""
    assert len(c.dictionaries) <= 1, "a chunk read as a dictionary is decoded alone"
    starts, buffer = _dictionary_strings(c)
    return _Strings(int(starts.size), starts, _offsets(c.cp, buffer), None)


def _string_bytes(c: _Chunk, s: _Strings, total: int, arrow_type: Any) -> DeviceChunk:
    """Phase 3 of a string chunk (of ``arrow_type``): its ``total`` bytes copied
    from the heap."""
    dtype = storage_dtype(arrow_type)
    if dtype == np.int32 and total > _INT32_MAX:
        raise FrameTypeError(
            f"{c.where(c.spec.start)}: more than 2 GiB of string bytes in one chunk; "
            "read the column as large_string / large_binary"
        )
    data = c.cp.zeros(max(total, 1), np.uint8)[:total]
    rows = np.int64(s.rows)
    _launch("copy_strings", None, s.rows, (c.heap, s.row_starts, s.offsets, data, rows))
    return DeviceChunk(s.rows, data, s.offsets.astype(dtype), s.validity)
