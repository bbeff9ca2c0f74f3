"""Where each page of a column chunk lives in the chunk's device *heap*.

The device decoder keeps a whole column chunk in one byte buffer, the heap:
first the *input region*, laid out on the host and copied to the device in
one transfer, then the *output region*, which nvCOMP fills, each of its
slots at a multiple of :data:`.nvcomp.ALIGNMENT`.

The input region is the file's own bytes: given a chunk's bytes, the chunk
is one piece, page headers included, at a heap offset congruent to its
file offset modulo :data:`.nvcomp.ALIGNMENT` (so each section is as
aligned in the heap as in the file, and chunks adjacent in the file lie
adjacent in the heap), and each page's sections are read where they lie:

* a compressed page section (a v1 page, a dictionary page, or the values
  of a v2 page) that nvCOMP decompresses: read in place where its file
  position meets its algorithm's input alignment
  (:func:`.nvcomp.input_alignment`: any byte for Snappy), else copied to
  an aligned place of its own after the image; a slot of its header's
  uncompressed size in the output region, and a *job* ``(in offset, in
  size, out offset, out size)``;
* everything stored uncompressed (a chunk without a codec, a v2 page's
  definition levels, which v2 never compresses, and the values of a v2 page
  written with ``is_compressed`` false): read in place (the kernels read
  the heap byte by byte, so a section may start at any byte).

A chunk is laid out page by page instead (every section copied to a place
of its own, at a multiple of the alignment) where its bytes are not given,
where the sections copied for their alignment would be over a quarter of
it, and with host decompression (nvCOMP missing or lacking the codec: the
page sections are decompressed here, by PyArrow, into the input region).

A :class:`HeapLayout` holds one chunk or several (the device decoder lays
out a batch of row groups' chunks in one heap: one copy, one nvCOMP call
per codec), each chunk's places as arrays (:class:`ChunkPlaces`), found
for all the chunks laid out as images at once.
:func:`page_sections_at` then finds each page's ``(definition levels,
values)`` in the heap from the few bytes it needs (a v1 page's
4-byte level length, at :func:`level_offsets`), read back by the caller:
the device decoder reads every chunk's in one gather, the host tests from
a heap filled with PyArrow's decompression, checked against the NumPy
reference's :func:`.reference.page_sections`. Its bounds checks hold the
same wherever a page lies: a section's end is where its page ends in the
file. Pure host code; a layout is built by one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT, input_alignment
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, PageTable, PageType, page_table
from nexus_cache.frames.gpudecode.reference import decompress_section
from nexus_cache.frames.gpudecode.support import CODECS

__all__ = [
    "ChunkPlaces",
    "HeapLayout",
    "HeapPages",
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


class _Cut(NamedTuple):
    """Where the sections of pages lie in the file (int64 arrays, one entry a
    page): a page's *section* (a v1 or dictionary page's payload, a v2 page's
    values) at ``[section, section + section_size)``, a v2 page's levels just
    before it; ``out_size``: the section's size decompressed (its header's);
    ``stored``: the section is stored uncompressed (a chunk without a codec,
    or a v2 page written with ``is_compressed`` false)."""

    section: np.ndarray
    section_size: np.ndarray
    out_size: np.ndarray
    stored: np.ndarray

    @classmethod
    def of(cls, table: PageTable, last: np.ndarray, end: Any, stored: Any) -> _Cut:
        """The cut of the pages of ``table`` (one or more chunks' pages, one
        after another; ``last``: the index of each chunk's last page, ``end``:
        where each chunk ends in the file; ``stored``: whether each page's
        chunk has no codec). A page ends where the next one's header begins,
        the last of a chunk where the chunk ends (read_pages' pages tile it)."""
        page_end = np.empty_like(table.offset)
        page_end[:-1] = table.offset[1:]
        page_end[last] = end
        lead = table.rep_bytes + table.def_bytes  # 0 but for a v2 page
        return cls(
            page_end - table.compressed_size + lead,
            table.compressed_size - lead,
            table.uncompressed_size - lead,
            stored | (table.is_compressed == 0),
        )

    def jobs(self) -> np.ndarray:
        """The pages whose section nvCOMP decompresses (compressed, not empty
        decompressed), in order."""
        return np.flatnonzero(~self.stored & (self.out_size > 0))


class _Image(NamedTuple):
    """A chunk placed as its file image, its pages' places still to find: its
    index among the layout's chunks, spec, pages and their table, nvCOMP
    algorithm, heap offset, and its pages whose sections were copied to
    aligned places of their own (local indices, places), if any."""

    chunk: int
    spec: ChunkSpec
    pages: Sequence[Page]
    table: PageTable
    algorithm: str | None
    base: int
    copies: tuple[np.ndarray, np.ndarray] | None


def _aligned(n: Any) -> Any:
    """``n`` (an int or an int64 array) rounded up to a multiple of ALIGNMENT."""
    return (n + _STEP) // ALIGNMENT * ALIGNMENT


#: what :attr:`HeapLayout.chunks` holds for a chunk placed as its image until
#: :meth:`HeapLayout.finish` finds its pages' places
_PLACED_LATER = ChunkPlaces((), page_table(()), *(np.zeros(0, np.int64),) * 4)


def _nbytes(data: bytes | memoryview) -> int:
    return len(data) if type(data) is bytes else memoryview(data).nbytes


@dataclass
class HeapLayout:
    """The heap of one or more chunks (row groups' chunks, decoded together):
    ``size`` bytes, of which the first ``host_size`` come from the host, as
    ``pieces`` (heap offset, bytes: views of the file's chunks or pages, or
    what the host decompressed), zeros between them; ``jobs``: nvCOMP algorithm -> its
    ``(in offset, in size, out offset, out size)`` sections (an int64 array, a
    row a section); ``chunks``: each
    chunk's pages in their places, in the order added. Call :meth:`finish`
    after the last :meth:`add`.

    The pieces are not joined on the host: the caller copies each straight
    from the file's bytes into its place in the pinned staging
    (``Transfer.pieces_to_device``: one device copy per slot), so a chunk
    laid out as its image is one host copy, not one a page. The pages of
    such chunks are placed by array operations over all of them at once,
    and a chunk laid out page by page whose every page is one compressed
    section for nvCOMP by array arithmetic too: no Python step a page."""

    pieces: list[tuple[int, bytes | memoryview]] = field(default_factory=list)
    host_size: int = 0
    size: int = 0
    jobs: dict[str, np.ndarray] = field(default_factory=dict)
    chunks: list[ChunkPlaces] = field(default_factory=list)
    # (places, pages of them, algorithm, in offsets, in sizes, out sizes)
    # awaiting output slots: one entry a chunk placed page by page, one an
    # algorithm for the chunks placed as images
    _pending: list[tuple[ChunkPlaces, np.ndarray, str, np.ndarray, np.ndarray, np.ndarray]] = (
        field(default_factory=list)
    )
    # the chunks placed as images whose pages are still to place
    _images: list[_Image] = field(default_factory=list)

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

    def add(
        self,
        spec: ChunkSpec,
        pages: Sequence[Page],
        algorithm: str | None,
        chunk: Any = None,
    ) -> None:
        """Lay out one chunk's ``pages``: its compressed sections left to nvCOMP's
        ``algorithm``, or (None) decompressed here by PyArrow. ``chunk``: the
        chunk's bytes (what ``pages`` were read from, by :func:`.pages.read_pages`):
        given, the chunk is placed as its file image (:meth:`_add_image`) where
        that is sound, else page by page. SourceFormatError for a page that
        fails host decompression or contradicts its header (raised here, or by
        :meth:`finish` for a chunk placed as its image; the first such page of
        the chunks in the order added)."""
        codec = CODECS[spec.codec]
        table = page_table(pages)
        n = len(pages)
        if (
            chunk is not None
            and n
            and (codec is None or algorithm is not None)
            and self._add_image(spec, pages, table, algorithm, chunk)
        ):
            return
        body, body_end = np.zeros(n, np.int64), np.zeros(n, np.int64)
        levels, levels_size = np.zeros(n, np.int64), np.zeros(n, np.int64)
        places = ChunkPlaces(pages, table, body, body_end, levels, levels_size)
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
                    (places, np.arange(n), algorithm, at, sizes, table.uncompressed_size)
                )
        else:
            try:
                self._add_pages(spec, pages, table, algorithm, places)
            except SourceFormatError:
                self._place_images()  # a page of a chunk added before refused first
                raise
        self.chunks.append(places)

    def _add_image(
        self,
        spec: ChunkSpec,
        pages: Sequence[Page],
        table: PageTable,
        algorithm: str | None,
        chunk: Any,
    ) -> bool:
        """:meth:`add` of a chunk as its file image: its bytes (page headers
        included) one piece, at a heap offset congruent to its file offset
        modulo :data:`ALIGNMENT` (so a section is as aligned in the heap as in
        the file, and chunks adjacent in the file lie adjacent here), each
        page's sections read where they lie. Only a compressed section that
        breaks its algorithm's input alignment (:func:`.nvcomp.input_alignment`:
        never a Snappy one) is copied, to a place of its own after the image.
        The pages' places are found in :meth:`finish`, for every image at once
        by array operations. False (nothing placed) where the image is not
        worth it: the misaligned sections, copied anyway, would be over a
        quarter of the chunk."""
        data = memoryview(chunk).cast("B")
        start, size = spec.start, spec.size
        if len(data) != size or int(table.offset[0]) != start:
            raise ValueError(f"{spec.where(start)}: the pages were not read from these bytes")
        base = self.host_size + (start - self.host_size) % ALIGNMENT
        copies: tuple[np.ndarray, np.ndarray] | None = None
        if algorithm is not None and input_alignment(algorithm) > 1:
            end = np.array([start + size])
            cut = _Cut.of(table, np.array([len(pages) - 1]), end, CODECS[spec.codec] is None)
            jobs = cut.jobs()
            misplaced = jobs[(cut.section[jobs] - start + base) % input_alignment(algorithm) != 0]
            sizes = cut.section_size[misplaced]
            if 4 * int(sizes.sum()) > size:
                return False
            first = (cut.section[misplaced] - start).tolist()
            pieces = [data[a : a + k] for a, k in zip(first, sizes.tolist(), strict=True)]
            self.pieces.append((base, data))
            self.host_size = base + size
            copies = (misplaced, self._put_all(pieces, sizes))
        else:
            self.pieces.append((base, data))
            self.host_size = base + size
        self._images.append(_Image(len(self.chunks), spec, pages, table, algorithm, base, copies))
        self.chunks.append(_PLACED_LATER)
        return True

    def _place_images(self) -> None:
        """The places of the pages of every chunk :meth:`_add_image` placed since
        the last call, found by array operations over all of them at once: each
        section where it lies in its chunk's image (or copied), each compressed
        one's job pending its output slot. SourceFormatError for the first
        page stored uncompressed whose size is not its header's."""
        images = self._images
        if not images:
            return
        tables = [image.table for image in images]
        counts = np.fromiter((len(image.pages) for image in images), np.int64, len(images))
        table = PageTable(*(np.concatenate(f) for f in zip(*tables, strict=True)))
        last = np.cumsum(counts) - 1
        starts = np.fromiter((image.spec.start for image in images), np.int64, len(images))
        sizes = np.fromiter((image.spec.size for image in images), np.int64, len(images))
        stored = np.repeat(
            np.fromiter((CODECS[i.spec.codec] is None for i in images), bool, len(images)),
            counts,
        )
        cut = _Cut.of(table, last, starts + sizes, stored)
        bad = np.flatnonzero(cut.stored & (cut.section_size != cut.out_size))
        if bad.size:
            k = int(bad[0])
            image = images[int(np.searchsorted(last, k))]
            raise SourceFormatError(
                f"{image.spec.where(int(table.offset[k]))}: an uncompressed page holds "
                f"{int(cut.section_size[k])} bytes, its header says {int(cut.out_size[k])}; "
                "the file is corrupt"
            )
        bases = np.fromiter((image.base for image in images), np.int64, len(images))
        shift = np.repeat(bases - starts, counts)
        body = cut.section + shift
        body_end = body + np.where(cut.stored, cut.section_size, 0)
        v2 = table.type == _DATA_PAGE_V2
        levels = np.where(v2, cut.section - table.def_bytes + shift, 0)
        levels_size = np.where(v2, table.def_bytes, 0)
        jobs = cut.jobs()
        source = body.copy()
        first = last - counts + 1
        algorithms: dict[str, list[np.ndarray]] = {}
        for k, image in enumerate(images):
            if image.copies is not None:
                local, at = image.copies
                source[first[k] + local] = at
            if image.algorithm is not None:
                algorithms.setdefault(image.algorithm, []).append(np.arange(first[k], last[k] + 1))
            a, b = int(first[k]), int(last[k]) + 1
            self.chunks[image.chunk] = ChunkPlaces(
                image.pages,
                image.table,
                body[a:b],
                body_end[a:b],
                levels[a:b],
                levels_size[a:b],
            )
        places = ChunkPlaces((), table, body, body_end, levels, levels_size)
        for algorithm, members in algorithms.items():
            mine = np.concatenate(members)
            index = mine[np.isin(mine, jobs, assume_unique=True)]
            if index.size:
                self._pending.append(
                    (
                        places,
                        index,
                        algorithm,
                        source[index],
                        cut.section_size[index],
                        cut.out_size[index],
                    )
                )
        images.clear()

    def _add_pages(
        self,
        spec: ChunkSpec,
        pages: Sequence[Page],
        table: PageTable,
        algorithm: str | None,
        places: ChunkPlaces,
    ) -> None:
        """:meth:`add` a page at a time (v2 pages, host decompression),
        writing each page's places into ``places``."""
        codec = CODECS[spec.codec]
        body, body_end, levels, levels_size = places[2:]
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
            self._pending.append((places, index, algorithm, source, in_size, size_))

    def finish(self) -> None:
        """Place the pages of the chunks placed as images (:meth:`_place_images`),
        then the decompressed sections after the host's bytes; fix ``size``."""
        self._place_images()
        cursor = _aligned(self.host_size)
        jobs: dict[str, list[np.ndarray]] = {}
        for places, index, algorithm, source, in_size, size in self._pending:
            steps = _aligned(size)
            out = cursor + np.cumsum(steps) - steps
            cursor += int(steps.sum())
            jobs.setdefault(algorithm, []).append(np.stack([source, in_size, out, size], axis=1))
            places.body[index] = out
            places.body_end[index] = out + size
        self._pending.clear()
        for algorithm, parts in jobs.items():
            self.jobs[algorithm] = np.concatenate(parts)
        self.size = max(cursor, 1)


