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
codec), each chunk's places as arrays (:class:`ChunkPlaces`).
:func:`page_sections_at` then finds each page's ``(definition levels,
values)`` in the heap from the few bytes it needs (a v1 page's
4-byte level length, at :func:`level_offsets`), read back by the caller:
the device decoder reads every chunk's in one gather, the host tests from
a heap filled with PyArrow's decompression, checked against the NumPy
reference's :func:`.reference.page_sections`. Pure host code; a layout is
built by one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, PageTable, PageType, page_table
from nexus_cache.frames.gpudecode.reference import decompress_section
from nexus_cache.frames.gpudecode.support import CODECS

__all__ = [
    "ChunkPlaces",
    "HeapLayout",
    "Sections",
    "layout_chunk",
    "level_offsets",
    "page_sections_at",
]


_STEP = ALIGNMENT - 1  # a place is rounded up to a multiple of ALIGNMENT
_DATA_PAGE = int(PageType.DATA_PAGE)
_DATA_PAGE_V2 = int(PageType.DATA_PAGE_V2)
_PAYLOAD_OF = itemgetter(2)


class ChunkPlaces(NamedTuple):
    """One chunk's pages in the heap, as arrays (int64, one entry a page, in page
    order): each page's body (a v1 or dictionary page whole, decompressed; a
    v2 page's values) at ``[body, body_end)``, and a v2 page's definition
    levels at ``[levels, levels + levels_size)``; ``table``: the pages'
    headers (:func:`.pages.page_table`)."""

    pages: Sequence[Page]
    table: PageTable
    body: np.ndarray
    body_end: np.ndarray
    levels: np.ndarray
    levels_size: np.ndarray


class Sections(NamedTuple):
    """Every page's ``[levels start, levels end)`` and ``[values start, values
    end)`` in the heap (int64 arrays, in page order)."""

    levels_start: np.ndarray
    levels_end: np.ndarray
    values_start: np.ndarray
    values_end: np.ndarray


def _aligned(n: Any) -> Any:
    """``n`` (an int or an int64 array) rounded up to a multiple of ALIGNMENT."""
    return (n + _STEP) // ALIGNMENT * ALIGNMENT


def _nbytes(data: bytes | memoryview) -> int:
    return len(data) if type(data) is bytes else memoryview(data).nbytes


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
    copied once on the host, not three times (joined, grown, staged). A
    chunk whose every page is one compressed section for nvCOMP (the common
    case) is placed by array arithmetic, without a Python step a page."""

    pieces: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    host_size: int = 0
    size: int = 0
    jobs: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    chunks: list[ChunkPlaces] = field(default_factory=list)
    # (chunk, its pages, algorithm, in offsets, in sizes, out sizes) awaiting
    # output slots, one entry a chunk
    _pending: list[tuple[int, np.ndarray, str, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=list
    )

    def _put(self, data: bytes | memoryview) -> int:
        at = _aligned(self.host_size)
        size = _nbytes(data)
        if size:
            self.pieces.append((at, data))
        self.host_size = at + size
        return at  # type: ignore[no-any-return]

    def _put_all(self, payloads: list[Any], sizes: np.ndarray) -> np.ndarray:
        """:meth:`_put` of every one of ``payloads`` (of ``sizes`` bytes), one after
        another: their places."""
        steps = _aligned(sizes)
        at = _aligned(self.host_size) + np.cumsum(steps) - steps
        if at.size:
            self.host_size = int(at[-1] + sizes[-1])
        if sizes.all():
            self.pieces.extend(zip(at.tolist(), payloads, strict=True))
        else:
            self.pieces.extend(
                (a, p) for a, p, n in zip(at.tolist(), payloads, sizes.tolist(), strict=True) if n
            )
        return at  # type: ignore[no-any-return]

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
        table = page_table(pages)
        n = len(pages)
        body, body_end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        levels, levels_size = np.zeros(n, np.int64), np.zeros(n, np.int64)
        chunk = len(self.chunks)
        if (
            codec is not None
            and algorithm is not None
            and not (table.type == _DATA_PAGE_V2).any()
            and table.uncompressed_size.all()
        ):
            # every page one section for nvCOMP: placed by array arithmetic
            payloads = list(map(_PAYLOAD_OF, pages))
            sizes = np.fromiter(map(_nbytes, payloads), np.int64, n)
            at = self._put_all(payloads, sizes)
            if n:
                self._pending.append(
                    (chunk, np.arange(n), algorithm, at, sizes, table.uncompressed_size)
                )
        else:
            self._add_pages(spec, pages, table, algorithm, (body, body_end, levels, levels_size))
        self.chunks.append(ChunkPlaces(pages, table, body, body_end, levels, levels_size))

    def _add_pages(
        self,
        spec: ChunkSpec,
        pages: Sequence[Page],
        table: PageTable,
        algorithm: str | None,
        places: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """:meth:`add` a page at a time (v2 pages, host decompression),
        writing each page's places into ``places``."""
        codec = CODECS[spec.codec]
        body, body_end, levels, levels_size = places
        pending: list[tuple[int, int, int, int]] = []  # page, in offset, in size, out size
        put = self._put
        for i, page in enumerate(pages):
            h = page.header
            section = page.payload
            size = h.uncompressed_size
            compressed = codec is not None
            if h.type == _DATA_PAGE_V2:
                levels_size[i] = h.def_bytes
                levels[i] = put(section[h.rep_bytes : h.rep_bytes + h.def_bytes])
                section = section[h.rep_bytes + h.def_bytes :]
                size -= h.rep_bytes + h.def_bytes
                compressed = compressed and h.is_compressed
            if compressed and algorithm is not None and size > 0:
                # the page's place in the output region is fixed in finish
                pending.append((i, put(section), len(section), size))
                continue
            try:
                data = decompress_section(section, size, codec if compressed else None)
            except ValueError as exc:
                raise SourceFormatError(
                    f"{spec.where(page.offset)}: {exc}; the file is corrupt"
                ) from exc
            at = put(data)
            body[i], body_end[i] = at, at + len(data)
        if pending and algorithm is not None:
            index, source, in_size, size_ = np.array(pending, np.int64).reshape(-1, 4).T
            self._pending.append((len(self.chunks), index, algorithm, source, in_size, size_))

    def finish(self) -> None:
        """Place the decompressed sections after the host's bytes; fix ``size``."""
        cursor = _aligned(self.host_size)
        chunks, jobs = self.chunks, self.jobs
        for chunk, index, algorithm, source, in_size, size in self._pending:
            steps = _aligned(size)
            out = cursor + np.cumsum(steps) - steps
            cursor += int(steps.sum())
            jobs.setdefault(algorithm, []).extend(
                zip(source.tolist(), in_size.tolist(), out.tolist(), size.tolist(), strict=True)
            )
            places = chunks[chunk]
            places.body[index] = out
            places.body_end[index] = out + size
        self._pending.clear()
        self.size = max(cursor, 1)


