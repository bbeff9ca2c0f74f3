"""The heap's input region as the file's own bytes: each column chunk one
piece, its pages' sections read where they lie, a compressed section copied
only where its place breaks its nvCOMP algorithm's input alignment. Against
the packed layout (every section at a place of its own) and the NumPy
reference's cut of each page, for every page shape the writer makes, at
every file position modulo the alignment; and the refusals of the packed
layout, the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from tests.frames.gpudecode._check import file_chunks
from tests.frames.gpudecode.test_device_plan import _mixed_table
from tests.frames.gpudecode.test_reference import CODECS, WRITE_OPTIONS, tables, write

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import ChunkSpec, Page, read_pages
from nexus_cache.frames.gpudecode.layout import (
    HeapLayout,
    layout_chunk,
    level_offsets,
    page_sections_at,
)
from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT, CODEC_ALGORITHMS, input_alignment
from nexus_cache.frames.gpudecode.reference import page_sections
from nexus_cache.frames.gpudecode.support import CODECS as PYARROW_CODECS

Item = tuple[bytes, ChunkSpec, list[Page]]


def _items(raw: bytes, shift: int = 0) -> list[Item]:
    """Every chunk of every row group of ``raw`` (bytes, spec, pages), each as if
    it lay ``shift`` bytes further into the file."""
    return file_chunks(raw, shift)


def _layout(items: list[Item], image: bool, device: bool = True) -> HeapLayout:
    layout = HeapLayout()
    for chunk, spec, pages in items:
        algorithm = CODEC_ALGORITHMS.get(spec.codec) if device else None
        layout.add(spec, pages, algorithm, chunk if image else None)
    layout.finish()
    return layout


def _heap(layout: HeapLayout) -> bytes:
    """The heap once filled: the host's pieces, then every job decompressed
    (by PyArrow), each input checked at its algorithm's alignment."""
    heap = bytearray(layout.size)
    heap[: layout.host_size] = layout.host_image().tobytes()
    codec = {a: c for c, a in CODEC_ALGORITHMS.items() if c != "LZ4"}
    for algorithm, jobs in layout.jobs.items():
        for source, size, out, want in jobs:
            assert source % input_alignment(algorithm) == 0
            assert out % ALIGNMENT == 0
            data = bytes(heap[source : source + size])
            got = pa.decompress(data, want, codec=PYARROW_CODECS[codec[algorithm]], asbytes=True)
            heap[out : out + want] = got
    return bytes(heap)


def _sections(layout: HeapLayout, items: list[Item]) -> list[list[tuple[bytes, bytes]]]:
    """Every page's (levels, values) bytes as found in the filled heap."""
    heap = _heap(layout)
    out = []
    for (_, spec, _), placed in zip(items, layout.chunks, strict=True):
        offsets = level_offsets(placed, spec).tolist()
        lengths = [int.from_bytes(heap[o : o + 4], "little") for o in offsets]
        cut = page_sections_at(placed, spec, lengths)
        out.append(
            [(heap[a:b], heap[c:d]) for a, b, c, d in zip(*(f.tolist() for f in cut), strict=True)]
        )
    return out


def _check(items: list[Item]) -> HeapLayout:
    """The image layout finds every page's sections as the packed one does and as
    the reference cuts them; returns it."""
    image, packed = _layout(items, image=True), _layout(items, image=False)
    got = _sections(image, items)
    assert got == _sections(packed, items)
    for (_, spec, pages), sections in zip(items, got, strict=True):
        assert sections == [page_sections(page, spec) for page in pages]
    return image


def _image_pieces(layout: HeapLayout, items: list[Item]) -> list[tuple[int, Any]]:
    """The pieces that are whole chunks."""
    chunks = {chunk for chunk, _, _ in items}
    return [(at, p) for at, p in layout.pieces if bytes(p) in chunks]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_every_page_lies_where_the_file_has_it(codec: str, version: str) -> None:
    # every column of three row groups in one heap: v1 and v2 pages,
    # dictionary pages, a writer falling back from the dictionary, nulls
    raw = write(
        _mixed_table(1200),
        compression=codec,
        data_page_version=version,
        data_page_size=512,
        row_group_size=400,
    )
    items = _items(raw)
    layout = _check(items)
    if codec in ("none", "snappy"):
        # nothing to align: one piece a chunk, the chunk's own bytes, at a
        # place congruent to its file offset; chunks adjacent in the file
        # adjacent in the heap
        assert [bytes(p) for _, p in layout.pieces] == [chunk for chunk, _, _ in items]
        bases = [at for at, _ in layout.pieces]
        for (_, spec, _), at in zip(items, bases, strict=True):
            assert (at - spec.start) % ALIGNMENT == 0
        for k in range(1, len(items)):
            if items[k][1].start == items[k - 1][1].start + items[k - 1][1].size:
                assert bases[k] == bases[k - 1] + items[k - 1][1].size
        # nvCOMP reads each compressed page where it lies
        for jobs in layout.jobs.values():
            for source, _, _, _ in jobs:
                k = max(i for i, at in enumerate(bases) if at <= source)
                assert source - bases[k] + items[k][1].start in _sections_in_file(items[k])


