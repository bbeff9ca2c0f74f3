"""Column chunks decoded on a CUDA device by the page-decode kernels.

:func:`decode_chunks_on_device` runs the steps of :mod:`.reference` with
the kernels of :mod:`.kernels`, for several chunks at once (the page
engine passes a row group's). The host reads the page headers and packs
the chunks into one *heap* (:mod:`.layout`): one host-to-device copy
(through the caller's pinned staging when given), then one batched nvCOMP
call per codec decompresses every compressed page section on the device
(:mod:`.nvcomp`; where nvCOMP is missing or lacks the codec, the host
decompressed them while packing), and one read brings back every v1
page's level length. Then, chunk by chunk, the device expands the levels,
computes positions by a prefix sum, decodes the pages' values and scatters
them to rows. Pages are decoded in *groups*, the longest runs of
consecutive pages of one kind (dictionary-encoded or PLAIN), each group
with one launch per kernel over a page table (a writer that falls back
from the dictionary gives two groups); a chunk reads a few small values
back (its index bit widths, the non-null counts per page with the error
flag, its string bytes), not one per page.

Every device allocation, temporaries included, is made inside
``domain.scope()``, so the domain charges it. A malformed stream found by a
kernel raises SourceFormatError naming the chunk. Needs CuPy and a CUDA
domain; verified on a GPU by ``tests/gpu/test_gpudecode_gpu.py`` (bit for
bit against PyArrow), and its host side on CI against host ports of the
kernels (``tests/frames/gpudecode/test_device_plan.py``). Thread-safe: each
call uses its own buffers on the current stream (or the staging's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames.column import storage_dtype
from nexus_cache.frames.gpudecode.kernels import kernel_function
from nexus_cache.frames.gpudecode.layout import (
    HeapLayout,
    PlacedPage,
    level_offsets,
    page_sections_at,
)
from nexus_cache.frames.gpudecode.nvcomp import decompress_batch, device_algorithm
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Encoding, Page, PageType, read_pages
from nexus_cache.frames.gpudecode.support import unsupported_reason

__all__ = ["DeviceChunk", "decode_chunk_on_device", "decode_chunks_on_device"]

_THREADS = 256
_MAX_BLOCKS = 65535 * 8
_DICTIONARY = (Encoding.PLAIN_DICTIONARY, Encoding.RLE_DICTIONARY)
_PLAIN_BYTES = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}


@dataclass(frozen=True)
class DeviceChunk:
    """Device buffers of one decoded column chunk, laid out as a frame column's
    (``validity`` None when the chunk has no nulls)."""

    length: int
    data: Any
    offsets: Any = None
    validity: Any = None


def _launch(name: str, element_bytes: int | None, items: int, args: tuple[Any, ...]) -> None:
    if items <= 0:
        return
    blocks = min((items + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
    kernel_function(name, element_bytes)((blocks,), (_THREADS,), args)


def _i64(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, np.int64).reshape(-1)


@dataclass(frozen=True)
class _DataPage:
    page: Page
    rows: int
    levels: tuple[int, int]  # [start, end) in the heap
    values: tuple[int, int]


class _Heap:
    """The heap of one or more chunks (a row group's) on the device, filled:
    packed on the host, copied over, decompressed; each chunk's pages found."""

    def __init__(
        self,
        cp: Any,
        items: Sequence[tuple[ChunkSpec, list[Page]]],
        transfer: Any = None,
        stages: dict[str, float] | None = None,
    ) -> None:
        self.cp, self.stages = cp, stages
        self.started = time.perf_counter()
        layout = HeapLayout()
        for spec, pages in items:
            layout.add(spec, pages, device_algorithm(spec.codec))
        layout.finish()
        self.stage("pack")
        self.size = layout.size
        self.data = cp.zeros(layout.size, np.uint8)
        host = np.frombuffer(layout.host, np.uint8)
        if host.size and transfer is not None:
            transfer.to_device(host, self.data[: host.size])
        elif host.size:
            self.data[: host.size] = cp.asarray(host)
        self.stage("transfer")
        groups = sorted({spec.row_group for spec, _ in items})
        where = f"{items[0][0].source!r}, row group {', '.join(map(str, groups))}"
        for algorithm, jobs in layout.jobs.items():  # one batched call per codec
            decompress_batch(self.data, algorithm, jobs, where)
        self.stage("decompress")
        # every chunk's v1 level lengths in one read
        wanted = [
            level_offsets(placed, spec)
            for (spec, _), placed in zip(items, layout.chunks, strict=True)
        ]
        lengths = self.peek([o for offsets in wanted for o in offsets])
        self.chunks: list[_Chunk] = []
        at = 0
        for (spec, _), placed, offsets in zip(items, layout.chunks, wanted, strict=True):
            sections = page_sections_at(placed, spec, lengths[at : at + len(offsets)].tolist())
            at += len(offsets)
            self.chunks.append(_Chunk(self, spec, placed, sections))

    def stage(self, name: str) -> None:
        """Add the time since the last stage to ``stages[name]`` (its device work
        waited for first), when stage times are wanted."""
        if self.stages is None:
            return
        self.cp.cuda.get_current_stream().synchronize()
        now = time.perf_counter()
        self.stages[name] = self.stages.get(name, 0.0) + now - self.started
        self.started = now

    def peek(self, offsets: Sequence[int]) -> np.ndarray:
        """The little-endian uint32 at each heap offset (zero past the heap): one gather."""
        at = _i64(offsets)
        if at.size == 0:
            return np.zeros(0, np.uint32)
        index = at[:, None] + np.arange(4, dtype=np.int64)
        inside = index < self.size
        got = self.data[self.cp.asarray(np.where(inside, index, 0))].get()
        got = np.where(inside, got, 0).astype(np.uint32)
        return got[:, 0] | got[:, 1] << 8 | got[:, 2] << 16 | got[:, 3] << 24


class _Chunk:
    """One chunk's plan over the heap: its data pages' sections and dictionary."""

    def __init__(
        self,
        heap: _Heap,
        spec: ChunkSpec,
        placed: Sequence[PlacedPage],
        sections: Sequence[tuple[tuple[int, int], tuple[int, int]]],
    ) -> None:
        self.cp, self.spec, self.peek = heap.cp, spec, heap.peek
        self.heap, self.size = heap.data, heap.size
        self.error = heap.cp.zeros(1, np.int32)
        self.data_pages: list[_DataPage] = []
        self.dictionary: tuple[Page, int, int] | None = None  # page, values start, end
        for p, (levels, values) in zip(placed, sections, strict=True):
            h = p.page.header
            if h.type == PageType.DICTIONARY_PAGE:
                self.dictionary = (p.page, *values)
            else:
                self.data_pages.append(_DataPage(p.page, h.num_values, levels, values))

    def check(self, what: str) -> None:
        if int(self.error.get()[0]):
            raise SourceFormatError(
                f"{self.spec.where(self.spec.start)}: {what} is malformed; the file is corrupt"
            )

    def expand(self, streams: Sequence[tuple[int, int, int, int]], out: Any = None) -> Any:
        """``hybrid_runs`` + ``hybrid_expand`` of ``streams`` (start, end, bit width,
        count) of the heap: every value, uint32, streams one after another."""
        cp = self.cp
        counts = _i64([s[3] for s in streams])
        total = int(counts.sum())
        if out is None:
            out = cp.zeros(max(total, 1), np.uint32)[:total]
        if total == 0:
            return out
        capacity = _i64([s[1] - s[0] + 1 for s in streams])
        run_base = np.concatenate([[0], np.cumsum(capacity)[:-1]]).astype(np.int64)
        n_runs = int(capacity.sum())
        run_start = cp.zeros(n_runs, np.int64)
        run_packed = cp.zeros(n_runs, np.uint8)
        run_value = cp.zeros(n_runs, np.int64)
        run_count = cp.zeros(len(streams), np.int32)
        widths = cp.asarray(np.array([s[2] for s in streams], np.int32))
        base = cp.asarray(run_base)
        _launch(
            "hybrid_runs",
            None,
            len(streams),
            (
                self.heap,
                cp.asarray(_i64([s[0] for s in streams])),
                cp.asarray(_i64([s[1] for s in streams])),
                widths,
                cp.asarray(counts),
                base,
                run_start,
                run_packed,
                run_value,
                run_count,
                self.error,
                np.int32(len(streams)),
            ),
        )
        # A stream hybrid_runs refused keeps the runs found so far (or none):
        # hybrid_expand still reads only inside the heap, and the error flag
        # is checked before the chunk is returned.
        out_base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self._expand(
            out, total, out_base, base, run_count, run_start, run_packed, run_value, widths
        )
        return out

    def _expand(self, out: Any, total: int, out_base: np.ndarray, *runs: Any) -> None:
        base, run_count, run_start, run_packed, run_value, widths = runs
        _launch(
            "hybrid_expand",
            None,
            total,
            (
                self.heap,
                np.int64(self.size),
                self.cp.asarray(out_base),
                np.int32(len(out_base)),
                base,
                run_count,
                run_start,
                run_packed,
                run_value,
                widths,
                out,
                np.int64(total),
            ),
        )

    def packed_runs(self, starts: Sequence[int], counts: Sequence[int]) -> Any:
        """PLAIN booleans: ``hybrid_expand`` over one bit-packed run per page
        (``packed_run``), all pages in one launch."""
        cp, n = self.cp, len(starts)
        count = _i64(counts)
        total = int(count.sum())
        out = cp.zeros(max(total, 1), np.uint32)[:total]
        if total:
            out_base = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
            self._expand(
                out,
                total,
                out_base,
                cp.arange(n, dtype=np.int64),  # run base: one run per stream
                cp.ones(n, np.int32),
                cp.zeros(n, np.int64),
                cp.ones(n, np.uint8),
                cp.asarray(_i64(starts)),
                cp.ones(n, np.int32),
            )
        return out


def decode_chunk_on_device(
    chunk: Any,
    spec: ChunkSpec,
    domain: Any,
    pages: list[Page] | None = None,
    transfer: Any = None,
    stages: dict[str, float] | None = None,
) -> DeviceChunk:
    """Decode the column chunk ``chunk`` (its bytes) into buffers of ``domain``:
    :func:`decode_chunks_on_device` of this one chunk."""
    return decode_chunks_on_device([(chunk, spec, pages)], domain, transfer, stages)[0]


def decode_chunks_on_device(
    items: Sequence[tuple[Any, ChunkSpec, list[Page] | None]],
    domain: Any,
    transfer: Any = None,
    stages: dict[str, float] | None = None,
) -> list[DeviceChunk]:
    """Decode the column chunks of ``items`` (bytes, spec, pages or None), one
    heap for all of them (a row group's: one copy to the device, one nvCOMP
    call per codec), into buffers of ``domain``.

    Each result equals :func:`.reference.decode_chunk` of its chunk, on the
    device. ``transfer`` (a :class:`~nexus_cache.frames.Transfer` into
    ``domain``): the heap is copied through its pinned staging and the
    decode runs on its stream; without one, a plain copy on the current
    stream. ``stages``: seconds by stage (``pack``, ``transfer``,
    ``decompress``, ``decode``) are added to it, each stage waited for before
    the next. Raises FrameTypeError for a chunk the decoder does not support
    (check :func:`.unsupported_reason` first) and SourceFormatError for
    malformed data; the buffers made so far are not kept past the error.
    The heap is freed when the call returns."""
    import cupy as cp

    resolved = []
    for chunk, spec, pages in items:
        pages = read_pages(chunk, spec) if pages is None else pages
        reason = unsupported_reason(spec, pages)
        if reason is not None:
            raise FrameTypeError(f"{spec.where(spec.start)}: {reason} is decoded on the host only")
        resolved.append((spec, pages))
    if not resolved:
        return []
    with domain.scope() if transfer is None else transfer.device():
        heap = _Heap(cp, resolved, transfer, stages)
        out = []
        for c in heap.chunks:
            out.append(_decode(c))
            c.check("a level, index or value stream")
        # Complete when it returns, like the host path: a caller may use the
        # buffers from any stream.
        cp.cuda.get_current_stream().synchronize()
        heap.stage("decode")
        return out


def _groups(pages: Sequence[_DataPage], counts: np.ndarray) -> list[tuple[bool, list[int]]]:
    """The longest runs of consecutive pages with values that share an encoding
    kind: ``(dictionary-encoded, page indices)`` each."""
    out: list[tuple[bool, list[int]]] = []
    for i, p in enumerate(pages):
        if not counts[i]:
            continue
        kind = p.page.header.encoding in _DICTIONARY
        if out and out[-1][0] == kind:
            out[-1][1].append(i)
        else:
            out.append((kind, [i]))
    return out


def _decode(c: _Chunk) -> DeviceChunk:
    cp, spec = c.cp, c.spec
    rows = sum(p.rows for p in c.data_pages)
    bounds = np.cumsum([0] + [p.rows for p in c.data_pages]).astype(np.int64)
    if spec.max_def:
        levels = c.expand([(*p.levels, 1, p.rows) for p in c.data_pages])
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
    position = cp.cumsum(valid, dtype=np.int64) - 1
    # Non-null values per page, from the prefix sum at the page boundaries.
    # (a page of no rows ends where the one before it ends)
    ends = np.zeros(len(c.data_pages), np.int64)
    if rows:
        last = cp.asarray(np.maximum(bounds[1:] - 1, 0))
        # one read: the positions at the page ends, and the error flag
        got = cp.concatenate([position[last] + 1, c.error.astype(np.int64)]).get()
        if got[-1]:
            raise SourceFormatError(
                f"{spec.where(spec.start)}: a definition level is malformed; the file is corrupt"
            )
        ends = np.where(bounds[1:] > 0, got[:-1], 0).astype(np.int64)
    dense_base = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    counts = ends - dense_base
    for p, count in zip(c.data_pages, counts, strict=True):
        nulls = p.page.header.num_nulls
        if nulls is not None and p.rows - int(count) != nulls:
            raise SourceFormatError(
                f"{spec.where(p.page.offset)}: the levels hold {p.rows - int(count)} nulls, "
                f"the header says {nulls}; the file is corrupt"
            )
    nonnull = int(ends[-1]) if len(ends) else 0
    groups = _groups(c.data_pages, counts)
    # the first 4 bytes of the values of every page that starts with a header
    # (an index stream's bit width, an RLE boolean stream's length): one read
    headed = [
        i
        for i, p in enumerate(c.data_pages)
        if p.page.header.encoding in (*_DICTIONARY, Encoding.RLE)
    ]
    heads = dict(zip(headed, c.peek([c.data_pages[i].values[0] for i in headed]), strict=True))
    if spec.physical_type == "BYTE_ARRAY":
        return _strings(c, groups, heads, valid, position, dense_base, counts, nonnull, rows)
    dtype = storage_dtype(spec.arrow_type)
    dense = cp.zeros(max(nonnull, 1), dtype)[:nonnull]
    dictionary = None
    if c.dictionary is not None:
        page, v0, v1 = c.dictionary
        size = page.header.num_values
        dictionary = cp.zeros(max(size, 1), dtype)[:size]
        if spec.physical_type == "BOOLEAN":
            if (size + 7) // 8 > v1 - v0:
                raise _bad(c, page, f"{size} PLAIN booleans run past the page")
            dictionary[...] = c.packed_runs([v0], [size]).astype(np.bool_)
        else:
            _plain_fixed(c, [(page, v0, v1, size)], dictionary)
    for is_dict, members in groups:
        g0 = int(dense_base[members[0]])
        g1 = int(dense_base[members[-1]] + counts[members[-1]])
        part = dense[g0:g1]
        table = [(c.data_pages[i].page, *c.data_pages[i].values, int(counts[i])) for i in members]
        if is_dict:
            if dictionary is None:  # the support check refuses this
                raise _bad(c, table[0][0], "a dictionary-encoded page without a dictionary")
            indices = _indices(c, table, [heads.get(i, 0) for i in members])
            _launch(
                "dict_gather",
                dtype.itemsize,
                g1 - g0,
                (indices, dictionary, np.int64(len(dictionary)), part, c.error, np.int64(g1 - g0)),
            )
        elif spec.physical_type == "BOOLEAN":
            part[...] = _booleans(c, table, [heads.get(i, 0) for i in members]).astype(np.bool_)
        else:
            _plain_fixed(c, table, part)
    out = cp.zeros(max(rows, 1), dtype)[:rows]
    _launch("scatter_values", dtype.itemsize, rows, (valid, position, dense, out, np.int64(rows)))
    return DeviceChunk(rows, out, None, _validity(cp, valid))


def _validity(cp: Any, valid: Any) -> Any:
    return None if bool(valid.all()) else valid.astype(np.bool_)


def _bad(c: _Chunk, page: Page, what: str) -> SourceFormatError:
    return SourceFormatError(f"{c.spec.where(page.offset)}: {what}; the file is corrupt")


#: one page of a group: (page, values start, values end, non-null values)
_Row = tuple[Page, int, int, int]


def _plain_fixed(c: _Chunk, table: Sequence[_Row], out: Any) -> None:
    """``plain_fixed`` over every page of ``table`` (their values one after
    another in ``out``), one launch."""
    width = _PLAIN_BYTES[c.spec.physical_type]
    for page, v0, v1, count in table:
        if count * width > v1 - v0:
            raise _bad(
                c, page, f"{count} PLAIN values need {count * width} bytes, the page has {v1 - v0}"
            )
    counts = _i64([t[3] for t in table])
    base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    total = int(counts.sum())
    _launch(
        "plain_fixed",
        width,
        total,
        (
            c.heap,
            c.cp.asarray(_i64([t[1] for t in table])),
            c.cp.asarray(base),
            np.int32(len(table)),
            out,
            np.int64(total),
        ),
    )


def _booleans(c: _Chunk, table: Sequence[_Row], heads: Sequence[int]) -> Any:
    """Every page of ``table`` is PLAIN, or every one RLE (a group holds one encoding
    kind; booleans have two non-dictionary encodings, so split them here)."""
    rle = [t[0].header.encoding == Encoding.RLE for t in table]
    if all(rle):
        streams = []
        for (page, v0, v1, count), head in zip(table, heads, strict=True):
            if v1 - v0 < 4 or 4 + int(head) > v1 - v0:
                raise _bad(c, page, "an RLE boolean stream runs past the page")
            streams.append((v0 + 4, v0 + 4 + int(head), 1, count))
        return c.expand(streams)
    if not any(rle):
        for page, v0, v1, count in table:
            if (count + 7) // 8 > v1 - v0:
                raise _bad(c, page, f"{count} PLAIN booleans run past the page")
        return c.packed_runs([t[1] for t in table], [t[3] for t in table])
    # PLAIN and RLE pages mixed in one run (no writer does this): one at a time
    return c.cp.concatenate(
        [_booleans(c, [row], [head]) for row, head in zip(table, heads, strict=True)]
    )


def _indices(c: _Chunk, table: Sequence[_Row], heads: Sequence[int]) -> Any:
    """The dictionary indices of every page of ``table``, one after another."""
    streams = []
    for (page, v0, v1, count), head in zip(table, heads, strict=True):
        if v1 <= v0:
            raise _bad(c, page, "a dictionary-encoded page lacks its bit width")
        streams.append((v0 + 1, v1, int(head) & 0xFF, count))
    return c.expand(streams)


def _string_table(c: _Chunk, table: Sequence[_Row], starts: Any, lengths: Any) -> None:
    """``plain_lengths`` over every page of ``table``, one launch (one thread a page)."""
    cp = c.cp
    counts = _i64([t[3] for t in table])
    base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    _launch(
        "plain_lengths",
        None,
        len(table),
        (
            c.heap,
            cp.asarray(_i64([t[1] for t in table])),
            cp.asarray(_i64([t[2] for t in table])),
            cp.asarray(base),
            cp.asarray(counts),
            starts,
            lengths,
            c.error,
            np.int32(len(table)),
        ),
    )


def _strings(
    c: _Chunk,
    groups: list[tuple[bool, list[int]]],
    heads: dict[int, Any],
    valid: Any,
    position: Any,
    dense_base: np.ndarray,
    counts: np.ndarray,
    nonnull: int,
    rows: int,
) -> DeviceChunk:
    cp, spec = c.cp, c.spec
    starts = cp.zeros(max(nonnull, 1), np.int64)[:nonnull]
    lengths = cp.zeros(max(nonnull, 1), np.int64)[:nonnull]
    dict_starts = dict_lengths = None
    if c.dictionary is not None:
        page, v0, v1 = c.dictionary
        size = page.header.num_values
        dict_starts = cp.zeros(max(size, 1), np.int64)[:size]
        dict_lengths = cp.zeros(max(size, 1), np.int64)[:size]
        _string_table(c, [(page, v0, v1, size)], dict_starts, dict_lengths)
    for is_dict, members in groups:
        g0 = int(dense_base[members[0]])
        g1 = int(dense_base[members[-1]] + counts[members[-1]])
        table = [(c.data_pages[i].page, *c.data_pages[i].values, int(counts[i])) for i in members]
        if is_dict:
            if dict_starts is None or dict_lengths is None:  # the support check refuses this
                raise _bad(c, table[0][0], "a dictionary-encoded page without a dictionary")
            indices = _indices(c, table, [heads.get(i, 0) for i in members])
            _launch(
                "dict_strings",
                None,
                g1 - g0,
                (
                    indices,
                    dict_starts,
                    dict_lengths,
                    np.int64(len(dict_starts)),
                    starts[g0:g1],
                    lengths[g0:g1],
                    c.error,
                    np.int64(g1 - g0),
                ),
            )
        else:
            _string_table(c, table, starts[g0:g1], lengths[g0:g1])
    row_lengths = cp.zeros(max(rows, 1), np.int64)[:rows]
    row_starts = cp.zeros(max(rows, 1), np.int64)[:rows]
    _launch("scatter_values", 8, rows, (valid, position, lengths, row_lengths, np.int64(rows)))
    _launch("scatter_values", 8, rows, (valid, position, starts, row_starts, np.int64(rows)))
    offsets = cp.zeros(rows + 1, np.int64)
    if rows:
        offsets[1:] = cp.cumsum(row_lengths)
    c.check("a string or index stream")  # before the lengths size an allocation
    total = int(offsets[-1])
    dtype = storage_dtype(spec.arrow_type)
    if dtype == np.int32 and total > (1 << 31) - 1:
        raise FrameTypeError(
            f"{spec.where(spec.start)}: more than 2 GiB of string bytes in one chunk; "
            "read the column as large_string / large_binary"
        )
    data = cp.zeros(max(total, 1), np.uint8)[:total]
    _launch("copy_strings", None, rows, (c.heap, row_starts, offsets, data, np.int64(rows)))
    return DeviceChunk(rows, data, offsets.astype(dtype), _validity(cp, valid))
