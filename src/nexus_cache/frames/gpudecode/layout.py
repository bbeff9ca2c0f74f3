"""Where each page of a column chunk lives in the chunk's device *heap*.

The device decoder keeps a whole column chunk in one byte buffer, the heap:
first the *input region*, packed on the host and copied to the device in
one transfer, then the *output region*, which nvCOMP fills. Every piece
starts at a multiple of :data:`.nvcomp.ALIGNMENT`:

* a compressed page section (a v1 page, a dictionary page, or the values
  of a v2 page) that nvCOMP decompresses: its compressed bytes in the input
  region, a slot of its header's uncompressed size in the output region,
  and a *job* ``(in offset, in size, out offset, out size)``;
* everything stored uncompressed (a chunk without a codec, a v2 page's
  definition levels, which v2 never compresses, and the values of a v2 page
  written with ``is_compressed`` false): its bytes in the input region;
* with host decompression (nvCOMP missing or lacking the codec) the page
  sections are decompressed here, by PyArrow, into the input region.

A :class:`HeapLayout` holds one chunk or several (the device decoder lays
out a whole row group's chunks in one heap: one copy, one nvCOMP call per
codec). :func:`page_sections_at` then finds each page's ``(definition
levels, values)`` in the heap from the few bytes it needs (a v1 page's
4-byte level length, at :func:`level_offsets`), read back by the caller:
the device decoder reads every chunk's in one gather, the host tests from
a heap filled with PyArrow's decompression, checked against the NumPy
reference's :func:`.reference.page_sections`. Pure host code; a layout is
built by one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, PageType
from nexus_cache.frames.gpudecode.reference import decompress_section
from nexus_cache.frames.gpudecode.support import CODECS

__all__ = ["HeapLayout", "PlacedPage", "layout_chunk", "level_offsets", "page_sections_at"]


_STEP = ALIGNMENT - 1  # a place is rounded up to a multiple of ALIGNMENT
_DATA_PAGE_V2 = int(PageType.DATA_PAGE_V2)


class PlacedPage(NamedTuple):
    """One page in the heap: its body (a v1 or dictionary page whole, decompressed;
    a v2 page's values) at ``[body, body_end)``, and a v2 page's definition
    levels at ``[levels, levels + levels_size)``. Immutable (a named tuple: a
    heap holds thousands, made fast)."""

    page: Page
    body: int
    body_end: int
    levels: int = 0
    levels_size: int = 0


@dataclass
class HeapLayout:
    """The heap of one or more chunks (row groups' chunks, decoded together):
    ``size`` bytes, of which the first ``host_size`` come from the host, as
    ``pieces`` (heap offset, bytes: views of the file's pages, or what the
    host decompressed), zeros between them; ``jobs``: nvCOMP algorithm -> its
    ``(in offset, in size, out offset, out size)`` sections; ``chunks``: each
    chunk's pages in their places, in the order added. Call :meth:`finish`
    after the last :meth:`add`.

    The pieces are not joined on the host: the caller copies each straight
    from the file's bytes into its place in the pinned staging
    (``Transfer.pieces_to_device``: one device copy per slot), so a page is
    copied once on the host, not three times (joined, grown, staged)."""

    pieces: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    host_size: int = 0
    size: int = 0
    jobs: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    chunks: list[list[PlacedPage]] = field(default_factory=list)
    # (chunk, page, algorithm, in offset, in size, out size) awaiting an output slot
    _pending: list[tuple[int, int, str, int, int, int]] = field(default_factory=list)

    def _put(self, data: bytes | memoryview) -> int:
        at = (self.host_size + _STEP) // ALIGNMENT * ALIGNMENT
        size = len(data) if type(data) is bytes else memoryview(data).nbytes
        if size:
            self.pieces.append((at, data))
        self.host_size = at + size
        return at

    def host_image(self) -> np.ndarray:
        """The first ``host_size`` bytes of the heap, joined on the host (for a
        caller without pinned staging, and for tests)."""
        out = np.zeros(self.host_size, np.uint8)
        for at, data in self.pieces:
            piece = np.frombuffer(data, np.uint8)
            out[at : at + piece.size] = piece
        return out

    def add(self, spec: ChunkSpec, pages: Sequence[Page], algorithm: str | None) -> None:
        """Lay out one chunk's ``pages``: its compressed sections left to nvCOMP's
        ``algorithm``, or (None) decompressed here by PyArrow. SourceFormatError
        for a page that fails host decompression or contradicts its header."""
        codec = CODECS[spec.codec]
        placed: list[PlacedPage] = []
        pending, chunk, put = self._pending, len(self.chunks), self._put
        for page in pages:
            h = page.header
            levels = levels_size = 0
            section = page.payload
            size = h.uncompressed_size
            compressed = codec is not None
            if h.type == _DATA_PAGE_V2:
                levels_size = h.def_bytes
                levels = put(section[h.rep_bytes : h.rep_bytes + levels_size])
                section = section[h.rep_bytes + levels_size :]
                size -= h.rep_bytes + levels_size
                compressed = compressed and h.is_compressed
            if compressed and algorithm is not None and size > 0:
                # the page's place in the output region is fixed in finish
                pending.append((chunk, len(placed), algorithm, put(section), len(section), size))
                placed.append(PlacedPage(page, 0, 0, levels, levels_size))
                continue
            try:
                body = decompress_section(section, size, codec if compressed else None)
            except ValueError as exc:
                raise SourceFormatError(
                    f"{spec.where(page.offset)}: {exc}; the file is corrupt"
                ) from exc
            at = put(body)
            placed.append(PlacedPage(page, at, at + len(body), levels, levels_size))
        self.chunks.append(placed)

    def finish(self) -> None:
        """Place the decompressed sections after the host's bytes; fix ``size``."""
        cursor = (self.host_size + _STEP) // ALIGNMENT * ALIGNMENT
        chunks, jobs = self.chunks, self.jobs
        for chunk, index, algorithm, source, in_size, size in self._pending:
            placed = chunks[chunk]
            p = placed[index]
            jobs.setdefault(algorithm, []).append((source, in_size, cursor, size))
            placed[index] = PlacedPage(p.page, cursor, cursor + size, p.levels, p.levels_size)
            cursor = (cursor + size + _STEP) // ALIGNMENT * ALIGNMENT
        self._pending.clear()
        self.size = max(cursor, 1)


def layout_chunk(spec: ChunkSpec, pages: Sequence[Page], algorithm: str | None) -> HeapLayout:
    """The heap layout of one chunk (see :meth:`HeapLayout.add`)."""
    out = HeapLayout()
    out.add(spec, pages, algorithm)
    out.finish()
    return out


def level_offsets(pages: Sequence[PlacedPage], spec: ChunkSpec) -> list[int]:
    """Where the 4-byte level length of each v1 data page of a chunk is (in
    page order): what :func:`page_sections_at` peeks."""
    if not spec.max_def:
        return []
    return [p.body for p in pages if p.page.header.type == PageType.DATA_PAGE]


def page_sections_at(
    pages: Sequence[PlacedPage], spec: ChunkSpec, lengths: Sequence[int]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``((levels start, end), (values start, end))`` in the heap of every page
    of a chunk, as :func:`.reference.page_sections` cuts them (empty levels
    where that gives none); ``lengths``: the values read (peeked) at
    :func:`level_offsets`."""
    v1 = [
        i for i, p in enumerate(pages) if p.page.header.type == PageType.DATA_PAGE and spec.max_def
    ]
    by_page = dict(zip(v1, lengths, strict=True))
    out = []
    for i, p in enumerate(pages):
        h = p.page.header
        if h.type == PageType.DATA_PAGE_V2:
            out.append(((p.levels, p.levels + p.levels_size), (p.body, p.body_end)))
        elif i in by_page:
            if p.body_end - p.body < 4:
                raise _corrupt(spec, p, "a data page ends before its definition levels")
            length = int(by_page[i])
            if p.body + 4 + length > p.body_end:
                raise _corrupt(spec, p, f"definition levels of {length} bytes run past the page")
            start = p.body + 4
            out.append(((start, start + length), (start + length, p.body_end)))
        else:
            out.append(((p.body, p.body), (p.body, p.body_end)))
    return out


def _corrupt(spec: ChunkSpec, p: PlacedPage, what: str) -> SourceFormatError:
    return SourceFormatError(f"{spec.where(p.page.offset)}: {what}; the file is corrupt")
