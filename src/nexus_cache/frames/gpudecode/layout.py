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

:func:`layout_chunk` computes the layout; :func:`page_sections_at` then
finds each page's ``(definition levels, values)`` in the heap, reading the
few bytes it needs (a v1 page's 4-byte level length) through a *peek*
callback, so the same code serves the device (one gather per chunk) and
the host tests (the heap filled with PyArrow's decompression, checked
against the NumPy reference's :func:`.reference.page_sections`). Pure host
code, thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, PageType
from nexus_cache.frames.gpudecode.reference import decompress_section
from nexus_cache.frames.gpudecode.support import CODECS

__all__ = ["ChunkLayout", "PlacedPage", "layout_chunk", "page_sections_at"]

#: ``peek(offsets)``: the little-endian uint32 at each heap offset (bytes past
#: the heap read as zero)
Peek = Callable[[Sequence[int]], np.ndarray]


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class PlacedPage:
    """One page in the heap: its body (a v1 or dictionary page whole, decompressed;
    a v2 page's values) at ``[body, body_end)``, and a v2 page's definition
    levels at ``[levels, levels + levels_size)``."""

    page: Page
    body: int
    body_end: int
    levels: int = 0
    levels_size: int = 0


@dataclass
class ChunkLayout:
    """The heap of one chunk: ``size`` bytes, of which the first ``len(host)``
    come from the host; ``jobs`` for nvCOMP; every page's place."""

    host: bytearray = field(default_factory=bytearray)
    size: int = 0
    jobs: list[tuple[int, int, int, int]] = field(default_factory=list)
    pages: list[PlacedPage] = field(default_factory=list)

    def _put(self, data: bytes | memoryview) -> int:
        at = _align(len(self.host))
        self.host += bytes(at - len(self.host))
        self.host += data
        return at


def layout_chunk(spec: ChunkSpec, pages: Sequence[Page], device_codec: bool) -> ChunkLayout:
    """The heap layout of a chunk's ``pages``; ``device_codec``: nvCOMP
    decompresses (else PyArrow does, here). SourceFormatError for a page that
    fails host decompression or is inconsistent with its header."""
    codec = CODECS[spec.codec]
    out = ChunkLayout()
    # (index in pages, in offset, in size, out size) of each nvCOMP section
    outputs: list[tuple[int, int, int, int]] = []
    for page in pages:
        h = page.header
        levels = levels_size = 0
        section = page.payload
        size = h.uncompressed_size
        compressed = codec is not None
        if h.type == PageType.DATA_PAGE_V2:
            levels_size = h.def_bytes
            levels = out._put(page.payload[h.rep_bytes : h.rep_bytes + h.def_bytes])
            section = page.payload[h.rep_bytes + h.def_bytes :]
            size = h.uncompressed_size - h.rep_bytes - h.def_bytes
            compressed = compressed and h.is_compressed
        if compressed and device_codec and size > 0:
            outputs.append((len(out.pages), out._put(section), len(section), size))
            out.pages.append(PlacedPage(page, 0, 0, levels, levels_size))
            continue
        try:
            body = decompress_section(section, size, codec if compressed else None)
        except ValueError as exc:
            raise SourceFormatError(
                f"{spec.where(page.offset)}: {exc}; the file is corrupt"
            ) from exc
        at = out._put(body)
        out.pages.append(PlacedPage(page, at, at + len(body), levels, levels_size))
    cursor = _align(len(out.host))
    for index, source, in_size, size in outputs:
        placed = out.pages[index]
        out.jobs.append((source, in_size, cursor, size))
        out.pages[index] = PlacedPage(
            placed.page, cursor, cursor + size, placed.levels, placed.levels_size
        )
        cursor = _align(cursor + size)
    out.size = max(cursor, 1)
    return out


def page_sections_at(
    layout: ChunkLayout, spec: ChunkSpec, peek: Peek
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``((levels start, end), (values start, end))`` in the heap of every page,
    as :func:`.reference.page_sections` cuts them (empty levels where that
    gives none). One ``peek`` of the v1 data pages' level lengths."""
    v1 = [
        i
        for i, p in enumerate(layout.pages)
        if p.page.header.type == PageType.DATA_PAGE and spec.max_def
    ]
    lengths = dict(zip(v1, peek([layout.pages[i].body for i in v1]) if v1 else [], strict=True))
    out = []
    for i, p in enumerate(layout.pages):
        h = p.page.header
        if h.type == PageType.DATA_PAGE_V2:
            out.append(((p.levels, p.levels + p.levels_size), (p.body, p.body_end)))
        elif i in lengths:
            if p.body_end - p.body < 4:
                raise _corrupt(spec, p, "a data page ends before its definition levels")
            length = int(lengths[i])
            if p.body + 4 + length > p.body_end:
                raise _corrupt(spec, p, f"definition levels of {length} bytes run past the page")
            start = p.body + 4
            out.append(((start, start + length), (start + length, p.body_end)))
        else:
            out.append(((p.body, p.body), (p.body, p.body_end)))
    return out


def _corrupt(spec: ChunkSpec, p: PlacedPage, what: str) -> SourceFormatError:
    return SourceFormatError(f"{spec.where(p.page.offset)}: {what}; the file is corrupt")