def layout_chunk(spec: ChunkSpec, pages: Sequence[Page], algorithm: str | None) -> HeapLayout:
    """The heap layout of one chunk (see :meth:`HeapLayout.add`)."""
    out = HeapLayout()
    out.add(spec, pages, algorithm)
    out.finish()
    return out


def level_offsets(places: ChunkPlaces, spec: ChunkSpec) -> np.ndarray:
    """Where the 4-byte level length of each v1 data page of a chunk is (in
    page order, int64): what :func:`page_sections_at` peeks."""
    if not spec.max_def:
        return np.zeros(0, np.int64)
    return places.body[places.table.type == _DATA_PAGE]


def page_sections_at(places: ChunkPlaces, spec: ChunkSpec, lengths: Any) -> Sections:
    """Every page's levels and values in the heap (:class:`Sections`), as
    :func:`.reference.page_sections` cuts them (empty levels where that gives
    none); ``lengths``: the values read (peeked) at :func:`level_offsets`.
    SourceFormatError names the first page whose levels do not fit."""
    body, body_end, kind = places.body, places.body_end, places.table.type
    levels_start, levels_end = body.copy(), body.copy()
    values_start = body.copy()
    v2 = np.flatnonzero(kind == _DATA_PAGE_V2)
    if v2.size:
        levels_start[v2] = places.levels[v2]
        levels_end[v2] = places.levels[v2] + places.levels_size[v2]
    if spec.max_def:
        v1 = np.flatnonzero(kind == _DATA_PAGE)
        length = np.asarray(lengths, np.int64).reshape(-1)
        if length.size != v1.size:
            raise ValueError(f"{length.size} level lengths for {v1.size} v1 data pages")
        start = body[v1] + 4
        short = body_end[v1] - body[v1] < 4
        bad = np.flatnonzero(short | (start + length > body_end[v1]))
        if bad.size:
            k = int(bad[0])
            page = places.pages[int(v1[k])]
            if short[k]:
                raise _corrupt(spec, page, "a data page ends before its definition levels")
            what = f"definition levels of {int(length[k])} bytes run past the page"
            raise _corrupt(spec, page, what)
        levels_start[v1] = start
        levels_end[v1] = start + length
        values_start[v1] = start + length
    return Sections(levels_start, levels_end, values_start, body_end.copy())


def _corrupt(spec: ChunkSpec, page: Page, what: str) -> SourceFormatError:
    return SourceFormatError(f"{spec.where(page.offset)}: {what}; the file is corrupt")