def _sections_in_file(item: Item) -> list[int]:
    """Where each page's section (a v1 or dictionary page's payload, a v2
    page's values) starts in the file: its payload ends where the next page
    begins (the last: where the chunk ends)."""
    _, spec, pages = item
    ends = [p.offset for p in pages[1:]] + [spec.start + spec.size]
    out = []
    for page, end in zip(pages, ends, strict=True):
        h = page.header
        lead = h.rep_bytes + h.def_bytes if h.type == 3 else 0
        out.append(end - len(page.payload) + lead)
    return out


@pytest.mark.parametrize("codec", ["lz4", "zstd", "gzip", "snappy", "none"])
@pytest.mark.parametrize("shift", range(ALIGNMENT))
def test_any_file_position_gives_the_same_pages(codec: str, shift: int) -> None:
    # chunks moved through every position modulo the alignment: a section
    # whose place breaks its algorithm's input alignment is copied (or the
    # chunk packed), the others read in place; the same pages either way
    raw = write(_mixed_table(600), compression=codec, data_page_size=1024, row_group_size=300)
    items = _items(raw, shift)
    layout = _check(items)
    images = _image_pieces(layout, items)
    if codec in ("none", "snappy"):
        assert len(images) == len(layout.pieces) == len(items)
    else:
        for _, spec, _ in items:
            align = input_alignment(CODEC_ALGORITHMS[spec.codec])
            assert ALIGNMENT % align == 0
        # the copies and packed pages: the sections the image could not serve
        assert len(layout.pieces) >= len(images)


def test_a_chunk_mostly_misaligned_for_its_codec_is_packed() -> None:
    raw = write(
        pa.table({"x": np.arange(20_000, dtype=np.int64)}),
        compression="zstd",
        data_page_size=256,
        use_dictionary=False,
    )
    ((chunk, spec, pages),) = _items(raw)
    starts = {at % 8 for at in _sections_in_file((chunk, spec, pages))}
    assert len(starts) > 1  # pages at several positions modulo Zstd's 8
    layout = layout_chunk(spec, pages, "Zstd", chunk)
    assert not _image_pieces(layout, [(chunk, spec, pages)])  # packed: a piece a page
    assert len(layout.pieces) == len(pages)
    _check([(chunk, spec, pages)])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(table=tables(), options=WRITE_OPTIONS)
def test_generated_tables_lie_where_the_file_has_them(
    table: pa.Table, options: dict[str, Any]
) -> None:
    _check(_items(write(table, **options)))


def _uncompressed_items() -> list[Item]:
    raw = write(_mixed_table(300), compression="none", data_page_size=512)
    return _items(raw)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_stored_page_of_another_size_than_its_header_is_refused_alike(version: str) -> None:
    raw = write(
        _mixed_table(300), compression="none", data_page_size=512, data_page_version=version
    )
    chunk, spec, read = _items(raw)[1]
    pages = list(read)  # one page's header forged
    k = len(pages) // 2
    h = pages[k].header
    pages[k] = pages[k]._replace(header=h._replace(uncompressed_size=h.uncompressed_size + 1))
    errors = []
    for image in (chunk, None):
        with pytest.raises(SourceFormatError) as refused:
            layout_chunk(spec, pages, None, image)
        errors.append(str(refused.value))
    assert errors[0] == errors[1]
    assert f"byte {pages[k].offset}: an uncompressed page holds" in errors[0]