def layout_chunk(
    spec: ChunkSpec, pages: Sequence[Page], algorithm: str | None, chunk: Any = None
) -> HeapLayout:
    """The heap layout of one chunk (see :meth:`HeapLayout.add`)."""
    out = HeapLayout()
    out.add(spec, pages, algorithm, chunk)
    out.finish()
    return out


def level_offsets(places: ChunkPlaces, spec: ChunkSpec) -> np.ndarray:
    """Where the 4-byte level length of each v1 data page of a chunk is (in
    page order, int64): what :func:`page_sections_at` peeks."""
    return HeapPages.of([places], [spec]).level_offsets()


def page_sections_at(places: ChunkPlaces, spec: ChunkSpec, lengths: Any) -> Sections:
    """Every page's levels and values in the heap (:class:`Sections`), as
    :func:`.reference.page_sections` cuts them (empty levels where that gives
    none); ``lengths``: the values read (peeked) at :func:`level_offsets`.
    SourceFormatError names the first page whose levels do not fit."""
    return HeapPages.of([places], [spec]).sections(lengths)


class HeapPages(NamedTuple):
    """The pages of several chunks of a heap (``chunks``, of ``specs``), one
    after another: their places joined (``places``: one array a field, the
    pages' objects left out), which pages have definition levels
    (``has_def``: their chunk's ``max_def``), and where each chunk's pages
    begin among them (``first``, one more entry: where they end). What
    :func:`level_offsets` and :func:`page_sections_at` do for one chunk,
    for all of them at once, by array operations."""

    chunks: Sequence[ChunkPlaces]
    specs: Sequence[ChunkSpec]
    places: ChunkPlaces
    has_def: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, chunks: Sequence[ChunkPlaces], specs: Sequence[ChunkSpec]) -> HeapPages:
        """The pages of ``chunks`` (of ``specs``), one after another."""
        counts = np.fromiter((len(c.pages) for c in chunks), np.int64, len(chunks))
        first = np.zeros(len(chunks) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        if len(chunks) == 1:
            places = chunks[0]
        else:
            table = PageTable(
                *(_join(list(f)) for f in zip(*(c.table for c in chunks), strict=True))
            )
            places = ChunkPlaces(
                (),
                table,
                _join([c.body for c in chunks]),
                _join([c.body_end for c in chunks]),
                _join([c.levels for c in chunks]),
                _join([c.levels_size for c in chunks]),
            )
        flags = np.fromiter((bool(s.max_def) for s in specs), bool, len(specs))
        return cls(chunks, specs, places, np.repeat(flags, counts), first)

    def level_offsets(self) -> np.ndarray:
        """:func:`level_offsets` of every chunk, one after another."""
        places = self.places
        return places.body[(places.table.type == _DATA_PAGE) & self.has_def]

    def sections(self, lengths: Any) -> Sections:
        """:func:`page_sections_at` of every chunk, one after another (``lengths``:
        read at :meth:`level_offsets`). SourceFormatError names the first page
        whose levels do not fit."""
        places = self.places
        body, body_end, kind = places.body, places.body_end, places.table.type
        levels_start, levels_end = body.copy(), body.copy()
        values_start = body.copy()
        v2 = np.flatnonzero(kind == _DATA_PAGE_V2)
        if v2.size:
            levels_start[v2] = places.levels[v2]
            levels_end[v2] = places.levels[v2] + places.levels_size[v2]
        v1 = np.flatnonzero((kind == _DATA_PAGE) & self.has_def)
        length = np.asarray(lengths, np.int64).reshape(-1)
        if length.size != v1.size:
            raise ValueError(f"{length.size} level lengths for {v1.size} v1 data pages")
        if v1.size:
            start = body[v1] + 4
            short = body_end[v1] - body[v1] < 4
            bad = np.flatnonzero(short | (start + length > body_end[v1]))
            if bad.size:
                k = int(bad[0])
                if short[k]:
                    what = "a data page ends before its definition levels"
                else:
                    what = f"definition levels of {int(length[k])} bytes run past the page"
                raise self._corrupt(int(v1[k]), what)
            levels_start[v1] = start
            levels_end[v1] = start + length
            values_start[v1] = start + length
        return Sections(levels_start, levels_end, values_start, body_end.copy())

    def _corrupt(self, i: int, what: str) -> SourceFormatError:
        """The error naming page ``i`` (of all the chunks' pages) and ``what``."""
        c = int(np.searchsorted(self.first, i, "right")) - 1
        return _corrupt(self.specs[c], self.chunks[c].pages[i - int(self.first[c])], what)


def _join(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _corrupt(spec: ChunkSpec, page: Page, what: str) -> SourceFormatError:
    return SourceFormatError(f"{spec.where(page.offset)}: {what}; the file is corrupt")
