"""One column chunk decoded on a CUDA device by the page-decode kernels.

:func:`decode_chunk_on_device` runs the steps of :mod:`.reference` with the
kernels of :mod:`.kernels`: the host reads the page headers and, for now,
decompresses the pages (PyArrow's codecs; nvCOMP on the device is the next
step), uploads the levels and the values *heap* of the chunk, and the
device expands the levels, computes positions by a prefix sum, decodes
every page's values and scatters them to rows. Every device allocation,
temporaries included, is made inside ``domain.scope()``, so the domain
charges it. A malformed stream found by a kernel raises SourceFormatError
naming the chunk. Needs CuPy and a CUDA domain; verified on a GPU by
``tests/gpu/test_gpudecode_gpu.py`` (bit for bit against PyArrow).
Thread-safe: each call uses its own buffers on the current stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames.column import storage_dtype
from nexus_cache.frames.gpudecode.kernels import kernel_function
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Encoding, Page, PageType, read_pages
from nexus_cache.frames.gpudecode.reference import chunk_sections
from nexus_cache.frames.gpudecode.support import unsupported_reason

__all__ = ["DeviceChunk", "decode_chunk_on_device"]

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


class _Chunk:
    """The host-side plan of one chunk and its device buffers (inside the scope)."""

    def __init__(self, cp: Any, spec: ChunkSpec, pages: list[Page]) -> None:
        self.cp, self.spec = cp, spec
        sections = chunk_sections(pages, spec)
        heap, levels = bytearray(), bytearray()
        # each data page: (page, rows, levels start, levels end, values start, values end)
        self.data_pages: list[tuple[Page, int, int, int, int, int]] = []
        self.dictionary: tuple[Page, int, int] | None = None  # page, values start, end
        for page, (lv, values) in zip(pages, sections, strict=True):
            if page.header.type == PageType.DICTIONARY_PAGE:
                self.dictionary = (page, len(heap), len(heap) + len(values))
            else:
                self.data_pages.append(
                    (
                        page,
                        page.header.num_values,
                        len(levels),
                        len(levels) + len(lv),
                        len(heap),
                        len(heap) + len(values),
                    )
                )
                levels += lv
            heap += values
        self.host_heap = bytes(heap)
        self.heap = cp.asarray(np.frombuffer(self.host_heap or b"\0", np.uint8))
        self.levels = cp.asarray(np.frombuffer(bytes(levels) or b"\0", np.uint8))
        self.error = cp.zeros(1, np.int32)

    def check(self, what: str) -> None:
        if int(self.error.get()[0]):
            raise SourceFormatError(
                f"{self.spec.where(self.spec.start)}: {what} is malformed; the file is corrupt"
            )

    def expand(self, data: Any, size: int, streams: list[tuple[int, int, int, int]]) -> Any:
        """``hybrid_runs`` + ``hybrid_expand`` of ``streams`` (start, end, bit width,
        count) of ``data``: every value, uint32, streams one after another."""
        cp = self.cp
        counts = np.array([s[3] for s in streams], np.int64)
        total = int(counts.sum())
        out = cp.zeros(max(total, 1), np.uint32)[:total]
        if total == 0:
            return out
        capacity = np.array([s[1] - s[0] + 1 for s in streams], np.int64)
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
                data,
                cp.asarray(np.array([s[0] for s in streams], np.int64)),
                cp.asarray(np.array([s[1] for s in streams], np.int64)),
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
        self.check("a level or index stream")
        out_base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        _launch(
            "hybrid_expand",
            None,
            total,
            (
                data,
                np.int64(size),
                cp.asarray(out_base),
                np.int32(len(streams)),
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
        return out

    def one_run(self, start: int, count: int) -> Any:
        """PLAIN booleans: ``hybrid_expand`` over one bit-packed run at ``start``."""
        cp = self.cp
        out = cp.zeros(max(count, 1), np.uint32)[:count]
        zero = cp.zeros(1, np.int64)
        _launch(
            "hybrid_expand",
            None,
            count,
            (
                self.heap,
                np.int64(len(self.host_heap)),
                zero,
                np.int32(1),
                zero,
                cp.ones(1, np.int32),
                zero,
                cp.ones(1, np.uint8),
                cp.asarray(np.array([start], np.int64)),
                cp.ones(1, np.int32),
                out,
                np.int64(count),
            ),
        )
        return out


def decode_chunk_on_device(
    chunk: Any, spec: ChunkSpec, domain: Any, pages: list[Page] | None = None
) -> DeviceChunk:
    """Decode the column chunk ``chunk`` (its bytes) into buffers of ``domain``.

    The result equals :func:`.reference.decode_chunk` of the same chunk, on
    the device. Raises FrameTypeError for a chunk the decoder does not
    support (check :func:`.unsupported_reason` first) and SourceFormatError
    for malformed data; the buffers made so far are not kept past the error."""
    import cupy as cp

    pages = read_pages(chunk, spec) if pages is None else pages
    reason = unsupported_reason(spec, pages)
    if reason is not None:
        raise FrameTypeError(f"{spec.where(spec.start)}: {reason} is decoded on the host only")
    with domain.scope():
        out = _decode(_Chunk(cp, spec, pages))
        # Complete when it returns, like the host path: a caller may use the
        # buffers from any stream.
        cp.cuda.get_current_stream().synchronize()
        return out


def _decode(c: _Chunk) -> DeviceChunk:
    cp, spec = c.cp, c.spec
    rows = sum(p[1] for p in c.data_pages)
    bounds = np.cumsum([0] + [p[1] for p in c.data_pages]).astype(np.int64)
    if spec.max_def:
        levels = c.expand(
            c.levels, len(c.levels), [(lv0, lv1, 1, n) for _, n, lv0, lv1, _, _ in c.data_pages]
        )
        valid = cp.zeros(max(rows, 1), np.uint8)[:rows]
        _launch(
            "levels_validity",
            None,
            rows,
            (levels, np.uint32(spec.max_def), valid, c.error, np.int64(rows)),
        )
        c.check("a definition level")
        del levels
    else:
        valid = cp.ones(max(rows, 1), np.uint8)[:rows]
    position = cp.cumsum(valid, dtype=np.int64) - 1
    # Non-null values per page, from the prefix sum at the page boundaries.
    # (a page of no rows ends where the one before it ends)
    ends = np.zeros(len(c.data_pages), np.int64)
    if rows:
        last = cp.asarray(np.maximum(bounds[1:] - 1, 0))
        ends = np.where(bounds[1:] > 0, (position[last] + 1).get(), 0).astype(np.int64)
    dense_base = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    counts = ends - dense_base
    for (page, n, *_), count in zip(c.data_pages, counts, strict=True):
        nulls = page.header.num_nulls
        if nulls is not None and n - int(count) != nulls:
            raise SourceFormatError(
                f"{spec.where(page.offset)}: the levels hold {n - int(count)} nulls, "
                f"the header says {nulls}; the file is corrupt"
            )
    nonnull = int(ends[-1]) if len(ends) else 0
    if spec.physical_type == "BYTE_ARRAY":
        return _strings(c, valid, position, dense_base, counts, nonnull, rows)
    dtype = storage_dtype(spec.arrow_type)
    dense = cp.zeros(max(nonnull, 1), dtype)[:nonnull]
    dictionary = None
    if c.dictionary is not None:
        page, v0, v1 = c.dictionary
        size = page.header.num_values
        dictionary = cp.zeros(max(size, 1), dtype)[:size]
        if spec.physical_type == "BOOLEAN":
            dictionary[...] = _booleans(c, page, v0, v1, size).astype(np.bool_)
        else:
            _plain_fixed(c, v0, v1, size, dictionary, page)
    for i, (page, _, _, _, v0, v1) in enumerate(c.data_pages):
        count, base = int(counts[i]), int(dense_base[i])
        part = dense[base : base + count]
        if count == 0:
            continue
        if page.header.encoding in _DICTIONARY:
            if dictionary is None:  # the support check refuses this
                raise _bad(c, page, "a dictionary-encoded page without a dictionary")
            indices = _indices(c, page, v0, v1, count)
            _launch(
                "dict_gather",
                dtype.itemsize,
                count,
                (indices, dictionary, np.int64(len(dictionary)), part, c.error, np.int64(count)),
            )
            c.check("a dictionary index")
        elif spec.physical_type == "BOOLEAN":
            part[...] = _booleans(c, page, v0, v1, count).astype(np.bool_)
        else:
            _plain_fixed(c, v0, v1, count, part, page)
    out = cp.zeros(max(rows, 1), dtype)[:rows]
    _launch("scatter_values", dtype.itemsize, rows, (valid, position, dense, out, np.int64(rows)))
    return DeviceChunk(rows, out, None, _validity(cp, valid))


def _validity(cp: Any, valid: Any) -> Any:
    return None if bool(valid.all()) else valid.astype(np.bool_)


def _bad(c: _Chunk, page: Page, what: str) -> SourceFormatError:
    return SourceFormatError(f"{c.spec.where(page.offset)}: {what}; the file is corrupt")


def _plain_fixed(c: _Chunk, v0: int, v1: int, count: int, out: Any, page: Page) -> None:
    width = _PLAIN_BYTES[c.spec.physical_type]
    if count * width > v1 - v0:
        raise _bad(
            c, page, f"{count} PLAIN values need {count * width} bytes, the page has {v1 - v0}"
        )
    one = c.cp.asarray(np.array([v0], np.int64))
    zero = c.cp.zeros(1, np.int64)
    _launch("plain_fixed", width, count, (c.heap, one, zero, np.int32(1), out, np.int64(count)))


def _booleans(c: _Chunk, page: Page, v0: int, v1: int, count: int) -> Any:
    if page.header.encoding == Encoding.RLE:
        raw = c.host_heap[v0:v1]
        if len(raw) < 4 or 4 + int.from_bytes(raw[:4], "little") > len(raw):
            raise _bad(c, page, "an RLE boolean stream runs past the page")
        length = int.from_bytes(raw[:4], "little")
        return c.expand(c.heap, len(c.host_heap), [(v0 + 4, v0 + 4 + length, 1, count)])
    if (count + 7) // 8 > v1 - v0:
        raise _bad(c, page, f"{count} PLAIN booleans run past the page")
    return c.one_run(v0, count)


def _indices(c: _Chunk, page: Page, v0: int, v1: int, count: int) -> Any:
    if v1 <= v0:
        raise _bad(c, page, "a dictionary-encoded page lacks its bit width")
    width = c.host_heap[v0]
    return c.expand(c.heap, len(c.host_heap), [(v0 + 1, v1, width, count)])


def _string_table(c: _Chunk, v0: int, v1: int, count: int, starts: Any, lengths: Any) -> None:
    cp = c.cp
    _launch(
        "plain_lengths",
        None,
        1,
        (
            c.heap,
            cp.asarray(np.array([v0], np.int64)),
            cp.asarray(np.array([v1], np.int64)),
            cp.zeros(1, np.int64),
            cp.asarray(np.array([count], np.int64)),
            starts,
            lengths,
            c.error,
            np.int32(1),
        ),
    )
    c.check("a PLAIN string page")


def _strings(
    c: _Chunk,
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
        _string_table(c, v0, v1, size, dict_starts, dict_lengths)
    for i, (page, _, _, _, v0, v1) in enumerate(c.data_pages):
        count, base = int(counts[i]), int(dense_base[i])
        if count == 0:
            continue
        part_starts = starts[base : base + count]
        part_lengths = lengths[base : base + count]
        if page.header.encoding in _DICTIONARY:
            if dict_starts is None or dict_lengths is None:  # the support check refuses this
                raise _bad(c, page, "a dictionary-encoded page without a dictionary")
            indices = _indices(c, page, v0, v1, count)
            _launch(
                "dict_strings",
                None,
                count,
                (
                    indices,
                    dict_starts,
                    dict_lengths,
                    np.int64(len(dict_starts)),
                    part_starts,
                    part_lengths,
                    c.error,
                    np.int64(count),
                ),
            )
            c.check("a dictionary index")
        else:
            _string_table(c, v0, v1, count, part_starts, part_lengths)
    row_lengths = cp.zeros(max(rows, 1), np.int64)[:rows]
    row_starts = cp.zeros(max(rows, 1), np.int64)[:rows]
    _launch("scatter_values", 8, rows, (valid, position, lengths, row_lengths, np.int64(rows)))
    _launch("scatter_values", 8, rows, (valid, position, starts, row_starts, np.int64(rows)))
    offsets = cp.zeros(rows + 1, np.int64)
    if rows:
        offsets[1:] = cp.cumsum(row_lengths)
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