def test_the_first_refused_chunk_is_named_however_the_chunks_are_placed() -> None:
    # an uncompressed chunk placed as its image (its pages placed at the end)
    # with a page of the wrong size, then a Snappy chunk decompressed on the
    # host that fails: the first chunk's page is the one named, as when every
    # chunk is placed page by page
    chunk, spec, read = _uncompressed_items()[0]
    pages = list(read)  # its last page's header forged
    h = pages[-1].header
    pages[-1] = pages[-1]._replace(header=h._replace(uncompressed_size=h.uncompressed_size + 1))
    raw = write(_mixed_table(300), compression="snappy", data_page_version="1.0")
    bad, bad_spec, good_pages = _items(raw)[2]
    corrupt = bytearray(bad)
    at = len(bad) - len(good_pages[-1].payload)
    corrupt[at : at + 4] = b"\xff\xff\xff\x0f"  # the Snappy preamble: a wrong length
    bad_pages = read_pages(bytes(corrupt), bad_spec)
    with pytest.raises(SourceFormatError, match="snappy"):  # alone, it is refused
        layout_chunk(bad_spec, read_pages(bytes(corrupt), bad_spec), None, bytes(corrupt))
    for image in (chunk, None):
        layout = HeapLayout()
        refused = pytest.raises(
            SourceFormatError, match=f"byte {pages[-1].offset}: an uncompressed"
        )
        with refused:  # from add, or from finish
            layout.add(spec, pages, None, image)
            layout.add(bad_spec, bad_pages, None, bytes(corrupt))
            layout.finish()


def test_pages_not_read_from_the_bytes_given_are_refused() -> None:
    chunk, spec, pages = _uncompressed_items()[0]
    with pytest.raises(ValueError, match="not read from these bytes"):
        layout_chunk(spec, pages, None, chunk + b"x")


def test_a_misaligned_section_is_copied_and_the_rest_read_in_place() -> None:
    # LZ4 inputs at 4 bytes: over the positions modulo the alignment, the
    # pages of an imaged chunk are read in place where aligned and copied to
    # an aligned place of their own where not
    raw = write(_mixed_table(600), compression="lz4", data_page_size=1024, row_group_size=300)
    in_place = copied = 0
    for shift in range(ALIGNMENT):
        items = _items(raw, shift)
        layout = _check(items)
        images = {bytes(p): at for at, p in _image_pieces(layout, items)}
        for chunk, spec, pages in items:
            if chunk not in images:
                continue
            base = images[chunk]
            sections = _sections_in_file((chunk, spec, pages))
            for source, size, _, _ in layout.jobs["LZ4"]:
                if base <= source < base + spec.size:  # in place: where the file has it
                    assert source - base + spec.start in sections
                    assert (source - base + spec.start) % 4 == 0
                    in_place += 1
                elif any(
                    (at - spec.start) % 4
                    and bytes(chunk[at - spec.start : at - spec.start + size])
                    == bytes(_heap(layout)[source : source + size])
                    for at in sections
                ):
                    copied += 1
    assert in_place
    assert copied


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_the_sections_of_a_heap_are_every_chunk_s_one_after_another(version: str) -> None:
    from nexus_cache.frames.gpudecode.layout import HeapPages

    raw = write(
        _mixed_table(900), data_page_version=version, data_page_size=512, row_group_size=300
    )
    items = _items(raw)
    layout = _layout(items, image=True)
    heap, specs = _heap(layout), [spec for _, spec, _ in items]
    pages = HeapPages.of(layout.chunks, specs)
    offsets = pages.level_offsets().tolist()
    lengths = [int.from_bytes(heap[o : o + 4], "little") for o in offsets]
    got = pages.sections(lengths)
    one_by_one = []
    for (_, spec, _), placed in zip(items, layout.chunks, strict=True):
        own = [int.from_bytes(heap[o : o + 4], "little") for o in level_offsets(placed, spec)]
        one_by_one.append(page_sections_at(placed, spec, own))
    for field in range(4):
        assert got[field].tolist() == np.concatenate([s[field] for s in one_by_one]).tolist()
    if version == "1.0":
        # a level length past its page in a later chunk: that chunk's page is named
        k = len(lengths) - 1
        lengths[k] = 1 << 30
        i = int(np.flatnonzero(pages.places.body == offsets[k])[0])
        c = int(np.searchsorted(pages.first, i, "right")) - 1
        assert c > 0
        page = items[c][2][i - int(pages.first[c])]
        with pytest.raises(
            SourceFormatError, match=f"row group {specs[c].row_group}, byte {page.offset}"
        ):
            pages.sections(lengths)
